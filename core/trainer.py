"""The Trainer: everything the loop (core/engine.py) and the end of each epoch (core/evaluation.py) work on, built
once per run by core/recipe.py, and the two small rules both sides follow: how many optimizer steps an epoch has,
and which batches still need preprocessing."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

from core.batches import DeviceBatches
from core.checkpoint import EarlyStopping
from core.config import RunSpec
from core.data import DataBundle, Preprocess
from core.diagnosis import Diagnoser
from core.distributed import SOLO, Ranks
from core.ema import WeightEma, build_ema
from core.events import Control, Sink
from core.models import Classifier, wants_channels_last
from core.names import grad_norm_key
from core.optim import AmpStep, Schedule
from core.spec_sections import TrainSpec


@dataclass
class Trainer:
    """Everything the loop needs, built once by core.recipe."""

    spec: RunSpec
    model: Classifier
    forward: nn.Module  # the model, or its torch.compile'd version
    optimizer: torch.optim.Optimizer
    schedule: Schedule
    amp: AmpStep
    data: DataBundle
    train_batches: Any
    val_batches: Any
    device: torch.device
    sink: Sink
    control: Control
    diagnoser: Diagnoser
    early: EarlyStopping
    out_dir: Any
    global_step: int = 0
    epoch: int = 0  # last completed epoch
    ref_loss: float | None = None  # the first logged loss, the yardstick for divergence
    history: list[dict[str, float]] = field(default_factory=list)
    ranks: Ranks = SOLO  # this process's place in a run on several processes (core.distributed)
    ema: WeightEma | None = None  # the moving average of the weights (train.ema), built with the trainer

    def __post_init__(self) -> None:
        aug = self.spec.data.augment
        cl = wants_channels_last(self.spec.channels_last, self.device, self.model)
        self.pre_train = Preprocess(self.data.info, aug if aug.active else None, self.device, channels_last=cl)
        self.pre_val = Preprocess(self.data.info, None, self.device, channels_last=cl)
        self.ema = build_ema(self.spec.train.ema, self.model)
        self.groups = self.model.param_groups_by_stage()
        # with no augmentation, a device-resident split is normalised once, not every step.
        budget = self.spec.loader.device_cache_mb * 2**20
        for batches, pre in ((self.train_batches, self.pre_train), (self.val_batches, self.pre_val)):
            if isinstance(batches, DeviceBatches) and pre.augment is None and pre.output_numel(batches.x) * 4 <= budget:
                batches.x = torch.cat([pre(chunk) for chunk in batches.x.split(4096)])

    @property
    def steps_per_epoch(self) -> int:
        return steps_per_epoch(len(self.train_batches), self.spec.train)

    # --- per-layer diagnostics (every diag_every steps) ---------------------------------------
    def group_grad_norms(self) -> dict[str, torch.Tensor]:
        out = {}
        for name, ps in self.groups.items():
            grads = [p.grad for p in ps if p.grad is not None]
            if grads:
                out[grad_norm_key(name)] = torch.nn.utils.get_total_norm(grads)
        return out


def steps_per_epoch(micro_batches: int, train: TrainSpec) -> int:
    """Optimizer steps in one epoch of `micro_batches` (train.steps_per_epoch caps it; accumulation divides it)."""
    n = min(micro_batches, train.steps_per_epoch) if train.steps_per_epoch else micro_batches
    return max(1, math.ceil(n / train.accumulate))


def prepare(pre: Preprocess, x: torch.Tensor, gen: torch.Generator | None = None) -> torch.Tensor:
    """uint8 batches are preprocessed now; float batches were normalised once up front."""
    return x if x.is_floating_point() else pre(x, gen)
