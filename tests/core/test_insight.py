"""Error analysis of a real tiny run: the best epoch's gallery of confident mistakes, per-class
precision/recall/F1 in each evaluation event, and weight/gradient histograms on diagnostics steps."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from PIL import Image

from core.config import RunSpec
from core.events import MemorySink
from core.insight import log_histograms
from core.names import HIST_BINS, HIST_RANGE, HISTOGRAM_EVENT, MAX_MISCLASSIFIED, MISCLASSIFIED
from core.scores import scores_from_confusion
from core.train import run_training

DIGITS = {
    "data": {"name": "digits", "image_size": 8},
    "model": {"name": "simple_cnn", "hidden": 16},
    "train": {"epochs": 2, "batch_size": 64, "log_every": 5, "diag_every": 5},
    "export": {"formats": []},
    "device": "cpu",
    "seed": 0,
}


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory) -> tuple[MemorySink, Path]:
    torch.set_num_threads(1)
    out = tmp_path_factory.mktemp("run")
    sink = MemorySink()
    assert run_training(RunSpec.from_dict(DIGITS), out, sink)["status"] == "completed"
    return sink, out


def test_best_epochs_store_a_gallery_of_the_most_confident_mistakes(run):
    sink, out = run
    galleries = [a for a in sink.artifacts if a["kind"] == MISCLASSIFIED]
    best_epochs = {e["data"]["epoch"] for e in sink.events if e["kind"] == "evaluation"}
    assert galleries and {a["meta"]["epoch"] for a in galleries} <= best_epochs
    meta = galleries[-1]["meta"]
    items = meta["items"]
    assert 0 < len(items) <= MAX_MISCLASSIFIED
    assert all(i["true"] != i["predicted"] and 0 < i["confidence"] <= 1 for i in items)
    confidences = [i["confidence"] for i in items]
    assert confidences == sorted(confidences, reverse=True)
    names = [str(d) for d in range(10)]
    assert {i["true"] for i in items} <= set(names) and meta["top_confusions"][0][2] >= 1
    path = Path(galleries[-1]["path"])
    assert path.is_relative_to(out) and path.stat().st_size < 100_000  # a small PNG, not the dataset
    with Image.open(path) as im:
        rows = (len(items) + meta["cols"] - 1) // meta["cols"]
        assert im.size == (meta["cols"] * meta["cell"], rows * meta["cell"])


def test_evaluation_events_carry_per_class_precision_recall_and_f1(run):
    sink, _ = run
    data = [e for e in sink.events if e["kind"] == "evaluation"][-1]["data"]
    expected = scores_from_confusion(data["confusion"])
    for key in ("precision", "recall", "f1", "support"):
        assert data[key] == pytest.approx(expected[key], abs=1e-4), key
    assert data["recall"] == pytest.approx(data["per_class_acc"], abs=1e-4)  # per-class accuracy is recall
    assert sum(data["support"]) == sum(map(sum, data["confusion"]))


def test_histograms_every_diag_step_count_every_weight_and_gradient(run):
    sink, _ = run
    hist = [e for e in sink.events if e["kind"] == HISTOGRAM_EVENT]
    diag_steps = sorted(s for s, _, v in sink.metric_rows if "grad_norm/conv1" in v)
    assert [e["step"] for e in hist] == [e["data"]["step"] for e in hist] == diag_steps and diag_steps
    data = hist[-1]["data"]
    assert data["bins"] == HIST_BINS and data["range"] == list(HIST_RANGE)
    assert set(data["weight"]) == set(data["grad"]) >= {"conv1", "head"}
    parameters = next(e["data"]["parameters"] for e in sink.events if e["data"].get("code") == "model")
    assert sum(sum(c) for c in data["weight"].values()) == parameters  # every weight counted once
    assert sum(sum(c) for c in data["grad"].values()) == parameters  # all trainable here
    assert all(len(c) == HIST_BINS for c in (*data["weight"].values(), *data["grad"].values()))


def test_histogram_bands_keep_each_group_apart_and_clamp_the_ends():
    lo, hi = HIST_RANGE
    w = torch.nn.Parameter(torch.tensor([0.0, 10.0**lo, 10.0**hi, 1e9]))  # zero and beyond: the end bins
    w.grad = torch.full((4,), 1e-3)
    v = torch.nn.Parameter(torch.tensor([1.0]))
    rows, counts = log_histograms({"a": [w], "b": [v]})
    assert rows == [("weight", "a"), ("grad", "a"), ("weight", "b")]
    assert counts[0, 0] == 2 and counts[0, -1] == 2 and counts[0].sum() == 4
    bin_of = int((-3 - lo) / (hi - lo) * HIST_BINS)
    assert counts[1, bin_of] == 4 and counts[2, int((0 - lo) / (hi - lo) * HIST_BINS)] == 1
    assert counts.sum() == 9


def test_scores_from_a_confusion_matrix():
    s = scores_from_confusion([[5, 1, 0], [0, 6, 0], [1, 0, 4]])
    assert s["precision"] == pytest.approx([5 / 6, 6 / 7, 1.0], abs=1e-4)
    assert s["recall"] == pytest.approx([5 / 6, 1.0, 0.8], abs=1e-4)
    assert s["f1"][2] == pytest.approx(2 * 0.8 / 1.8, abs=1e-4) and s["support"] == [6, 6, 5]
    assert scores_from_confusion([[0, 0], [0, 0]])["f1"] == [0.0, 0.0]  # undefined is 0, never NaN
