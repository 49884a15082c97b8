"""val/f1_macro, added as one measurement in core/evaluation.evaluate and one catalog entry: it is scikit-learn's
macro F1, it is in the epoch's metrics when they are sent, and early stopping and the best checkpoint follow it
(higher is better) when it is the monitor."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from sklearn.metrics import f1_score

from core.checkpoint import load_checkpoint
from core.config import RunSpec
from core.events import MemorySink
from core.scores import macro_f1
from core.train import run_training
from tests.core.test_loop import TINY


@pytest.fixture(autouse=True)
def _one_thread():
    torch.set_num_threads(1)


@pytest.mark.parametrize("seed", range(5))
def test_macro_f1_is_scikit_learns(seed):
    rng = np.random.default_rng(seed)
    truth = rng.integers(0, 5, 60)  # class 5 never occurs, class 4 is never predicted
    pred = np.where(rng.random(60) < 0.6, truth, rng.integers(0, 6, 60))
    pred[pred == 4] = 0
    cm = np.zeros((6, 6), dtype=int)
    np.add.at(cm, (truth, pred), 1)
    ours = macro_f1(np.diag(cm).tolist(), cm.sum(1).tolist(), cm.sum(0).tolist())
    assert ours == pytest.approx(f1_score(truth, pred, average="macro", zero_division=0.0))


def test_a_run_monitoring_val_f1_macro_stops_and_keeps_the_best_by_it(tmp_path):
    spec = RunSpec.from_dict(
        TINY,
        [
            "train.epochs=6",
            "train.early_stopping.monitor=val/f1_macro",
            "train.early_stopping.patience=1",
            "optim.lr=0.03",
        ],
    )
    assert spec.train.early_stopping.resolved_mode == "max"
    sink = MemorySink()
    summary = run_training(spec, tmp_path, sink)
    assert summary["status"] == "early_stopped", summary["error"]
    epochs = [values for _, _, values in sink.metric_rows if "val/loss" in values]
    evaluations = [e["data"] for e in sink.events if e["data"].get("code") == "evaluation"]
    assert len(epochs) == len(evaluations) == summary["epochs_run"]
    for values, evaluation in zip(epochs, evaluations, strict=True):
        # sent with the epoch's other metrics, and the same figure the evaluation event's per-class F1 gives
        assert values["val/f1_macro"] == pytest.approx(sum(evaluation["f1"]) / len(evaluation["f1"]), abs=1e-3)
    f1 = [values["val/f1_macro"] for values in epochs]
    best = max(range(len(f1)), key=lambda i: (f1[i], -i))  # the first epoch reaching the highest F1
    assert summary["best"] == {"metric": "val/f1_macro", "value": f1[best], "epoch": best + 1}
    assert best > 0 and f1[0] < f1[best]  # it rose: the best is later than epoch 1, as only "higher is better" finds
    assert load_checkpoint(tmp_path / "checkpoints" / "best.pt")["epoch"] == best + 1
    assert summary["epochs_run"] == best + 2  # patience 1: one epoch without a better F1, then it stopped
