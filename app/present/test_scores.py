"""What the pages show of a run's held-out test split (core/test_scores.py stores it once, at the end of the run):
its scores read from the stored metrics, where the split came from, and its per-class table. Plain functions, no
Streamlit: the Run page, the Runs table, Compare and the Sweep page all read them."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import pandas as pd

from app.present.seed_groups import mean_std_text
from core.names import TEST_ACC, TEST_ACC_TOP5, TEST_F1_MACRO, TEST_LOSS
from db.types import RunRecord

SCORES = (TEST_ACC, TEST_LOSS, TEST_ACC_TOP5, TEST_F1_MACRO)  # in the order the Run page shows them
SOURCES = {
    "official": "the dataset's official test split",
    "folder": "the folder's test/ sub-folder",
    "fraction": "a stratified, seeded fraction held out before validation",
    "path": "another folder with the same classes (data.test_path)",
}
NEVER_SELECTED = (
    "Scored once, at the end of the run, with the weights the export uses; nothing that selects (early "
    "stopping, the best checkpoint, a sweep's objective, pruning) ever saw it."
)


def value(r: RunRecord, key: str = TEST_ACC) -> float | None:
    """The run's stored test score `key`, or None (no test split, or the run has not ended)."""
    s = r.metrics.get(key)
    return None if s is None else s.last_value


def scores(r: RunRecord) -> dict[str, float]:
    """The run's test scores that are stored, in SCORES' order."""
    return {k: v for k in SCORES if (v := value(r, k)) is not None}


def source_text(data: Mapping[str, Any] | None) -> str:
    """`1,000 samples from the dataset's official test split, with the best weights (epoch 7)`."""
    if not data:
        return ""
    where = SOURCES.get(str(data.get("source")), str(data.get("source") or "a test split"))
    text = f"{int(data.get('samples') or 0):,} samples from {where}"
    w = data.get("weights") or {}
    if w.get("checkpoint"):
        text += f", with the {w['checkpoint']} weights" + (f" (epoch {w['epoch']})" if w.get("epoch") else "")
    return text


def no_test_text(spec: Mapping[str, Any]) -> str:
    """Why a finished run shows no test scores."""
    data = spec.get("data") or {}
    if data.get("test_split") == "none":
        return "No test split: data.test_split is none."
    return (
        "No test scores: this run has no held-out test split (digits and synthetic hold one out only with "
        "data.test_fraction), or it did not complete."
    )


def class_frame(data: Mapping[str, Any]) -> pd.DataFrame:
    """One row per class: precision, recall, F1 and support on the test split."""
    names = list(data.get("class_names") or [])
    cols = {k: list(data.get(k) or []) for k in ("precision", "recall", "f1", "support")}
    n = min([len(names), *(len(v) for v in cols.values())]) if names else 0
    return pd.DataFrame({"class": names[:n], **{k: v[:n] for k, v in cols.items()}})


def mean_of(runs: Sequence[RunRecord], key: str = TEST_ACC) -> list[float | None]:
    """Each run's test score `key` (None where it has none): a seed group's or a sweep trial's, for mean ± std."""
    return [value(r, key) for r in runs]


def beside_winner(runs: Sequence[RunRecord]) -> str:
    """The held-out test accuracy of a sweep's winning trial (mean ± std over its seeds), as Markdown beside its
    validation score; "" when its runs have none."""
    tested = [v for v in mean_of(runs) if v is not None]
    if not tested:
        return ""
    return (
        f"Held-out {TEST_ACC} {mean_std_text(tested)}: scored once at the end of each run; the winner was chosen "
        "on the validation split alone."
    )
