"""db.overview: the latest diagnosis finding of many runs, and their small curves, in a few queries."""

from __future__ import annotations

import math

from sqlalchemy import event

from db import overview, repo
from db.types import EventInput, MetricPoint

SPEC = {"data": {"name": "digits"}, "train": {"epochs": 2}}


def _run(engine, name: str) -> str:
    r = repo.create_run(engine, SPEC, name=name, owner="ana")
    repo.claim_run(engine, r.id, "w1", device="cpu")
    return r.id


def _count_queries(engine) -> list[str]:
    seen: list[str] = []
    event.listen(
        engine,
        "before_cursor_execute",
        lambda *a: seen.append(a[2]) if a[2].lstrip().upper().startswith("SELECT") else None,
    )
    return seen


def test_findings_give_each_runs_latest_warning_or_error_and_their_count(engine):
    a, b, c = _run(engine, "a"), _run(engine, "b"), _run(engine, "c")
    repo.append_events(
        engine,
        a,
        [
            EventInput("diagnosis", "warning", "loss is not decreasing", code="loss_not_decreasing"),
            EventInput("diagnosis", "error", "loss became nan", code="nonfinite_loss"),
            EventInput("diagnosis", "info", "all good again"),  # not a finding
            EventInput("lifecycle", "error", "worker lost"),  # not a diagnosis
        ],
    )
    repo.append_events(engine, b, [EventInput("diagnosis", "warning", "overfitting", code="overfitting")])
    repo.append_events(engine, c, [EventInput("evaluation", "info", "epoch 1")])
    queries = _count_queries(engine)
    found = overview.findings(engine, [a, b, c, "nope"])
    assert len(queries) == 1
    assert set(found) == {a, b}
    assert (found[a].latest.code, found[a].latest.level, found[a].count) == ("nonfinite_loss", "error", 2)
    assert (found[b].latest.message, found[b].count) == ("overfitting", 1)
    assert overview.findings(engine, []) == {}


def test_curves_are_small_whatever_the_series_length_and_cost_two_queries(engine):
    long, short = _run(engine, "long"), _run(engine, "short")
    repo.append_metrics(
        engine,
        long,
        [MetricPoint("train/loss", s, 2.0 / s) for s in range(1, 5001)]
        + [MetricPoint("val/acc", s * 250, s / 20) for s in range(1, 21)],
    )
    repo.append_metrics(
        engine,
        short,
        [MetricPoint("train/loss", s, float(s)) for s in range(1, 11)]
        + [MetricPoint("train/loss", 11, math.nan)]
        + [MetricPoint("val/loss", s, 1.0) for s in range(1, 201)],
    )
    queries = _count_queries(engine)
    got = overview.curves(
        engine,
        [
            (long, "train/loss"),
            (long, "val/acc"),
            (short, "train/loss"),
            (short, "val/loss"),
            (short, "val/acc"),
            ("nope", "train/loss"),
        ],
        points=64,
    )
    assert len(queries) == 2
    assert set(got) == {(long, "train/loss"), (long, "val/acc"), (short, "train/loss"), (short, "val/loss")}
    assert got[(short, "train/loss")] == [float(s) for s in range(1, 11)]  # raw, the NaN left out
    assert got[(long, "val/acc")] == [s / 20 for s in range(1, 21)]
    loss = got[(long, "train/loss")]
    assert 32 <= len(loss) <= 64 and loss == sorted(loss, reverse=True)  # the whole run, in step order
    assert loss[-1] == 2.0 / 5000
    assert len(got[(short, "val/loss")]) <= 65  # 200 raw points thinned


def test_curve_level_fits_the_points_asked_for():
    assert overview.curve_level(10, 64) == 4
    assert overview.curve_level(5000, 64) == 7  # 5000 >> 7 = 39 buckets; level 6 would have 79
    assert overview.curve_level(2**40, 64) == 24


def test_many_series_are_read_in_chunks(engine, monkeypatch):
    monkeypatch.setattr(overview, "_CHUNK", 100)
    ids = [_run(engine, f"r{i}") for i in range(3)]
    for run_id in ids:
        repo.append_metrics(engine, run_id, [MetricPoint("train/loss", s, 1.0) for s in range(1, 4)])
    wanted = [(run_id, f"k{j}") for run_id in ids for j in range(150)] + [(run_id, "train/loss") for run_id in ids]
    got = overview.curves(engine, wanted)
    assert got == {(run_id, "train/loss"): [1.0, 1.0, 1.0] for run_id in ids}
