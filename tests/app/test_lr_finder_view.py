"""The Run page: val/balanced_acc on the Accuracy chart, and the LR range test (the curve of the pre-flight's
`lr_finder` event on a log axis with the suggested and the used learning rate, under the charts; nothing for a
run that did not ask for the test)."""

from __future__ import annotations

import pytest
from seeding import plotly_figures, seed_run

from db import repo
from db.types import EventInput, MetricPoint

TITLE = "LR range test: loss by learning rate"
CURVE = {
    "code": "lr_finder",
    "lrs": [1e-5, 1e-4, 1e-3, 1e-2, 1e-1],
    "losses": [1.1, 1.0, 0.6, 0.4, "inf"],  # a non-finite loss is stored as a string
    "smoothed": [1.1, 1.05, 0.8, 0.5, 2.5],
    "suggested_lr": 1e-3,
    "min_loss_lr": 1e-2,
    "steepest_lr": 1e-3,
    "method": "a tenth of the learning rate at the smoothed loss's minimum",
    "stopped": "diverged",
    "optim_lr": 0.1,
}


def _finder_run(engine, data: dict | None):
    r = seed_run(engine, "lr", steps=10, epochs=1, spec={"train": {"lr_finder": {"enabled": True}}})
    if data is not None:
        repo.append_events(
            engine, r.id, [EventInput("preflight", "info", "LR range test: …", code="lr_finder", data=data)]
        )
    return r


def test_the_curve_and_the_suggestion_are_shown_under_the_charts(page, engine):
    r = _finder_run(engine, CURVE)
    at = page("run.py", id=r.id)
    assert not at.exception
    fig = plotly_figures(at)[TITLE]
    assert fig["layout"]["xaxis"]["type"] == "log"
    traces = {t["name"]: t for t in fig["data"]}
    assert traces["loss"]["x"] == CURVE["lrs"] and traces["loss"]["y"][-1] is None
    assert traces["smoothed loss"]["y"] == CURVE["smoothed"]
    marks = [a["text"] for a in fig["layout"]["annotations"]]
    assert marks == ["suggested 0.001", "this run 0.1"]
    caption = " ".join(c.value for c in at.caption).replace("\\", "")  # Markdown escapes aside
    assert "Suggested optim.lr 0.001 (a tenth of the learning rate" in caption and "this run used 0.1" in caption


def test_no_suggestion_says_so_and_a_pending_test_waits(page, engine):
    r = _finder_run(engine, {**CURVE, "suggested_lr": None, "stopped": None})
    caption = " ".join(c.value for c in page("run.py", id=r.id).caption)
    assert "No learning rate suggested" in caption
    pending = _finder_run(engine, None)
    at = page("run.py", id=pending.id)
    assert TITLE not in plotly_figures(at)
    assert any("its curve appears here once it has finished" in c.value for c in at.caption)


def test_a_run_without_the_test_shows_nothing_of_it(page, engine):
    r = seed_run(engine, "plain", steps=10, epochs=1)
    at = page("run.py", id=r.id)
    assert TITLE not in plotly_figures(at)
    assert not any("LR range test" in e.label for e in at.expander)


def test_val_balanced_acc_is_drawn_per_epoch_on_the_accuracy_chart(page, engine):
    r = seed_run(engine, "balanced", status="running", steps=30, epochs=3)
    repo.append_metrics(engine, r.id, [MetricPoint("val/balanced_acc", e * 10, 0.25 * e, e) for e in (1, 2, 3)])
    fig = plotly_figures(page("run.py", id=r.id))["Accuracy"]
    trace = next(t for t in fig["data"] if t.get("name") == "val/balanced_acc")
    assert trace["x"] == [10, 20, 30] and trace["y"] == pytest.approx([0.25, 0.5, 0.75])
    assert trace["mode"] == "lines+markers"  # a per-epoch figure
