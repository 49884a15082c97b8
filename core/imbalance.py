"""Unbalanced classes, found at load: the training split's class counts (DataInfo.class_counts) and the
`class_imbalance` finding the pre-flight emits (core/train.py) when the largest class has at least
IMBALANCE_RATIO times the samples of the smallest, or a class has none. Torch-free."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

# Largest / smallest training class at or above this: the warning. At 3× a model that neglects the rare class
# already loses little accuracy doing so, and val/acc stops telling the classes apart.
IMBALANCE_RATIO = 3.0
MAX_NAMED = 10  # the rare classes a message names (the event's data lists up to 50)


def imbalance(class_names: Sequence[str], counts: Sequence[int], ratio: float = IMBALANCE_RATIO) -> dict[str, Any]:
    """{} for a split whose largest class has fewer than `ratio` × the samples of its smallest; else the
    finding's data: `largest` and `smallest` ([name, count]), their `ratio` (None when the smallest has no
    sample), the `rare_classes` (those with fewer than largest / ratio samples, rarest first) and `threshold`."""
    if len(counts) < 2 or len(counts) != len(class_names):
        return {}
    hi, lo = max(range(len(counts)), key=counts.__getitem__), min(range(len(counts)), key=counts.__getitem__)
    if counts[hi] < ratio * counts[lo] or counts[hi] == 0:
        return {}
    rare = sorted((i for i, n in enumerate(counts) if n * ratio < counts[hi]), key=counts.__getitem__)
    return {
        "largest": [class_names[hi], int(counts[hi])],
        "smallest": [class_names[lo], int(counts[lo])],
        "ratio": round(counts[hi] / counts[lo], 2) if counts[lo] else None,
        "rare_classes": [[class_names[i], int(counts[i])] for i in rare[:50]],
        "threshold": ratio,
    }


def imbalance_message(found: dict[str, Any], correction: str | None) -> str:
    """The finding in words, naming the classes; `correction`: what the run already does about it."""
    (big, n_big), (small, n_small) = found["largest"], found["smallest"]
    if found["ratio"] is None:
        head = f"unbalanced classes: {small!r} has no training samples ({big!r} has {n_big})"
    else:
        head = f"unbalanced classes: {big!r} has {n_big} training samples, {small!r} {n_small} ({found['ratio']:g}×)"
    rare = found["rare_classes"]
    if len(rare) > 1:
        shown = ", ".join(f"{name!r} ({n})" for name, n in rare[:MAX_NAMED])
        head += f"; {len(rare)} classes have under 1/{found['threshold']:g} of its samples: {shown}"
        head += "…" if len(rare) > MAX_NAMED else ""
    if correction:
        return f"{head}; this run uses {correction}"
    return f"{head}: consider train.class_weights or train.sampler=balanced, and val/balanced_acc or val/f1_macro"


def correction(class_weights: str, sampler: str) -> str | None:
    """What a run does about unbalanced classes, in the spec's words, or None."""
    if sampler == "balanced":
        return "train.sampler=balanced"
    return f"train.class_weights={class_weights}" if class_weights != "none" else None


def warn_if_unbalanced(diagnoser: Any, class_names: Sequence[str], counts: Sequence[int], train: Any) -> None:
    """The pre-flight's `class_imbalance` finding (core/diagnosis.py's Diagnoser, at step 0): a warning, or
    information only when the run already weights its loss or balances its sampler (train: the TrainSpec)."""
    found = imbalance(class_names, counts)
    if not found:
        return
    fix = correction(train.class_weights, train.sampler)
    level = "info" if fix else "warning"
    diagnoser.emit("class_imbalance", level, imbalance_message(found, fix), at_step=0, **found)
