"""The end of an epoch: evaluation on the validation split, the epoch's metrics and evaluation event, early
stopping's verdict, the mistakes gallery of a new best epoch, and the checkpoints (core/engine.py's fit calls
`end_epoch` after each epoch's training)."""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from core import catalog
from core.checkpoint import rng_state, save_checkpoint
from core.ema import evaluate_ema, export_weights, pick
from core.insight import Mistakes, confusion_scores, store_gallery, top_confusions
from core.names import (
    CHECKPOINT_FILES,
    CLASS_ACC_PREFIX,
    EPOCH_TIME,
    LR_EPOCH,
    MAX_CONFUSION_CLASSES,
    MAX_PER_CLASS_SHOWN,
    PEAK_MEMORY,
    VAL_ACC,
    VAL_ACC_TOP5,
    VAL_BALANCED_ACC,
    VAL_F1_MACRO,
    VAL_LOSS,
    class_acc_key,
)
from core.scores import balanced_accuracy, macro_f1
from core.trainer import Trainer, prepare


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
        VAL_BALANCED_ACC: balanced_accuracy(cm.diag().tolist(), cm.sum(1).tolist()),
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
        **({"ema": t.ema.state_dict()} if t.ema is not None else {}),
        **t.ranks.rng_extra(),
    }


def end_epoch(t: Trainer, epoch: int, train_m: dict[str, float], seconds: float) -> str | None:
    """Validate, log, checkpoint, decide. Returns a final status when training must end."""
    mistakes = Mistakes(t.device)
    val_m, cm = evaluate(t, mistakes)
    ema_m, ema_eval = evaluate_ema(t, evaluate)  # the EMA of the weights (train.ema), when kept
    m = {
        **train_m,
        **val_m,
        **ema_m,
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
    trained = m[catalog.stored_key(monitor)]  # train/loss per epoch is train/epoch_loss
    value, (mistakes, cm) = pick(t, trained, ema_m, (mistakes, cm), ema_eval)  # the EMA's when it scores better
    best = t.early.update(value, epoch)
    if best and t.ranks.is_main:  # the epoch the best checkpoint holds: its most confident mistakes
        store_gallery(t.sink, t.data.val, names, mistakes, cm, epoch, t.out_dir)
    t.schedule.step_epoch(trained)  # plateau follows the weights being trained, not an EMA that hides their stall
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
        # best.pt holds the weights that epoch counts for: the EMA's when they scored better (core/ema.py)
        best_payload = {**payload, "model": export_weights(payload)}
        save_checkpoint(t.out_dir / "checkpoints" / CHECKPOINT_FILES["best"], best_payload)
    if ck.save_last:
        save_checkpoint(t.out_dir / "checkpoints" / CHECKPOINT_FILES["last"], payload)
