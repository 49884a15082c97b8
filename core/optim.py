"""Optimizer, learning-rate schedule, transfer-learning freezing, and the AMP step.

The optimizer step order is the one thing every hand-written loop gets wrong at
least once (torchvision's reference script did): scale → backward → unscale →
clip → step → update → zero_grad. `AmpStep.step` is the only place it happens.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch
from torch import nn

from core.models import Classifier
from core.spec_sections import ModelSpec, OptimSpec, ScheduleSpec, TrainSpec

_NO_DECAY_TYPES = (nn.BatchNorm1d, nn.BatchNorm2d, nn.GroupNorm, nn.LayerNorm, nn.InstanceNorm2d)


# --- transfer learning -------------------------------------------------------


def _extra_stages(spec: ModelSpec, epoch: int) -> int:
    """Backbone stages unfrozen by progressive unfreezing by `epoch` (beyond those trained from the start)."""
    if spec.unfreeze_every:
        start = spec.unfreeze_at_epoch or 1 + spec.unfreeze_every
        return 0 if epoch < start else 1 + (epoch - start) // spec.unfreeze_every
    return 10**6 if spec.unfreeze_at_epoch and epoch >= spec.unfreeze_at_epoch else 0


def trained_stages(model: Classifier, spec: ModelSpec, epoch: int) -> list[str]:
    """The stages (bottom→top, "head" last) trained in `epoch` (1-based); changes nothing."""
    names = [n for n, _ in model.stages()]
    backbone = names[:-1]
    if spec.transfer in ("scratch", "finetune"):
        return names
    if spec.transfer == "finetune_last_n" and spec.last_n > len(backbone):
        raise ValueError(
            f"model.last_n={spec.last_n}, but {model.arch} has {len(backbone)} backbone stages "
            f"({', '.join(backbone)}): use at most {len(backbone)}, or model.transfer=finetune"
        )
    first = spec.last_n if spec.transfer == "finetune_last_n" else 0
    n = min(len(backbone), first + _extra_stages(spec, epoch))
    return [*backbone[len(backbone) - n :], names[-1]]


def apply_transfer(model: Classifier, spec: ModelSpec, epoch: int) -> list[str]:
    """Set requires_grad for `epoch` (1-based). Returns the names of the trained stages."""
    stages = model.stages()
    trained = set(trained_stages(model, spec, epoch))
    everything = len(trained) == len(stages)  # parameters outside the named stages follow the whole backbone
    for p in model.parameters():
        p.requires_grad_(everything)
    for name, mods in stages:
        for m in mods:
            for p in m.parameters():
                p.requires_grad_(name in trained)
    return [n for n, _ in stages if n in trained]


def set_train_mode(model: Classifier) -> None:
    """model.train(), but frozen parts stay in eval mode: frozen stages (and any norm layer whose parameters
    are all frozen) keep their BatchNorm running statistics and run dropout as at inference."""
    model.train()
    for _, mods in model.stages():
        for m in mods:
            if not any(p.requires_grad for p in m.parameters()):
                m.eval()
    for m in model.modules():
        own = list(m.parameters(recurse=False))
        if isinstance(m, nn.modules.batchnorm._BatchNorm) and own and not any(p.requires_grad for p in own):
            m.eval()


# --- optimizer ---------------------------------------------------------------------------------


def _split_decay(modules: list[nn.Module], params: list[nn.Parameter]) -> tuple[list, list]:
    no_decay: set[int] = set()
    for mod in modules:
        for m in mod.modules():
            for name, p in m.named_parameters(recurse=False):
                if isinstance(m, _NO_DECAY_TYPES) or name.endswith("bias") or p.ndim <= 1:
                    no_decay.add(id(p))
    return [p for p in params if id(p) not in no_decay], [p for p in params if id(p) in no_decay]


def head_is_fresh(model: Classifier, mspec: ModelSpec) -> bool:
    """A transfer run whose head starts from random init (torchvision weights always get a new head)."""
    report = getattr(model, "head_report", None)
    if mspec.weights_file:
        return report is None or report.get("head") == "fresh"
    return mspec.pretrained


def _lr_plan(model: Classifier, optim: OptimSpec, mspec: ModelSpec) -> list[tuple[str, list[nn.Parameter], float]]:
    """(group, parameters, lr), the head last: the backbone at optim.lr × backbone_lr_mult when transferring,
    and with lr_decay < 1 one group per stage, each further from the head × lr_decay once more."""
    head_ids = {id(p) for p in model.head_parameters()}
    transferring = mspec.pretrained or bool(mspec.weights_file)
    top = optim.lr * (mspec.backbone_lr_mult if transferring else 1.0)
    head = [p for p in model.parameters() if id(p) in head_ids]
    if not transferring or mspec.lr_decay == 1.0:
        return [("backbone", [p for p in model.parameters() if id(p) not in head_ids], top), ("head", head, optim.lr)]
    plan, seen = [], set(head_ids)
    stages = model.stages()[:-1]
    for k, (name, mods) in enumerate(reversed(stages)):
        ps = [p for m in mods for p in m.parameters() if id(p) not in seen]
        seen.update(id(p) for p in ps)
        plan.append((f"backbone.{name}", ps, top * mspec.lr_decay**k))
    plan.append(("backbone.other", [p for p in model.parameters() if id(p) not in seen], top))
    return [*reversed(plan), ("head", head, optim.lr)]


def build_optimizer(model: Classifier, optim: OptimSpec, mspec: ModelSpec) -> torch.optim.Optimizer:
    """Head at optim.lr, backbone stages at their discriminative rates when transferring (_lr_plan);
    no weight decay on norms and biases unless asked. A fresh head's groups skip the warmup (`warmup`:
    False). All parameters are registered (frozen ones too) so progressive unfreezing needs no new optimizer."""
    fresh = head_is_fresh(model, mspec)
    groups = []
    for name, params, lr in _lr_plan(model, optim, mspec):
        decay, no_decay = _split_decay([model], params)
        wd = optim.weight_decay
        if optim.decay_norm_and_bias:
            decay, no_decay = decay + no_decay, []
        for suffix, ps, w in (("", decay, wd), ("/no_decay", no_decay, 0.0)):
            if ps:
                groups.append(
                    {
                        "params": ps,
                        "lr": lr,
                        "weight_decay": w,
                        "name": name + suffix,
                        "warmup": not (fresh and name == "head"),
                    }
                )
    if optim.name == "sgd":
        return torch.optim.SGD(groups, lr=optim.lr, momentum=optim.momentum, nesterov=optim.nesterov)
    if optim.name == "adam":
        return torch.optim.Adam(groups, lr=optim.lr, betas=optim.betas)
    if optim.name == "adamw":
        return torch.optim.AdamW(groups, lr=optim.lr, betas=optim.betas)
    return torch.optim.RMSprop(groups, lr=optim.lr, momentum=optim.momentum)


# --- schedule -----------------------------------------------------------------------------


def lr_factor(spec: ScheduleSpec, step: int, steps_per_epoch: int, total_steps: int, min_ratio: float = 0.0) -> float:
    """Multiplier of the base LR after `step` optimizer steps (closed form: resumes exactly)."""
    epoch_f = step / max(1, steps_per_epoch)
    if spec.name == "onecycle":
        up = max(1, int(total_steps * spec.pct_start))
        if step < up:  # 1/25 of the peak → peak, then cosine down to 1/1e4 of the peak, as OneCycleLR
            return 0.04 + 0.96 * (1 - math.cos(math.pi * step / up)) / 2
        t = min(1.0, (step - up) / max(1, total_steps - up))
        return 1e-4 + (1 - 1e-4) * (1 + math.cos(math.pi * t)) / 2
    warm = spec.warmup_epochs * steps_per_epoch
    if warm > 0 and step < warm:
        return (step + 1) / warm
    if spec.name == "step":
        return spec.gamma ** int(epoch_f // spec.step_size)
    if spec.name == "multistep":
        return spec.gamma ** sum(1 for m in spec.milestones if epoch_f >= m)
    if spec.name == "cosine":
        t = min(1.0, (step - warm) / max(1, total_steps - warm))
        return min_ratio + (1 - min_ratio) * (1 + math.cos(math.pi * t)) / 2
    return 1.0


class Schedule:
    """Per-step LR for every schedule but plateau, which steps per epoch on the monitored metric."""

    def __init__(
        self, optimizer: torch.optim.Optimizer, spec: ScheduleSpec, steps_per_epoch: int, epochs: int, mode: str
    ):
        self.opt, self.spec = optimizer, spec
        self.steps_per_epoch, self.total = steps_per_epoch, steps_per_epoch * epochs
        self.base = [g["lr"] for g in optimizer.param_groups]
        self.warm = [g.get("warmup", True) for g in optimizer.param_groups]
        self.cold_spec = spec.model_copy(update={"warmup_epochs": 0.0})  # for a fresh head's groups
        self.step_count = 0
        self.plateau = (
            torch.optim.lr_scheduler.ReduceLROnPlateau(
                optimizer, mode=mode, factor=spec.gamma, patience=spec.patience, min_lr=spec.min_lr
            )
            if spec.name == "plateau"
            else None
        )
        self._apply()

    def _apply(self) -> None:
        if self.plateau is not None or (self.spec.name == "none" and self.spec.warmup_epochs == 0):
            return
        for g, base, warm in zip(self.opt.param_groups, self.base, self.warm, strict=True):
            g["lr"] = self._lr(base, warm)

    def _lr(self, base: float, warm: bool = True) -> float:
        min_ratio = min(1.0, self.spec.min_lr / base) if base > 0 else 0.0
        spec = self.spec if warm else self.cold_spec
        return base * lr_factor(spec, self.step_count, self.steps_per_epoch, self.total, min_ratio)

    def step_batch(self) -> None:
        self.step_count += 1
        self._apply()

    def step_epoch(self, metric: float | None) -> None:
        if self.plateau is not None and metric is not None and math.isfinite(metric):
            self.plateau.step(metric)

    def state_dict(self) -> dict:
        return {
            "step_count": self.step_count,
            "base": self.base,
            "plateau": self.plateau.state_dict() if self.plateau else None,
        }

    def load_state_dict(self, state: dict) -> None:
        self.step_count, self.base = state["step_count"], state["base"]
        if self.plateau is not None and state.get("plateau"):
            self.plateau.load_state_dict(state["plateau"])
        self._apply()


# --- mixed precision + clipping ------------------------------------------------------


class AmpStep:
    """autocast + GradScaler + clipping in one small object (after timm's NativeScaler)."""

    def __init__(self, train: TrainSpec, device_type: str):
        self.device_type = device_type
        self.dtype = {"fp16": torch.float16, "bf16": torch.bfloat16}.get(train.precision)
        # The scaler is not optional with fp16: small gradients underflow without it.
        self.scaler = torch.amp.GradScaler(device_type, enabled=train.precision == "fp16")
        self.clip = train.grad_clip

    def autocast(self) -> torch.autocast:
        return torch.autocast(self.device_type, dtype=self.dtype or torch.float32, enabled=self.dtype is not None)

    def backward(self, loss: torch.Tensor) -> None:
        self.scaler.scale(loss).backward()

    def step(
        self,
        optimizer: torch.optim.Optimizer,
        params: list[nn.Parameter],
        want_norm: bool,
        before_step: Callable[[], None] | None = None,
        after_step: Callable[[], None] | None = None,
    ) -> torch.Tensor | None:
        """unscale → (inspect) → clip → step → update → zero_grad. Returns the pre-clip grad norm
        when clipping by norm or when asked (a device tensor: no sync here)."""
        self.scaler.unscale_(optimizer)  # clip and inspect true gradients, not scaled ones
        if before_step is not None:
            before_step()
        norm = None
        if self.clip.mode == "norm":
            norm = torch.nn.utils.clip_grad_norm_(params, self.clip.max)
        else:
            if want_norm:
                norm = torch.nn.utils.get_total_norm([p.grad for p in params if p.grad is not None])
            if self.clip.mode == "value":
                torch.nn.utils.clip_grad_value_(params, self.clip.max)
        self.scaler.step(optimizer)  # skipped by the scaler when fp16 gradients overflowed
        self.scaler.update()
        if after_step is not None:
            after_step()
        optimizer.zero_grad(set_to_none=True)
        return norm
