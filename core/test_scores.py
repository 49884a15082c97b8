"""The held-out test split, scored once at the end of a run (core/train.py's `_finish`) with the weights the export
uses (export.checkpoint: best or last), after everything that selects (early stopping, the best checkpoint, a sweep's
objective, pruning) is done with the validation split.

Stored as records of their own: the scores test/loss, test/acc, test/acc_top5 (more than 5 classes) and
test/f1_macro as metric points at the run's last step, and a `test` event with the per-class precision, recall, F1
and support and the confusion matrix. The scores are also written into last.pt before they are sent: a resumed
attempt (a crash during the export, a lost host) finds them there and sends the same records again, which the
store keeps once, instead of scoring the test split a second time. On several GPUs only rank 0 gets here, after
the other ranks have left: it scores the whole split alone, on its own device.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from core.batches import make_batches
from core.checkpoint import load_checkpoint, save_checkpoint
from core.data import Preprocess
from core.insight import confusion_scores, top_confusions
from core.names import (
    CHECKPOINT_FILES,
    MAX_CONFUSION_CLASSES,
    TEST_ACC,
    TEST_ACC_TOP5,
    TEST_EVENT,
    TEST_F1_MACRO,
    TEST_LOSS,
)
from core.scores import macro_f1
from core.trainer import Trainer, prepare

RECORD = "test_scores"  # last.pt's key holding the scores once they are measured
SOURCES = {
    "official": "the dataset's official test split",
    "folder": "the test/ folder",
    "fraction": "a stratified fraction held out",
    "path": "data.test_path",
}


@torch.inference_mode()
def measure(t: Trainer) -> tuple[dict[str, float], torch.Tensor]:
    """The test split's scores and (true × predicted) confusion matrix for the model as it is now."""
    model, data, c = t.model, t.data, t.data.info.num_classes
    model.eval()
    batches = make_batches(data.test, max(t.spec.train.batch_size, 256), False, t.device, t.spec.seed, t.spec.loader)
    pre = Preprocess(data.info, None, t.device)
    loss_sum, n = torch.zeros((), device=t.device, dtype=torch.float64), 0
    top5 = torch.zeros((), device=t.device, dtype=torch.long)
    confusion = torch.zeros(c * c, device=t.device, dtype=torch.long)
    crit = nn.CrossEntropyLoss(reduction="sum")
    for x, y in batches:
        with t.amp.autocast():
            logits = model(prepare(pre, x)).float()
        loss_sum += crit(logits, y).double()
        confusion += torch.bincount(y * c + logits.argmax(1), minlength=c * c)
        if c > 5:
            top5 += (logits.topk(5, dim=1).indices == y[:, None]).any(1).sum()
        n += len(y)
    cm = confusion.view(c, c).cpu()
    scores = {
        TEST_LOSS: loss_sum.item() / max(n, 1),
        TEST_ACC: float(cm.diag().sum()) / max(n, 1),
        TEST_F1_MACRO: macro_f1(cm.diag().tolist(), cm.sum(1).tolist(), cm.sum(0).tolist()),
    }
    if c > 5:
        scores[TEST_ACC_TOP5] = top5.item() / max(n, 1)
    return scores, cm


def details(t: Trainer, scores: dict[str, float], cm: torch.Tensor, weights: dict[str, Any]) -> dict[str, Any]:
    """The test event's data: the scores, where the split came from, the weights scored, and per class the
    precision, recall, F1 and support with the confusion matrix (or, for many classes, its most confused pairs)."""
    info = t.data.info
    data: dict[str, Any] = {
        "code": "test_scores",
        "scores": scores,
        "source": info.test_source,
        "samples": info.num_test,
        "weights": weights,
        "class_names": info.class_names,
        **confusion_scores(cm),
    }
    if info.num_classes <= MAX_CONFUSION_CLASSES:
        data["confusion"] = cm.tolist()
    else:
        data["top_confusions"] = top_confusions(cm, info.class_names)
    return data


def score_test(t: Trainer, weights: dict[str, Any]) -> dict[str, float] | None:
    """Score the test split once with the model's current weights (those `weights` names) and send its records;
    a run whose last.pt already holds them sends those instead. None when the run has no test split."""
    if t.data.test is None or not len(t.data.test):
        return None
    last = t.out_dir / "checkpoints" / CHECKPOINT_FILES["last"]
    ck = load_checkpoint(last) if last.is_file() else None
    record = (ck or {}).get(RECORD)
    if record is None:
        scores, cm = measure(t)
        record = {"step": t.global_step, "epoch": t.epoch, "scores": scores, "data": details(t, scores, cm, weights)}
        if ck is not None:  # the one file a resumed attempt starts from: it then never scores the split again
            save_checkpoint(last, {**ck, RECORD: record})
    _send(t, record)
    return dict(record["scores"])


def _send(t: Trainer, record: dict[str, Any]) -> None:
    scores, data = record["scores"], record["data"]
    t.sink.metrics(record["step"], record["epoch"], scores)
    w = data.get("weights") or {}
    t.sink.event(
        TEST_EVENT,
        "info",
        f"test split ({data['samples']} samples, {SOURCES.get(data['source'], data['source'])}): "
        f"test/acc {scores[TEST_ACC]:.4f}, test/loss {scores[TEST_LOSS]:.4f}"
        + (f", with the {w['checkpoint']} weights (epoch {w['epoch']})" if w.get("checkpoint") else ""),
        data,
        step=record["step"],
    )
