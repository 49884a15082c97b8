"""The explicit training loop: `train_one_epoch`, `evaluate`, `fit` (S-T1…S-T13).

It reads top to bottom. Per step it does what the textbook loop does plus cheap
bookkeeping kept on the device; host syncs (`.item()`) happen only every
`train.log_every` steps, because each one stalls the GPU pipeline.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

from core.checkpoint import EarlyStopping, rng_state, save_checkpoint
from core.config import RunSpec
from core.data import DataBundle, DeviceBatches, Preprocess, epoch_generator
from core.diagnosis import Diagnoser
from core.events import Control, Sink
from core.models import Classifier
from core.names import CLASS_ACC_PREFIX, class_acc_key
from core.optim import AmpStep, Schedule, apply_transfer


# A loss this many times its first value is divergence even while still finite (lr 1e3 sends a
# cross-entropy of 1.1 to 1e16 in one step, then to inf gradients, yet never to NaN).
DIVERGE_FACTOR = 1e4


class Diverged(RuntimeError):
    def __init__(self, step: int, value: float, where: str):
        super().__init__(f"loss became {value:.4g} at step {step} ({where})")
        self.step, self.value, self.where = step, value, where


def check_divergence(t: Trainer, step: int, loss: float, grad_norm: float | None) -> None:
    if t.ref_loss is None and math.isfinite(loss):
        t.ref_loss = loss
    if not math.isfinite(loss):
        raise Diverged(step, loss, "non-finite loss")
    if t.ref_loss is not None and loss > DIVERGE_FACTOR * max(t.ref_loss, 1e-3):
        raise Diverged(step, loss, f"more than {DIVERGE_FACTOR:.0e}× the first loss {t.ref_loss:.4g}")
    # With an fp16 GradScaler, inf gradients are expected now and then (the step is skipped).
    if grad_norm is not None and not math.isfinite(grad_norm) and not t.amp.scaler.is_enabled():
        raise Diverged(step, loss, f"gradient norm {grad_norm}")


class Stopped(Exception):
    """Cancel requested: the loop stops between steps."""


@dataclass
class Trainer:
    """Everything the loop needs, built once by core.train."""

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
    criterion: nn.Module = field(default_factory=nn.CrossEntropyLoss)
    global_step: int = 0
    epoch: int = 0  # last completed epoch
    ref_loss: float | None = None  # the first logged loss, the yardstick for divergence
    history: list[dict[str, float]] = field(default_factory=list)

    def __post_init__(self) -> None:
        aug = self.spec.data.augment
        any_aug = aug.random_crop or aug.hflip or aug.color_jitter > 0
        self.pre_train = Preprocess(self.data.info, aug if any_aug else None, self.device)
        self.pre_val = Preprocess(self.data.info, None, self.device)
        self.groups = self.model.param_groups_by_stage()
        # S-D1: with no augmentation, a device-resident split is normalised once, not every step.
        budget = self.spec.loader.device_cache_mb * 2**20
        for batches, pre in ((self.train_batches, self.pre_train), (self.val_batches, self.pre_val)):
            if isinstance(batches, DeviceBatches) and pre.augment is None and batches.x.numel() * 4 <= budget:
                batches.x = torch.cat([pre(chunk) for chunk in batches.x.split(4096)])


    @property
    def steps_per_epoch(self) -> int:
        n = len(self.train_batches)
        if self.spec.train.steps_per_epoch:
            n = min(n, self.spec.train.steps_per_epoch)
        return max(1, math.ceil(n / self.spec.train.accumulate))

    # --- per-layer diagnostics (every diag_every steps) ---------------------------------------
    def _group_grad_norms(self) -> dict[str, torch.Tensor]:
        out = {}
        for name, ps in self.groups.items():
            grads = [p.grad for p in ps if p.grad is not None]
            if grads:
                out[f"grad_norm/{name}"] = torch.nn.utils.get_total_norm(grads)
        return out


def prepare(pre: Preprocess, x: torch.Tensor, gen: torch.Generator | None = None) -> torch.Tensor:
    """uint8 batches are preprocessed now; float batches were normalised once up front."""
    return x if x.is_floating_point() else pre(x, gen)


def set_train_mode(model: Classifier) -> None:
    """model.train() (S-T2), but frozen stages keep BatchNorm statistics fixed (feature extraction)."""
    model.train()
    for _, mods in model.stages():
        for m in mods:
            if not any(p.requires_grad for p in m.parameters()):
                m.eval()


def train_one_epoch(t: Trainer, epoch: int) -> dict[str, float]:
    spec = t.spec.train
    set_train_mode(t.model)
    t.train_batches.set_epoch(epoch)
    gen = epoch_generator(t.spec.seed + 1, epoch, t.device) if t.pre_train.augment else None
    params = [p for p in t.model.parameters() if p.requires_grad]
    n_micro = min(len(t.train_batches), (spec.steps_per_epoch or 10**12) * spec.accumulate)
    crit = nn.CrossEntropyLoss(label_smoothing=spec.label_smoothing)
    dev = t.device
    ep_loss, ep_correct, ep_n = torch.zeros((), device=dev), torch.zeros((), device=dev, dtype=torch.long), 0
    win_loss, win_batches, win_samples, win_wait = torch.zeros((), device=dev), 0, 0, 0.0
    ep_wait, t_epoch, t_win = 0.0, time.perf_counter(), time.perf_counter()
    it = iter(t.train_batches)
    for i in range(n_micro):
        t0 = time.perf_counter()
        x, y = next(it)
        waited = time.perf_counter() - t0
        win_wait += waited
        ep_wait += waited
        x = prepare(t.pre_train, x, gen)
        with t.amp.autocast():
            logits = t.forward(x)
        loss = crit(logits.float(), y)  # S-T3: cross-entropy on raw logits
        t.amp.backward(loss / spec.accumulate)  # S-T8: the mean over the accumulated batch
        ep_loss += loss.detach() * len(y)
        ep_correct += (logits.detach().argmax(1) == y).sum()
        ep_n += len(y)
        win_loss += loss.detach()
        win_batches += 1
        win_samples += len(y)
        if (i + 1) % spec.accumulate and i + 1 < n_micro:
            continue
        step = t.global_step + 1
        log, diag = step % spec.log_every == 0 or step == 1, step % spec.diag_every == 0
        norms, before = {}, []

        def inspect() -> None:
            if diag:
                norms.update(t._group_grad_norms())
                before.extend(p.detach().clone() for p in params)

        def ratios() -> None:
            if diag:
                _update_ratios(t, params, before, norms)

        grad_norm = t.amp.step(t.optimizer, params, want_norm=log, before_step=inspect, after_step=ratios)
        t.schedule.step_batch()
        t.global_step = step
        if log or diag:
            now = time.perf_counter()
            values = {"train/loss": (win_loss / win_batches).item(), "lr": t.optimizer.param_groups[-1]["lr"],
                      "throughput": win_samples / max(now - t_win, 1e-9), "data_wait": win_wait / max(now - t_win, 1e-9)}
            if grad_norm is not None:
                values["grad_norm"] = float(grad_norm)
            values.update({k: float(v) for k, v in norms.items()})
            if diag:
                t.diagnoser.layer_norms(step, {k.removeprefix("grad_norm/"): v for k, v in values.items() if k.startswith("grad_norm/")})
            t.sink.metrics(step, epoch, values)  # logged first: the chart shows the explosion
            check_divergence(t, step, values["train/loss"], values.get("grad_norm"))
            t.sink.progress(step, t.steps_per_epoch * t.spec.train.epochs)
            win_loss.zero_()
            win_batches, win_samples, win_wait, t_win = 0, 0, 0.0, now
        if t.control.should_stop():
            raise Stopped()
    train_loss = (ep_loss / max(ep_n, 1)).item()
    if not math.isfinite(train_loss):
        raise Diverged(t.global_step, train_loss, f"end of epoch {epoch}")
    elapsed = time.perf_counter() - t_epoch
    return {"train/epoch_loss": train_loss, "train/acc": ep_correct.item() / max(ep_n, 1), "data_wait_epoch": ep_wait / max(elapsed, 1e-9)}


def _update_ratios(t: Trainer, params: list, before: list, norms: dict) -> None:
    """S-X2: ‖Δw‖/‖w‖ per layer group (≈1e-3 is healthy), next to each group's gradient norm."""
    old = {id(p): b for p, b in zip(params, before, strict=True)}
    for name, ps in t.groups.items():
        pairs = [(p, old[id(p)]) for p in ps if id(p) in old]
        if not pairs:
            continue
        delta = torch.linalg.vector_norm(torch.stack([torch.linalg.vector_norm(p.detach() - b) for p, b in pairs]))
        base = torch.linalg.vector_norm(torch.stack([torch.linalg.vector_norm(b) for _, b in pairs]))
        norms[f"update_ratio/{name}"] = delta / base.clamp_min(1e-12)


