"""The explicit training loop: `train_one_epoch`, `evaluate`, `fit`.

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

from core import catalog
from core.checkpoint import EarlyStopping, rng_state, save_checkpoint
from core.config import RunSpec, TrainSpec
from core.data import DataBundle, DeviceBatches, Preprocess, epoch_generator
from core.diagnosis import Diagnoser
from core.distributed import SOLO, Ranks
from core.events import Control, Sink
from core.insight import Mistakes, confusion_scores, emit_histograms, log_histograms, store_gallery, top_confusions
from core.models import Classifier
from core.names import (
    CHECKPOINT_FILES,
    CLASS_ACC_PREFIX,
    EPOCH_TIME,
    GRAD_NORM,
    GRAD_NORM_PREFIX,
    LR,
    LR_EPOCH,
    MAX_CONFUSION_CLASSES,
    MAX_PER_CLASS_SHOWN,
    PEAK_MEMORY,
    TRAIN_EPOCH_LOSS,
    TRAIN_LOSS,
    VAL_ACC,
    VAL_ACC_TOP5,
    VAL_F1_MACRO,
    VAL_LOSS,
    class_acc_key,
    grad_norm_key,
    update_ratio_key,
)
from core.optim import AmpStep, Schedule, apply_transfer, set_train_mode, trained_stages
from core.scores import macro_f1
from core.tally import Tally

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
    global_step: int = 0
    epoch: int = 0  # last completed epoch
    ref_loss: float | None = None  # the first logged loss, the yardstick for divergence
    history: list[dict[str, float]] = field(default_factory=list)
    ranks: Ranks = SOLO  # this process's place in a run on several processes (core.distributed)

    def __post_init__(self) -> None:
        aug = self.spec.data.augment
        any_aug = aug.random_crop or aug.hflip or aug.color_jitter > 0
        self.pre_train = Preprocess(self.data.info, aug if any_aug else None, self.device)
        self.pre_val = Preprocess(self.data.info, None, self.device)
        self.groups = self.model.param_groups_by_stage()
        # with no augmentation, a device-resident split is normalised once, not every step.
        budget = self.spec.loader.device_cache_mb * 2**20
        for batches, pre in ((self.train_batches, self.pre_train), (self.val_batches, self.pre_val)):
            if isinstance(batches, DeviceBatches) and pre.augment is None and batches.x.numel() * 4 <= budget:
                batches.x = torch.cat([pre(chunk) for chunk in batches.x.split(4096)])

    @property
    def steps_per_epoch(self) -> int:
        return steps_per_epoch(len(self.train_batches), self.spec.train)

    # --- per-layer diagnostics (every diag_every steps) ---------------------------------------
    def _group_grad_norms(self) -> dict[str, torch.Tensor]:
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


class LayerProbe:
    """Per layer group, on a diagnostics step: the gradient norm before the update and ‖Δw‖/‖w‖ after it."""

    def __init__(self, t: Trainer, params: list[nn.Parameter]) -> None:
        self.t, self.params = t, params
        self.values: dict[str, torch.Tensor] = {}
        self.before: list[torch.Tensor] = []
        self.hist: Any = None

    def before_step(self) -> None:
        self.values.update(self.t._group_grad_norms())
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
    crit = nn.CrossEntropyLoss(label_smoothing=spec.label_smoothing)
    tally, it = Tally(t.device, t.ranks), iter(t.train_batches)
    for i in range(n_micro):
        t0 = time.perf_counter()
        x, y = next(it)
        waited = time.perf_counter() - t0
        x = prepare(t.pre_train, x, gen)
        final = (i + 1) % spec.accumulate == 0 or i + 1 == n_micro
        with t.ranks.sync(final):  # several ranks: gradients are all-reduced on the final micro-step only
            with t.amp.autocast():
                logits = t.forward(x)
            # cross-entropy on raw logits; a rank's empty share of a last batch still joins the all-reduce
            loss = crit(logits.float(), y) if len(y) else logits.float().sum() * 0.0
            scale = t.train_batches.loss_scale(i, len(y))
            share = loss if scale == 1.0 else loss * scale
            t.amp.backward(share / spec.accumulate)  # the mean over the accumulated batch
        tally.add(loss, logits, y, waited, share)
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


@torch.inference_mode()
def evaluate(t: Trainer, mistakes: Mistakes | None = None) -> tuple[dict[str, float], torch.Tensor]:
    """eval() + inference_mode for every validation phase. Returns metrics and the confusion matrix;
    `mistakes` collects the most confident wrong predictions."""
    t.model.eval()
    c = t.data.info.num_classes
    dev = t.device
    loss_sum, n = torch.zeros((), device=dev), 0
    top5 = torch.zeros((), device=dev, dtype=torch.long)
    confusion = torch.zeros(c * c, device=dev, dtype=torch.long)
    crit = nn.CrossEntropyLoss(reduction="sum")
    forward = t.ranks.eval_forward(t.forward, t.model)
    for x, y in t.val_batches:
        if not len(y):  # a rank's empty share of the last batch
            continue
        with t.amp.autocast():
            logits = forward(prepare(t.pre_val, x)).float()
        loss_sum += crit(logits, y)
        pred = logits.argmax(1)
        confusion += torch.bincount(y * c + pred, minlength=c * c)
        if mistakes is not None:
            mistakes.add(logits, y)
        if c > 5:
            top5 += (logits.topk(5, dim=1).indices == y[:, None]).any(1).sum()
        n += len(y)
    if t.ranks.world > 1:  # each rank saw its shard: sums and counts over the whole split
        loss_sum, n, top5, confusion = t.ranks.sum_(loss_sum, n, top5, confusion)
        if mistakes is not None:
            t.ranks.merge_mistakes(mistakes)
    cm = confusion.view(c, c).cpu()
    m = {
        VAL_LOSS: (loss_sum / max(n, 1)).item(),
        VAL_ACC: float(cm.diag().sum()) / max(n, 1),
        VAL_F1_MACRO: macro_f1(cm.diag().tolist(), cm.sum(1).tolist(), cm.sum(0).tolist()),
    }
    if c > 5:
        m[VAL_ACC_TOP5] = top5.item() / max(n, 1)
    return m, cm


def _peak_memory_mb(device: torch.device) -> float:
    if device.type == "cuda":
        return torch.cuda.max_memory_allocated(device) / 2**20
    import resource

    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # KiB on Linux


def _checkpoint_payload(t: Trainer, epoch: int) -> dict[str, Any]:
    return {
        "model": t.model.state_dict(),
        "optimizer": t.optimizer.state_dict(),
        "schedule": t.schedule.state_dict(),
        "scaler": t.amp.scaler.state_dict(),
        "early_stopping": t.early.state_dict(),
        "epoch": epoch,
        "global_step": t.global_step,
        "rng": rng_state(),
        "spec": t.spec.model_dump(mode="json"),
        "data_info": t.data.info.to_dict(),
        "history": t.history,
        "diagnoser": {"emitted": sorted(t.diagnoser.emitted)},
        "ref_loss": t.ref_loss,
        **t.ranks.rng_extra(),
    }


def end_epoch(t: Trainer, epoch: int, train_m: dict[str, float], seconds: float) -> str | None:
    """Validate, log, checkpoint, decide. Returns a final status when training must end."""
    mistakes = Mistakes(t.device)
    val_m, cm = evaluate(t, mistakes)
    m = {
        **train_m,
        **val_m,
        EPOCH_TIME: seconds,
        LR_EPOCH: t.optimizer.param_groups[-1]["lr"],
        PEAK_MEMORY: _peak_memory_mb(t.device),
    }
    names = t.data.info.class_names
    per_class = (cm.diag().float() / cm.sum(1).clamp_min(1).float()).tolist()
    keys = [class_acc_key(n) for n in names]  # a class name never makes a key the store refuses
    if len(names) <= 50:
        m.update(dict(zip(keys, per_class, strict=True)))
    # Every figure of the epoch is computed before any is sent: the metrics and the evaluation event
    # describe one finished evaluation (evaluate already measured val/f1_macro from the same matrix).
    data = _evaluation_data(epoch, names, keys, per_class, cm)
    t.sink.metrics(t.global_step, epoch, m)
    t.sink.event(
        "evaluation",
        "info",
        f"epoch {epoch}: val/acc {m['val/acc']:.4f}, val/loss {m['val/loss']:.4f}",
        data,
        step=t.global_step,
    )
    t.history.append({k: v for k, v in m.items() if not k.startswith(CLASS_ACC_PREFIX)})
    t.diagnoser.epoch(epoch, m, t.global_step)
    monitor = t.spec.train.early_stopping.monitor
    value = m[catalog.stored_key(monitor)]  # train/loss per epoch is train/epoch_loss
    best = t.early.update(value, epoch)
    if best and t.ranks.is_main:  # the epoch the best checkpoint holds: its most confident mistakes
        store_gallery(t.sink, t.data.val, names, mistakes, cm, epoch, t.out_dir)
    t.schedule.step_epoch(value)
    t.epoch = epoch
    _save_checkpoints(t, epoch, best)
    if t.early.should_stop:
        t.sink.event(
            "lifecycle",
            "info",
            f"early stopping: {monitor} did not improve for {t.early.patience} epochs "
            f"(best {t.early.best:.4g} at epoch {t.early.best_epoch})",
            {"code": "early_stopped"},
            step=t.global_step,
        )
        return "early_stopped"
    return None


def _evaluation_data(
    epoch: int, names: list[str], keys: list[str], per_class: list[float], cm: torch.Tensor
) -> dict[str, Any]:
    """The evaluation event's data: per-class accuracy, precision, recall, F1 and support, and the confusion
    matrix (or, for many classes, its most confused pairs and the classes that need attention)."""
    scores = confusion_scores(cm)
    data = {"code": "evaluation", "epoch": epoch, "per_class_acc": per_class, "class_names": names, **scores}
    if len(names) <= MAX_CONFUSION_CLASSES:
        data["confusion"] = cm.tolist()
    else:  # C×C numbers in every epoch's event would be megabytes: the most confused pairs instead
        data["top_confusions"] = top_confusions(cm, names)
    if len(names) > MAX_PER_CLASS_SHOWN:  # thousands of classes: the ones that need attention, within the event cap
        worst = sorted(range(len(names)), key=per_class.__getitem__)[:MAX_PER_CLASS_SHOWN]
        data.update(
            per_class_acc=[round(per_class[i], 4) for i in worst],
            class_names=[names[i] for i in worst],
            classes_shown=f"the {len(worst)} classes with the lowest accuracy, of {len(names)}",
            **{k: [v[i] for i in worst] for k, v in scores.items()},
        )
    shortened = {k: n for k, n in zip(keys, names, strict=True) if k != CLASS_ACC_PREFIX + n}
    if shortened and len(names) <= 50:
        data["class_keys"] = shortened  # the full name of each shortened per-class key
    return data


def _save_checkpoints(t: Trainer, epoch: int, best: bool) -> None:
    """best.pt / last.pt, as the spec asks; only rank 0 writes (every rank builds the payload: it gathers
    the ranks' random states)."""
    ck = t.spec.checkpoint
    payload = _checkpoint_payload(t, epoch) if (ck.save_last or (ck.save_best and best)) else None
    if payload is None or not t.ranks.is_main:
        return
    # Metrics up to this step must be stored before the checkpoint that a resumed run starts from,
    # or a crash right after it would leave a gap no resume can fill. Sinks that buffer say so with flush();
    # one that cannot store everything in time reports it itself (the worker's sink marks the run degraded).
    flush = getattr(t.sink, "flush", None)
    if flush is not None:
        flush()
    if ck.save_best and best:
        save_checkpoint(t.out_dir / "checkpoints" / CHECKPOINT_FILES["best"], payload)
    if ck.save_last:
        save_checkpoint(t.out_dir / "checkpoints" / CHECKPOINT_FILES["last"], payload)


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
