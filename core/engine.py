"""The explicit training loop: `train_one_epoch`, `optimizer_step`, `fit`; the end of each epoch (evaluation,
checkpoints, early stopping) is core/evaluation.py, the Trainer they work on core/trainer.py.

It reads top to bottom. Per step it does what the textbook loop does plus cheap
bookkeeping kept on the device; host syncs (`.item()`) happen only every
`train.log_every` steps, because each one stalls the GPU pipeline.
"""

from __future__ import annotations

import math
import time
from typing import Any

import torch
from torch import nn

from core.batches import epoch_generator
from core.criterion import build_criterion
from core.evaluation import end_epoch
from core.insight import emit_histograms, log_histograms
from core.mixing import epoch_mixer
from core.names import GRAD_NORM, GRAD_NORM_PREFIX, LR, TRAIN_EPOCH_LOSS, TRAIN_LOSS, update_ratio_key
from core.optim import apply_transfer, set_train_mode, trained_stages
from core.tally import Tally
from core.trainer import Trainer, prepare

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


class LayerProbe:
    """Per layer group, on a diagnostics step: the gradient norm before the update and ‖Δw‖/‖w‖ after it."""

    def __init__(self, t: Trainer, params: list[nn.Parameter]) -> None:
        self.t, self.params = t, params
        self.values: dict[str, torch.Tensor] = {}
        self.before: list[torch.Tensor] = []
        self.hist: Any = None

    def before_step(self) -> None:
        self.values.update(self.t.group_grad_norms())
        self.hist = log_histograms(self.t.groups)  # weights before the update, gradients after unscaling
        self.before = [p.detach().clone() for p in self.params]

    def after_step(self) -> None:
        """‖Δw‖/‖w‖ per layer group (≈1e-3 is healthy), next to each group's gradient norm."""
        old = {id(p): b for p, b in zip(self.params, self.before, strict=True)}
        for name, ps in self.t.groups.items():
            pairs = [(p, old[id(p)]) for p in ps if id(p) in old]
            if not pairs:
                continue
            delta = torch.linalg.vector_norm(torch.stack([torch.linalg.vector_norm(p.detach() - b) for p, b in pairs]))
            base = torch.linalg.vector_norm(torch.stack([torch.linalg.vector_norm(b) for _, b in pairs]))
            self.values[update_ratio_key(name)] = delta / base.clamp_min(1e-12)


def train_one_epoch(t: Trainer, epoch: int) -> dict[str, float]:
    """One pass over the training split: forward, loss, backward on every micro-batch; an optimizer step
    every `train.accumulate` of them (optimizer_step)."""
    spec = t.spec.train
    set_train_mode(t.model)
    t.train_batches.set_epoch(epoch)
    # each rank its own augmentation stream (rank 0's is a single process's)
    gen = epoch_generator(t.spec.seed + 1 + 7_919 * t.ranks.rank, epoch, t.device) if t.pre_train.augment else None
    params = [p for p in t.model.parameters() if p.requires_grad]
    n_micro = min(len(t.train_batches), (spec.steps_per_epoch or 10**12) * spec.accumulate)
    crit = build_criterion(spec, t.data.info.class_counts, t.device)  # label smoothing, class weights
    mixer = epoch_mixer(spec.mix, t.data.info.num_classes, t.spec.seed, epoch)  # train.mix, None when off
    tally, it = Tally(t.device, t.ranks), iter(t.train_batches)
    for i in range(n_micro):
        t0 = time.perf_counter()
        x, y = next(it)
        waited = time.perf_counter() - t0
        x = prepare(t.pre_train, x, gen)
        # mixup / cutmix: probability targets, and the label each leans to for train/acc (core/mixing.py)
        x, target, y_acc = mixer(x, y) if mixer is not None else (x, y, y)
        final = (i + 1) % spec.accumulate == 0 or i + 1 == n_micro
        with t.ranks.sync(final):  # several ranks: gradients are all-reduced on the final micro-step only
            with t.amp.autocast():
                logits = t.forward(x)
            # cross-entropy on raw logits; a rank's empty share of a last batch still joins the all-reduce
            loss = crit(logits.float(), target) if len(y) else logits.float().sum() * 0.0
            scale = t.train_batches.loss_scale(i, len(y))
            share = loss if scale == 1.0 else loss * scale
            t.amp.backward(share / spec.accumulate)  # the mean over the accumulated batch
        tally.add(loss, logits, y_acc, waited, share)
        if final:
            optimizer_step(t, params, tally, epoch)
            if t.control.should_stop():
                raise Stopped()
    figures = tally.epoch()
    if not math.isfinite(figures[TRAIN_EPOCH_LOSS]):
        raise Diverged(t.global_step, figures[TRAIN_EPOCH_LOSS], f"end of epoch {epoch}")
    return figures