@torch.inference_mode()
def evaluate(t: Trainer) -> tuple[dict[str, float], torch.Tensor]:
    """S-T2: eval() + inference_mode for every validation phase. Returns metrics and the confusion matrix."""
    t.model.eval()
    c = t.data.info.num_classes
    dev = t.device
    loss_sum, n = torch.zeros((), device=dev), 0
    top5 = torch.zeros((), device=dev, dtype=torch.long)
    confusion = torch.zeros(c * c, device=dev, dtype=torch.long)
    crit = nn.CrossEntropyLoss(reduction="sum")
    for x, y in t.val_batches:
        with t.amp.autocast():
            logits = t.forward(prepare(t.pre_val, x)).float()
        loss_sum += crit(logits, y)
        pred = logits.argmax(1)
        confusion += torch.bincount(y * c + pred, minlength=c * c)
        if c > 5:
            top5 += (logits.topk(5, dim=1).indices == y[:, None]).any(1).sum()
        n += len(y)
    cm = confusion.view(c, c).cpu()
    m = {"val/loss": (loss_sum / max(n, 1)).item(), "val/acc": float(cm.diag().sum()) / max(n, 1)}
    if c > 5:
        m["val/acc_top5"] = top5.item() / max(n, 1)
    return m, cm


def _peak_memory_mb(device: torch.device) -> float:
    if device.type == "cuda":
        return torch.cuda.max_memory_allocated(device) / 2**20
    import resource

    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # KiB on Linux


