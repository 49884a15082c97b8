"""Chart series: downsampled in the database, faithful to the extremes, incremental."""

from __future__ import annotations

import math
import random

import pytest
from sqlalchemy import Engine

from db import repo
from db.series import RAW_DOWNSAMPLE_LIMIT
from db.types import MetricPoint, Series

SPEC = {"model": {"name": "mlp"}}


def _walk(n: int, seed: int, start: int = 0, stride: int = 1) -> dict[int, float]:
    """A noisy loss-like curve with spikes, like real training."""
    rng = random.Random(seed)
    value, out = 5.0, {}
    for i in range(n):
        value = max(0.01, value * 0.9995 + rng.gauss(0, 0.05))
        out[start + i * stride] = value + (rng.random() < 0.002) * rng.uniform(5, 50)
    return out


def _append(engine: Engine, run_id: str, data: dict[int, float], key: str = "loss") -> None:
    points = [MetricPoint(key, s, v) for s, v in data.items()]
    for i in range(0, len(points), 7000):
        repo.append_metrics(engine, run_id, points[i : i + 7000])


def _assert_faithful(chart: Series, data: dict[int, float], max_points: int, aligned_to: int) -> None:
    """What a user relies on when reading a downsampled chart."""
    assert chart.downsampled
    assert len(chart) <= max_points
    assert list(chart.steps) == sorted(set(chart.steps))
    for step, value in zip(chart.steps, chart.values):
        assert data[step] == value  # only real points, never averages
    low, high = min(data, key=data.__getitem__), max(data, key=data.__getitem__)
    shown = dict(zip(chart.steps, chart.values))
    assert data[low] in shown.values() and data[high] in shown.values()  # spikes survive
    assert min(data) in shown and max(data) in shown  # the line starts and ends where the run did
    # Every bucket shows its own lowest and highest value.
    buckets: dict[int, list[float]] = {}
    for step, value in data.items():
        buckets.setdefault((step - aligned_to) // chart.bucket_width, []).append(value)
    shown_by_bucket: dict[int, set[float]] = {}
    for step, value in shown.items():
        shown_by_bucket.setdefault((step - aligned_to) // chart.bucket_width, set()).add(value)
    for bucket, values in buckets.items():
        assert {min(values), max(values)} <= shown_by_bucket[bucket]
    # And the chart uses its budget: more than a quarter of the points it may show.
    assert len(chart) > max_points // 4


def test_a_short_series_comes_back_whole(engine: Engine) -> None:
    run = repo.create_run(engine, SPEC)
    data = _walk(1500, seed=1)
    _append(engine, run.id, data)
    chart = repo.series(engine, run.id, "loss")
    assert not chart.downsampled and chart.bucket_width == 1
    assert dict(zip(chart.steps, chart.values)) == data
    assert chart.total_points == 1500 and chart.last_step == 1499


def test_a_medium_series_is_downsampled_from_the_raw_points(engine: Engine) -> None:
    run = repo.create_run(engine, SPEC)
    data = _walk(6_000, seed=2, start=100, stride=3)
    assert len(data) <= RAW_DOWNSAMPLE_LIMIT
    _append(engine, run.id, data)
    chart = repo.series(engine, run.id, "loss", max_points=1000)
    _assert_faithful(chart, data, 1000, aligned_to=100)


def test_a_long_series_is_read_from_the_rollup(engine: Engine) -> None:
    run = repo.create_run(engine, SPEC)
    data = _walk(40_000, seed=3)
    assert len(data) > RAW_DOWNSAMPLE_LIMIT
    _append(engine, run.id, data)
    chart = repo.series(engine, run.id, "loss")
    _assert_faithful(chart, data, 2000, aligned_to=0)
    assert chart.bucket_width & (chart.bucket_width - 1) == 0  # a power-of-two rollup level
    assert chart.total_points == 40_000
    assert (chart.first.step, chart.last.step) == (0, 39_999)  # type: ignore[union-attr]


def test_a_live_chart_gets_only_the_new_points(engine: Engine) -> None:
    run = repo.create_run(engine, SPEC)
    data = _walk(3000, seed=4)
    _append(engine, run.id, dict(list(data.items())[:2500]))
    first = repo.series(engine, run.id, "loss")
    assert first.last_step == 2499
    _append(engine, run.id, dict(list(data.items())[2500:]))
    update = repo.series(engine, run.id, "loss", since_step=first.last_step)
    assert not update.downsampled
    assert update.steps == tuple(range(2500, 3000))
    assert update.values == tuple(data[s] for s in range(2500, 3000))
    assert len(repo.series(engine, run.id, "loss", since_step=update.last_step)) == 0


def test_a_chart_far_behind_gets_the_new_range_downsampled(engine: Engine) -> None:
    run = repo.create_run(engine, SPEC)
    data = _walk(30_000, seed=5)
    _append(engine, run.id, data)
    for since in (2_000, 25_000):
        chart = repo.series(engine, run.id, "loss", since_step=since, max_points=500)
        assert chart.downsampled and len(chart) <= 500
        assert min(chart.steps) > since and max(chart.steps) == 29_999
        newer = {s: v for s, v in data.items() if s > since}
        assert min(newer.values()) in chart.values and max(newer.values()) in chart.values


def test_nan_and_inf_do_not_break_a_downsampled_chart(engine: Engine) -> None:
    run = repo.create_run(engine, SPEC)
    data = _walk(25_000, seed=6)
    data[24_000] = math.inf
    data[24_999] = math.nan  # the run diverged at the end
    _append(engine, run.id, data)
    chart = repo.series(engine, run.id, "loss")
    assert len(chart) <= 2000 and chart.nonfinite_points == 2
    finite = [v for v in chart.values if math.isfinite(v)]
    assert max(finite) == max(v for v in data.values() if math.isfinite(v))
    assert chart.last is not None and chart.last.step == 24_999 and math.isnan(chart.last.value)
    assert chart.steps[-1] == 24_999  # the divergence is visible at the end of the line


def test_an_unknown_key_is_an_empty_chart_and_tiny_budgets_are_refused(engine: Engine) -> None:
    run = repo.create_run(engine, SPEC)
    empty = repo.series(engine, run.id, "never/logged")
    assert len(empty) == 0 and empty.total_points == 0 and empty.last_step is None
    with pytest.raises(ValueError, match="max_points must be at least 4"):
        repo.series(engine, run.id, "loss", max_points=3)


def test_compare_puts_runs_side_by_side(engine: Engine) -> None:
    a = repo.create_run(engine, SPEC, name="a")
    b = repo.create_run(engine, SPEC, name="b")
    _append(engine, a.id, _walk(100, seed=7))
    _append(engine, b.id, _walk(50, seed=8))
    _append(engine, b.id, _walk(50, seed=9), key="acc")
    result = repo.compare(engine, [b.id, a.id], ["loss", "acc"])
    assert [r.name for r in result.runs] == ["b", "a"]
    assert len(result.series[a.id]["loss"]) == 100 and len(result.series[a.id]["acc"]) == 0
    assert len(result.series[b.id]["acc"]) == 50
    with pytest.raises(repo.RunNotFound):
        repo.compare(engine, [a.id, "nosuchrun"], ["loss"])


def test_a_live_view_learns_which_series_grew_and_reads_them_in_one_go(engine: Engine) -> None:
    run = repo.create_run(engine, SPEC)
    assert repo.series_counts(engine, run.id) == {}
    _append(engine, run.id, {s: 1.0 for s in range(1, 11)}, key="train/loss")
    _append(engine, run.id, {10: 0.5}, key="val/loss")
    assert repo.series_counts(engine, run.id) == {"train/loss": 10, "val/loss": 1}
    _append(engine, run.id, {11: 0.9, 12: 0.8}, key="train/loss")
    assert repo.series_counts(engine, run.id)["train/loss"] == 12
    got = repo.series_many(engine, run.id, {"train/loss": 10, "val/loss": None})
    assert list(got["train/loss"].steps) == [11, 12] and list(got["train/loss"].values) == [0.9, 0.8]
    assert list(got["val/loss"].steps) == [10]
    assert repo.series_counts(engine, "no-such-run") == {}