def optimizer_step(t: Trainer, params: list[nn.Parameter], tally: Tally, epoch: int) -> None:
    """unscale → (probe) → clip → step (AmpStep), the schedule, and every `log_every` steps the metrics."""
    step = t.global_step + 1
    log, diag = step % t.spec.train.log_every == 0 or step == 1, step % t.spec.train.diag_every == 0
    probe = LayerProbe(t, params) if diag else None
    grad_norm = t.amp.step(
        t.optimizer,
        params,
        want_norm=log,
        before_step=probe and probe.before_step,
        after_step=probe and probe.after_step,
    )
    t.schedule.step_batch()
    if t.ema is not None:  # the moving average follows every step (core/ema.py)
        t.ema.update(t.model)
    t.global_step = step
    if log or diag:
        values = {**tally.window(), LR: t.optimizer.param_groups[-1]["lr"]}
        if grad_norm is not None:
            values[GRAD_NORM] = float(grad_norm)
        if probe is not None:
            values.update({k: float(v) for k, v in probe.values.items()})
            t.diagnoser.layer_norms(
                step, {k.removeprefix(GRAD_NORM_PREFIX): v for k, v in values.items() if k.startswith(GRAD_NORM_PREFIX)}
            )
        t.sink.metrics(step, epoch, values)  # logged first: the chart shows the explosion
        if probe is not None:
            emit_histograms(t.sink, step, probe.hist)
        check_divergence(t, step, values[TRAIN_LOSS], values.get(GRAD_NORM))
        t.sink.progress(step, t.steps_per_epoch * t.spec.train.epochs)


def judge(t: Trainer, epoch: int) -> str | None:
    """`pruned` when the control's judge (a sweep's pruner) says this trial should stop after `epoch`."""
    judge_epoch = getattr(t.control, "judge_epoch", None)
    reason = judge_epoch(epoch) if judge_epoch is not None and epoch >= 1 else None
    if not reason:
        return None
    t.sink.event(
        "lifecycle",
        "info",
        f"pruned: {reason}",
        {"code": "pruned", "epoch": epoch, "reason": reason},
        step=t.global_step,
    )
    return "pruned"


def fit(t: Trainer, start_epoch: int = 1) -> str:
    """Run epochs start_epoch..epochs; returns completed | early_stopped | cancelled | pruned (Diverged propagates).
    A resumed run is judged first for the epoch it resumes after: a verdict stored before the crash holds."""
    if 1 < start_epoch <= t.spec.train.epochs and (status := judge(t, start_epoch - 1)):
        return status
    for epoch in range(start_epoch, t.spec.train.epochs + 1):
        trained = apply_transfer(t.model, t.spec.model, epoch)
        t.forward = t.ranks.wrap(t.model, t.forward)  # DDP is rebuilt when the trained layers change
        if epoch > 1 and trained != trained_stages(t.model, t.spec.model, epoch - 1):
            t.sink.event(
                "lifecycle",
                "info",
                f"progressive unfreezing: training {', '.join(trained)} from epoch {epoch}",
                {"code": "unfreeze", "stages": trained},
                step=t.global_step,
            )
        t0 = time.perf_counter()
        try:
            train_m = train_one_epoch(t, epoch)
        except Stopped:
            return "cancelled"
        status = (
            t.ranks.agree(end_epoch(t, epoch, train_m, time.perf_counter() - t0))  # rank 0's verdict for all
            or (epoch < t.spec.train.epochs and judge(t, epoch))
        )
        if status:
            return status
        if t.control.should_stop():
            return "cancelled"
    return "completed"
