"""The held-out test split's scores as the dashboard shows them: on the Run page beside the validation score (with
where the split came from, the weights scored, per-class scores and confusion), as a Runs column that sorts, in
Compare's summary beside validation, and beside a sweep winner's validation score."""

from __future__ import annotations

import pandas as pd
import pytest
from seeding import seed_run
from sweep_seeding import seed_sweep

from app.present import test_scores
from app.ui import compare_view, run_units
from db import repo
from db.types import EventInput, MetricPoint

NAMES = ["cat", "dog", "fox"]


def _tested(engine, run_id: str, acc: float, step: int = 30) -> None:
    """What core/test_scores.py stores at a run's end: the scores as metric points, the details as one event."""
    repo.append_metrics(
        engine,
        run_id,
        [
            MetricPoint("test/acc", step, acc, 3),
            MetricPoint("test/loss", step, 0.61, 3),
            MetricPoint("test/f1_macro", step, acc - 0.05, 3),
        ],
    )
    data = {
        "code": "test_scores",
        "scores": {"test/acc": acc, "test/loss": 0.61},
        "source": "official",
        "samples": 1000,
        "weights": {"checkpoint": "best", "epoch": 2},
        "class_names": NAMES,
        "precision": [0.9, 0.8, 0.7],
        "recall": [0.85, 0.75, 0.8],
        "f1": [0.874, 0.774, 0.747],
        "support": [400, 350, 250],
        "confusion": [[340, 40, 20], [50, 262, 38], [20, 30, 200]],
    }
    repo.append_events(engine, run_id, [EventInput("test", "info", "test split", code="test_scores", data=data)])


def test_the_run_page_shows_the_test_scores_beside_validation_with_their_source(page, engine):
    r = seed_run(engine, "tested", steps=30, epochs=3, val_acc=0.9)
    _tested(engine, r.id, 0.8123)
    at = page("run.py", id=r.id)
    assert not at.exception
    shown = {m.label: m.value for m in at.metric}
    assert shown["test accuracy"] == "0.8123" and shown["test loss"] == "0.6100" and shown["test F1"] == "0.7623"
    assert shown["best val accuracy"] == "0.9000"
    caption = next(c.value for c in at.caption if "1,000 samples" in c.value)
    assert "official test split" in caption and "best weights \\(epoch 2\\)" in caption
    assert "nothing that selects" in caption
    per_class = next(d.value for d in at.dataframe if "precision" in d.value.columns)
    assert list(per_class["class"]) == NAMES and list(per_class["support"]) == [400, 350, 250]


def test_a_finished_run_without_a_test_split_says_so_and_a_running_one_shows_nothing(page, engine):
    plain = seed_run(engine, "plain", steps=30, epochs=3)
    at = page("run.py", id=plain.id)
    assert not any(m.label == "test accuracy" for m in at.metric)
    assert any("No test scores" in c.value for c in at.caption)
    running = seed_run(engine, "running", status="running", steps=10, epochs=1)
    at = page("run.py", id=running.id)
    assert not any("No test scores" in c.value for c in at.caption)


def test_the_runs_table_has_a_test_acc_column_that_sorts(page, engine):
    low, high, none = (seed_run(engine, n, steps=30, epochs=3) for n in ("low", "high", "none"))
    _tested(engine, low.id, 0.61)
    _tested(engine, high.id, 0.93)
    at = page("runs.py")
    table = at.dataframe[0].value
    by_name = dict(zip(table["name"], table["test/acc"], strict=True))
    assert by_name["low"] == pytest.approx(0.61) and by_name["high"] == pytest.approx(0.93)
    assert pd.isna(by_name["none"])
    at.selectbox(key="runs.sort").set_value("test/acc").run()
    assert list(at.dataframe[0].value["name"]) == ["high", "low", "none"]  # runs without one last


def test_compare_shows_test_scores_beside_validation(engine):
    a, b = seed_run(engine, "a", steps=30, epochs=3, val_acc=0.9), seed_run(engine, "b", steps=30, epochs=3)
    _tested(engine, a.id, 0.8123)
    table = compare_view.summary_table([repo.get_run(engine, a.id), repo.get_run(engine, b.id)])
    row = table.set_index("run")
    assert row.loc["a", "best val/acc"] == pytest.approx(0.9) and row.loc["a", "test/acc"] == pytest.approx(0.8123)
    assert row.loc["a", "test/loss"] == pytest.approx(0.61) and pd.isna(row.loc["b", "test/acc"])
    columns = list(table.columns)
    assert columns.index("test/acc") == columns.index("lowest val/loss") + 1


def test_a_sweep_winner_shows_its_test_score_beside_its_validation_score(page, engine):
    played = seed_sweep(engine)
    runs = {r.trial: r for r in repo.sweep_runs(engine, played.sweep_id)}
    _tested(engine, runs[2].id, 0.9321)  # the winner (val/acc 0.95)
    _tested(engine, runs[0].id, 0.99)  # a better test score never makes trial 0 the winner
    sweep = repo.get_sweep(engine, played.sweep_id)
    assert run_units.sweep_best(sweep, repo.sweep_runs(engine, played.sweep_id)) == (
        "val/acc 0.9500 · test/acc 0.9321 · trial 2"
    )
    at = page("sweep.py", id=played.sweep_id)
    assert any("Best so far: trial #2" in m.value for m in at.markdown)
    assert any("Held-out test/acc 0.9321" in m.value and "validation split alone" in m.value for m in at.markdown)


def test_source_text_names_the_split_and_the_weights():
    data = {"source": "fraction", "samples": 1234, "weights": {"checkpoint": "last", "epoch": 9}}
    assert test_scores.source_text(data) == (
        "1,234 samples from a stratified, seeded fraction held out before validation, with the last weights (epoch 9)"
    )
    assert test_scores.source_text(None) == ""
