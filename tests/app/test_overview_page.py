"""Overview: everyone's running and recently finished runs with owner, progress, objective and small curves,
diagnosis findings at a glance, the queue with positions and who can take each run, refreshed in place."""

from __future__ import annotations

from datetime import timedelta

import pandas as pd
import pytest
import streamlit as st
from seeding import seed_run
from sqlalchemy import event, update

from app.present.text import md_text
from app.ui import overview_view
from db import repo
from db.engine import connection_scope
from db.models import Run
from db.types import EventInput, MetricPoint, utcnow

ACC = {"epochs": 3, "early_stopping": {"monitor": "val/acc"}}


def _table(at, first_column_values: set[str]):
    """The dataframe whose `run` column holds these names."""
    for df in at.dataframe:
        value = df.value
        if "run" in value and first_column_values <= set(value["run"]):
            return value
    raise AssertionError(f"no table lists {first_column_values}")


def _open(page):
    st.cache_data.clear()
    return page("overview.py")


def test_running_runs_show_owner_progress_objective_curves_and_a_warning(page, engine):
    repo.upsert_account(engine, "iss#ana", "Ana", "ana@example.org")
    a = seed_run(
        engine, "resnet-a", status="running", steps=300, epochs=3, owner="iss#ana", spec={"train": ACC}, val_acc=0.9
    )
    b = seed_run(engine, "vgg-b", status="running", steps=20, epochs=1, owner="bo")
    repo.append_events(
        engine,
        b.id,
        [EventInput("diagnosis", "warning", "validation loss rises while training loss falls", code="overfitting")],
    )
    at = _open(page)
    assert not at.exception
    assert at.title[0].value == "Overview"
    runs = _table(at, {"resnet-a", "vgg-b"}).set_index("run")
    assert runs.loc["resnet-a", "owner"] == "Ana (ana@example.org)" and runs.loc["vgg-b", "owner"] == "bo"
    assert runs.loc["resnet-a", "progress"] == pytest.approx(0.5)
    assert runs.loc["resnet-a", "worker"] == "w1" and runs.loc["resnet-a", "device"] == "cpu"
    assert runs.loc["resnet-a", "objective"] == "val/acc" and runs.loc["resnet-a", "value"] == pytest.approx(0.9)
    assert runs.loc["vgg-b", "objective"] == "val/loss" and runs.loc["vgg-b", "best"] == pytest.approx(1.0)
    loss = list(runs.loc["resnet-a", "loss"])
    assert 10 <= len(loss) <= 80 and loss[0] > loss[-1]  # the whole run, small
    assert list(runs.loc["resnet-a", "objective curve"]) == pytest.approx([0.3, 0.6, 0.9])
    assert runs.loc["vgg-b", "diagnosis"] == "⚠ overfitting" and runs.loc["resnet-a", "diagnosis"] == ""
    assert any("vgg-b" in w.value and "overfitting" in w.value for w in at.warning)  # at a glance, at the top
    assert any(m.label == "Running" and m.value == "2" for m in at.metric)
    assert any(m.label == "Needing attention" and m.value == "1" for m in at.metric)
    assert set(runs["open"]) == {f"run?id={a.id}", f"run?id={b.id}"}


def test_queued_runs_show_their_position_and_who_can_take_them(page, engine):
    first = seed_run(engine, "gpu-1", status="queued")
    seed_run(engine, "gpu-2", status="queued")
    seed_run(engine, "cpu-1", status="queued", spec={"device": "cpu"})
    at = _open(page)
    queued = _table(at, {"gpu-1", "gpu-2", "cpu-1"}).set_index("run")
    assert (queued.loc["gpu-1", "position"], queued.loc["gpu-2", "position"], queued.loc["cpu-1", "position"]) == (
        1,
        2,
        1,
    )
    assert queued.loc["gpu-2", "who can take it"] == "no live worker serves the 'gpu' queue"
    assert queued.loc["cpu-1", "queue"] == "cpu"
    assert any("No live worker serves the 'gpu' queue" in w.value for w in at.warning)
    assert queued.loc["gpu-1", "open"] == f"run?id={first.id}"
    repo.upsert_worker(engine, "cpu-worker", hostname="box", queues=["cpu"])
    at = _open(page)
    queued = _table(at, {"cpu-1"}).set_index("run")
    assert queued.loc["cpu-1", "who can take it"] == "cpu-worker"
    assert not any("'cpu' queue" in w.value for w in at.warning)
    assert any(m.label == "Queued" and m.value == "3" for m in at.metric)