def _checkpoint_payload(t: Trainer, epoch: int) -> dict[str, Any]:
    return {
        "model": t.model.state_dict(), "optimizer": t.optimizer.state_dict(), "schedule": t.schedule.state_dict(),
        "scaler": t.amp.scaler.state_dict(), "early_stopping": t.early.state_dict(), "epoch": epoch,
        "global_step": t.global_step, "rng": rng_state(), "spec": t.spec.model_dump(mode="json"),
        "data_info": t.data.info.to_dict(), "history": t.history,
        "diagnoser": {"emitted": sorted(t.diagnoser.emitted)}, "ref_loss": t.ref_loss,
    }


def end_epoch(t: Trainer, epoch: int, train_m: dict[str, float], seconds: float) -> str | None:
    """Validate, log, checkpoint, decide. Returns a final status when training must end."""
    val_m, cm = evaluate(t)
    m = {**train_m, **val_m, "epoch_time_s": seconds, "lr_epoch": t.optimizer.param_groups[-1]["lr"],
         "mem/peak_mb": _peak_memory_mb(t.device)}
    names = t.data.info.class_names
    per_class = (cm.diag().float() / cm.sum(1).clamp_min(1).float()).tolist()
    keys = [class_acc_key(n) for n in names]  # a class name never makes a key the store refuses
    if len(names) <= 50:
        m.update(dict(zip(keys, per_class, strict=True)))
    t.sink.metrics(t.global_step, epoch, m)
    data = {"code": "evaluation", "epoch": epoch, "confusion": cm.tolist(), "per_class_acc": per_class, "class_names": names}
    shortened = {k: n for k, n in zip(keys, names, strict=True) if k != CLASS_ACC_PREFIX + n}
    if shortened:
        data["class_keys"] = shortened  # the full name of each shortened per-class key
    t.sink.event("evaluation", "info", f"epoch {epoch}: val/acc {m['val/acc']:.4f}, val/loss {m['val/loss']:.4f}", data,
                 step=t.global_step)
    t.history.append({k: v for k, v in m.items() if not k.startswith(CLASS_ACC_PREFIX)})
    t.diagnoser.epoch(epoch, m, t.global_step)
    monitor = t.spec.train.early_stopping.monitor
    value = m["train/epoch_loss"] if monitor == "train/loss" else m[monitor]
    best = t.early.update(value, epoch)
    t.schedule.step_epoch(value)
    t.epoch = epoch
    ck = t.spec.checkpoint
    payload = _checkpoint_payload(t, epoch) if (ck.save_last or (ck.save_best and best)) else None
    # Metrics up to this step must be stored before the checkpoint that a resumed run starts from,
    # or a crash right after it would leave a gap no resume can fill. Sinks that buffer say so with flush();
    # one that cannot store everything in time reports it itself (the worker's sink marks the run degraded).
    flush = getattr(t.sink, "flush", None)
    if payload is not None and flush is not None:
        flush()
    if ck.save_best and best:
        save_checkpoint(t.out_dir / "checkpoints" / "best.pt", payload)
    if ck.save_last:
        save_checkpoint(t.out_dir / "checkpoints" / "last.pt", payload)
    if t.early.should_stop:
        t.sink.event("lifecycle", "info", f"early stopping: {monitor} did not improve for {t.early.patience} epochs "
                     f"(best {t.early.best:.4g} at epoch {t.early.best_epoch})", {"code": "early_stopped"}, step=t.global_step)
        return "early_stopped"
    return None


def fit(t: Trainer, start_epoch: int = 1) -> str:
    """Run epochs start_epoch..epochs; returns completed | early_stopped | cancelled (Diverged propagates)."""
    for epoch in range(start_epoch, t.spec.train.epochs + 1):
        trained = apply_transfer(t.model, t.spec.model, epoch)
        if t.spec.model.unfreeze_at_epoch == epoch:
            t.sink.event("lifecycle", "info", f"progressive unfreezing: training {', '.join(trained)} from epoch {epoch}",
                         {"code": "unfreeze", "stages": trained}, step=t.global_step)
        t0 = time.perf_counter()
        try:
            train_m = train_one_epoch(t, epoch)
        except Stopped:
            return "cancelled"
        status = end_epoch(t, epoch, train_m, time.perf_counter() - t0)
        if status:
            return status
        if t.control.should_stop():
            return "cancelled"
    return "completed"
