"""An exponential moving average of the weights (train.ema): updated after every optimizer step, evaluated after
every epoch beside the trained weights, chosen when it scores better on the early-stopping monitor, saved in the
checkpoints and resumed exactly.

The average is torch.optim.swa_utils' EMA rule (get_ema_multi_avg_fn: ema ← decay · ema + (1 − decay) · w, one
foreach lerp over all floating parameters and buffers, so batch-norm statistics are averaged too; integer buffers
are copied). AveragedModel itself is not used: its update reads its step counter on the host, a device sync every
step; here the count is a Python int.
"""

from __future__ import annotations

import copy
import math
from collections.abc import Callable
from typing import Any

import torch
from torch import nn
from torch.optim.swa_utils import get_ema_multi_avg_fn

from core import catalog
from core.insight import Mistakes
from core.spec_sections import EmaSpec


def ema_key(key: str) -> str:
    """The key an EMA figure is stored under: val/acc → val/acc_ema."""
    return f"{key}_ema"


class WeightEma:
    """The averaged copy of a model (on the model's device, in eval mode, never trained)."""

    def __init__(self, model: nn.Module, spec: EmaSpec) -> None:
        self.spec = spec
        self.module = copy.deepcopy(model).eval().requires_grad_(False)
        self.updates = 0
        self.chosen = False  # whether the EMA scored better than the trained weights at the last evaluation

    def _pairs(self, model: nn.Module) -> tuple[list[torch.Tensor], ...]:
        ema = [*self.module.parameters(), *self.module.buffers()]
        own = [t.detach() for t in (*model.parameters(), *model.buffers())]
        floats = [i for i, t in enumerate(ema) if t.is_floating_point()]
        others = [i for i, t in enumerate(ema) if not t.is_floating_point()]
        return [ema[i] for i in floats], [own[i] for i in floats], [ema[i] for i in others], [own[i] for i in others]

    def decay(self) -> float:
        """The decay of the next update: train.ema.decay, or less in the first steps with warmup."""
        n = self.updates
        return min(self.spec.decay, (1 + n) / (10 + n)) if self.spec.warmup else self.spec.decay

    @torch.no_grad()
    def update(self, model: nn.Module) -> None:
        ema_f, own_f, ema_o, own_o = self._pairs(model)
        if self.updates == 0:  # the first update starts the average at the weights
            torch._foreach_copy_(ema_f, own_f)
        elif ema_f:
            get_ema_multi_avg_fn(self.decay())(ema_f, own_f, None)
        if ema_o:
            torch._foreach_copy_(ema_o, own_o)
        self.updates += 1

    def state_dict(self) -> dict[str, Any]:
        return {"weights": self.module.state_dict(), "updates": self.updates, "chosen": self.chosen}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.module.load_state_dict(state["weights"])
        self.updates, self.chosen = int(state["updates"]), bool(state["chosen"])


def build_ema(spec: EmaSpec, model: nn.Module) -> WeightEma | None:
    return WeightEma(model, spec) if spec.enabled else None


def choose(monitor: str, trained: float, ema: float | None) -> bool:
    """Whether the EMA's value of the monitored metric beats the trained weights' (ties keep the trained)."""
    if ema is None or not math.isfinite(ema):
        return False
    if not math.isfinite(trained):
        return True
    return ema < trained if catalog.better(monitor) == "min" else ema > trained


def export_weights(ck: dict[str, Any]) -> dict[str, torch.Tensor]:
    """The weights a checkpoint exports: its EMA's when the EMA was chosen at its epoch, else the model's."""
    ema = ck.get("ema")
    return ema["weights"] if isinstance(ema, dict) and ema.get("chosen") else ck["model"]


def evaluate_ema(t: Any, evaluate: Callable) -> tuple[dict[str, float], tuple[Mistakes, torch.Tensor] | None]:
    """The EMA weights' validation figures under their own keys (val/acc_ema, ...), with their mistakes and
    confusion matrix: core.evaluation's `evaluate` on a view of the trainer whose model is the EMA ({}, None
    without one)."""
    if t.ema is None:
        return {}, None
    view = copy.copy(t)  # shallow: the same batches, device and ranks; only the model differs
    view.model = view.forward = t.ema.module
    mistakes = Mistakes(t.device)
    figures, cm = evaluate(view, mistakes)
    return {ema_key(k): v for k, v in figures.items()}, (mistakes, cm)


Evaluated = tuple[Mistakes, torch.Tensor]


def pick(t: Any, value: float, ema_m: dict[str, float], trained: Evaluated, ema: Evaluated | None):
    """The monitored value this epoch counts for (early stopping, the best checkpoint) and the mistakes and
    confusion matrix that go with it: the EMA's when it beats the trained weights' (remembered in t.ema.chosen),
    else the trained ones'. A train/ monitor has no EMA figure: the trained weights count."""
    if t.ema is None or ema is None:
        return value, trained
    monitor = t.spec.train.early_stopping.monitor
    ema_value = ema_m.get(ema_key(catalog.stored_key(monitor)))
    t.ema.chosen = choose(monitor, value, ema_value)
    return (ema_value, ema) if t.ema.chosen else (value, trained)