def test_recently_finished_runs_show_within_the_window_and_older_ones_do_not(page, engine):
    seed_run(engine, "fresh", steps=20, epochs=2, val_acc=0.95)
    old = seed_run(engine, "old", steps=20, epochs=2)
    with connection_scope(engine, write=True) as conn:
        conn.execute(update(Run).where(Run.id == old.id).values(finished_at=utcnow() - timedelta(days=2)))
    at = _open(page)
    done = _table(at, {"fresh"}).set_index("run")
    assert "old" not in done.index
    assert done.loc["fresh", "status"] == "completed" and done.loc["fresh", "value"] == pytest.approx(0.5)
    assert done.loc["fresh", "finished"].endswith("ago")
    assert any(m.label == "Finished in 24 hours" and m.value == "1" for m in at.metric)
    at.selectbox(key="overview.window").set_value("7 days").run()
    assert {"fresh", "old"} <= set(_table(at, {"fresh"})["run"])
    assert any(c.value == "Nothing is running." for c in at.caption)


def test_the_live_part_is_a_fragment_that_shows_new_progress(page, engine, monkeypatch):
    asked = []
    real = st.fragment

    def spy(func=None, *, run_every=None):
        asked.append((getattr(func, "__name__", None), run_every))
        return real(func, run_every=run_every)

    monkeypatch.setattr(st, "fragment", spy)
    r = seed_run(engine, "live", status="running", steps=10, epochs=1)
    at = _open(page)
    assert ("live", overview_view.REFRESH_S) in asked and overview_view.REFRESH_S > 0
    assert _table(at, {"live"})["progress"].iloc[0] == pytest.approx(0.5)
    repo.heartbeat(engine, r.id, worker_id="w1", progress=0.75)
    repo.append_metrics(engine, r.id, [MetricPoint("train/loss", 11, 0.01)])
    st.cache_data.clear()
    at.run()
    row = _table(at, {"live"}).iloc[0]
    assert row["progress"] == pytest.approx(0.75) and list(row["loss"])[-1] == pytest.approx(0.01)


def test_names_and_messages_are_shown_as_text(page, engine):
    r = seed_run(engine, "**bold** [x](http://e.org)", status="running", steps=5)
    repo.append_events(engine, r.id, [EventInput("diagnosis", "error", "<b>nan</b> :material/home:", code="nonfinite")])
    at = _open(page)
    shown = next(e.value for e in at.error if "nonfinite" in e.value)
    assert md_text(r.name) in shown and md_text("<b>nan</b> :material/home:") in shown
    assert _table(at, {r.name})["diagnosis"].iloc[0] == "⛔ nonfinite"


def test_a_refresh_costs_the_same_queries_for_two_runs_as_for_twelve(home, engine):
    def selects() -> int:
        seen = []
        listener = lambda *a: seen.append(a[2]) if a[2].lstrip().upper().startswith("SELECT") else None  # noqa: E731
        event.listen(engine, "before_cursor_execute", listener)
        snap = overview_view.load(engine, 3600)
        event.remove(engine, "before_cursor_execute", listener)
        return len(seen), snap

    for i in range(2):
        seed_run(engine, f"a{i}", status="running", steps=40, epochs=2)
    seed_run(engine, "q0", status="queued")
    few, snap = selects()
    assert len(snap.running) == 2
    for i in range(10):
        r = seed_run(engine, f"b{i}", status="running", steps=40, epochs=2)
        repo.append_events(engine, r.id, [EventInput("diagnosis", "warning", "slow", code="data_bottleneck")])
    seed_run(engine, "q1", status="queued", spec={"device": "cpu"})
    many, snap = selects()
    assert len(snap.running) == 12 and len(snap.attention) == 10
    assert many <= few + 1  # one more queue to ask about its workers, nothing per run


def _element(at, first_column_values: set[str]):
    """The st.dataframe element whose `run` column holds these names."""
    return next(df for df in at.dataframe if "run" in df.value and first_column_values <= set(df.value["run"]))


def test_a_run_without_a_validation_point_yet_shows_a_dash_not_none(page, engine):
    seed_run(engine, "just-started", status="running", steps=5)  # training steps, no epoch ended yet
    at = _open(page)
    shown = _element(at, {"just-started"})
    row = shown.value.set_index("run").loc["just-started"]
    assert row["objective"] == "val/loss" and pd.isna(row["value"]) and pd.isna(row["best"])
    assert shown.proto.placeholder == "–"  # what the table draws for them (Streamlit's default: "None")


def test_a_train_loss_objective_reads_its_per_epoch_value_not_the_per_step_series(page, engine):
    r = seed_run(
        engine,
        "by-train-loss",
        status="running",
        spec={"train": {"epochs": 3, "early_stopping": {"monitor": "train/loss"}}},
    )
    repo.append_metrics(
        engine,
        r.id,
        [MetricPoint("train/loss", s, v, 1) for s, v in ((1, 9.0), (2, 0.01), (3, 5.0))]
        + [MetricPoint("train/epoch_loss", 3, 2.0, 1), MetricPoint("train/epoch_loss", 6, 1.5, 2)],
    )
    row = _table(_open(page), {"by-train-loss"}).set_index("run").loc["by-train-loss"]
    assert row["objective"] == "train/loss"
    assert row["value"] == pytest.approx(1.5) and row["best"] == pytest.approx(1.5)  # epochs' means, not 5.0 / 0.01
    assert list(row["objective curve"]) == pytest.approx([2.0, 1.5])
