"""Appending metric points: idempotent, exact rollups, NaN/inf kept, bad input refused."""

from __future__ import annotations

import math
import random
import time

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from sqlalchemy import Engine, text

from db import repo
from db.engine import connection_scope
from db.types import KEY_LEN, MetricPoint

SPEC = {"model": {"name": "mlp"}}


def _rollup_rows(engine: Engine, run_id: str) -> list[tuple]:
    """The run's rollup, without the run id, in a stable order."""
    with connection_scope(engine) as conn:
        rows = conn.execute(
            text(
                "SELECT level, key, bucket, count, nonfinite, min_step, min_value, max_step, max_value,"
                " first_step, first_value, last_step, last_value FROM metric_rollup"
                " WHERE run_id = :r ORDER BY level, key, bucket"
            ),
            {"r": run_id},
        ).all()
    return [tuple(row) for row in rows]


def _stored(engine: Engine, run_id: str) -> list[tuple]:
    with connection_scope(engine) as conn:
        rows = conn.execute(
            text("SELECT key, step, epoch, value, nonfinite FROM metric WHERE run_id = :r ORDER BY key, step"),
            {"r": run_id},
        ).all()
    return [tuple(row) for row in rows]


def _points(n: int, start: int = 0, key: str = "train/loss") -> list[MetricPoint]:
    return [MetricPoint(key, s, 1.0 / (s + 1) + (s % 7) * 0.01, epoch=s // 100) for s in range(start, start + n)]


def test_reappending_a_batch_changes_nothing(engine: Engine) -> None:
    run = repo.create_run(engine, SPEC)
    batch = _points(5000) + _points(5000, key="lr")
    assert repo.append_metrics(engine, run.id, batch) == 10_000
    before = (_stored(engine, run.id), _rollup_rows(engine, run.id), repo.series(engine, run.id, "lr"))
    assert repo.append_metrics(engine, run.id, batch) == 0
    after = (_stored(engine, run.id), _rollup_rows(engine, run.id), repo.series(engine, run.id, "lr"))
    assert after == before


def test_the_rollup_is_the_same_however_the_points_arrive(engine: Engine) -> None:
    """A resumed run replays steps it had already sent: the result must be as if it had not."""
    once = repo.create_run(engine, SPEC)
    replayed = repo.create_run(engine, SPEC)
    repo.append_metrics(engine, once.id, _points(6000))
    assert repo.append_metrics(engine, replayed.id, _points(4500)) == 4500
    assert repo.append_metrics(engine, replayed.id, _points(2000, start=4000)) == 1500
    assert repo.append_metrics(engine, replayed.id, list(reversed(_points(6000)))) == 0
    assert _rollup_rows(engine, replayed.id) == _rollup_rows(engine, once.id)
    assert repo.get_run(engine, replayed.id).metrics["train/loss"].count == 6000


def test_within_one_batch_the_first_point_of_a_step_wins(engine: Engine) -> None:
    run = repo.create_run(engine, SPEC)
    points = [MetricPoint("loss", 1, 0.5), MetricPoint("loss", 1, 9.0), MetricPoint("loss", 0, 1.0)]
    assert repo.append_metrics(engine, run.id, points) == 2
    assert repo.series(engine, run.id, "loss").values == (1.0, 0.5)


values = st.one_of(
    st.floats(min_value=-1e6, max_value=1e6, allow_nan=False),
    st.sampled_from([math.nan, math.inf, -math.inf]),
)


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    data=st.dictionaries(st.integers(0, 3000), values, min_size=1, max_size=300),
    cuts=st.lists(st.integers(0, 300), max_size=4),
    seed=st.integers(0, 1000),
)
def test_rollup_matches_the_raw_points_for_any_arrival_order(
    engine: Engine, data: dict[int, float], cuts: list[int], seed: int
) -> None:
    run = repo.create_run(engine, SPEC)
    points = [MetricPoint("m", step, value) for step, value in data.items()]
    random.Random(seed).shuffle(points)
    bounds = sorted({0, len(points), *[min(c, len(points)) for c in cuts]})
    for lo, hi in zip(bounds, bounds[1:]):
        repo.append_metrics(engine, run.id, points[lo:hi] + points[: lo // 2])  # with replays

    summary = repo.get_run(engine, run.id).metrics["m"]
    finite = {s: v for s, v in data.items() if math.isfinite(v)}
    assert summary.count == len(data)
    assert summary.nonfinite == len(data) - len(finite)
    assert summary.last_step == max(data)
    assert _same(summary.last_value, data[max(data)])
    if finite:
        assert summary.min_value == min(finite.values())
        assert summary.max_value == max(finite.values())
        assert finite[summary.min_step] == summary.min_value
    else:
        assert summary.min_value is None and summary.max_value is None
    # Every level of the rollup accounts for every point exactly once.
    per_level: dict[int, int] = {}
    for row in _rollup_rows(engine, run.id):
        per_level[row[0]] = per_level.get(row[0], 0) + row[3]
    assert set(per_level.values()) == {len(data)}


def _same(a: float, b: float) -> bool:
    return (math.isnan(a) and math.isnan(b)) or a == b


def test_nan_and_inf_are_stored_flagged_and_kept_out_of_extremes(engine: Engine) -> None:
    run = repo.create_run(engine, SPEC)
    points = [
        MetricPoint("loss", 0, 2.0),
        MetricPoint("loss", 1, math.inf),
        MetricPoint("loss", 2, 1.0),
        MetricPoint("loss", 3, -math.inf),
        MetricPoint("loss", 4, math.nan),
    ]
    assert repo.append_metrics(engine, run.id, points) == 5
    chart = repo.series(engine, run.id, "loss")
    assert chart.steps == (0, 1, 2, 3, 4)
    assert chart.values[:4] == (2.0, math.inf, 1.0, -math.inf) and math.isnan(chart.values[4])
    assert chart.nonfinite_points == 3
    assert (chart.min.value, chart.max.value) == (1.0, 2.0)  # type: ignore[union-attr]
    flags = [row[4] for row in _stored(engine, run.id)]
    assert [bool(f) for f in flags] == [False, True, False, True, True]
    summary = repo.get_run(engine, run.id).metrics["loss"]
    assert summary.nonfinite == 3 and math.isnan(summary.last_value)


def test_points_keep_their_epoch_and_wall_time(engine: Engine) -> None:
    run = repo.create_run(engine, SPEC)
    before = time.time()
    repo.append_metrics(
        engine, run.id, [MetricPoint("acc", 10, 0.5, epoch=2, wall_time=1234.5), MetricPoint("acc", 11, 0.6, epoch=2)]
    )
    with connection_scope(engine) as conn:
        rows = conn.execute(text("SELECT step, epoch, wall_time FROM metric ORDER BY step")).all()
    assert rows[0] == (10, 2, 1234.5)
    assert rows[1][1] == 2 and before <= rows[1][2] <= time.time()


def test_metric_keys_lists_every_key_once(engine: Engine) -> None:
    run = repo.create_run(engine, SPEC)
    assert repo.metric_keys(engine, run.id) == []
    repo.append_metrics(engine, run.id, _points(10, key="val/acc") + _points(10, key="train/loss"))
    repo.append_metrics(engine, run.id, _points(10, start=10, key="grad_norm/layer4"))
    assert repo.metric_keys(engine, run.id) == ["grad_norm/layer4", "train/loss", "val/acc"]


@pytest.mark.parametrize(
    ("point", "message"),
    [
        (MetricPoint("k" * (KEY_LEN + 1), 0, 1.0), f"is {KEY_LEN + 1} characters long; the limit is {KEY_LEN}"),
        (MetricPoint("", 0, 1.0), "non-empty"),
        (MetricPoint("loss", -1, 1.0), "step -1 is outside"),
        (MetricPoint("loss", 2**63, 1.0), "is outside"),
        (MetricPoint("loss", 1.5, 1.0), "step 1.5 is not an integer"),  # type: ignore[arg-type]
        (MetricPoint("loss", 3, "high"), "value 'high' is not a number"),  # type: ignore[arg-type]
        (MetricPoint("loss", 3, None), "value None is not a number"),  # type: ignore[arg-type]
    ],
)
def test_a_bad_point_is_refused_and_nothing_of_its_batch_is_written(
    engine: Engine, point: MetricPoint, message: str
) -> None:
    run = repo.create_run(engine, SPEC)
    with pytest.raises(ValueError, match=message.replace("(", r"\(")):
        repo.append_metrics(engine, run.id, _points(100) + [point])
    assert _stored(engine, run.id) == []


def test_a_key_of_exactly_the_limit_is_fine(engine: Engine) -> None:
    run = repo.create_run(engine, SPEC)
    assert repo.append_metrics(engine, run.id, [MetricPoint("k" * KEY_LEN, 0, 1.0)]) == 1
    assert repo.metric_keys(engine, run.id) == ["k" * KEY_LEN]


def test_numpy_like_numbers_are_accepted(engine: Engine) -> None:
    class Scalar:  # what numpy and torch scalars offer: __index__ / __float__
        def __init__(self, v: float) -> None:
            self.v = v

        def __index__(self) -> int:
            return int(self.v)

        def __float__(self) -> float:
            return float(self.v)

    run = repo.create_run(engine, SPEC)
    point = MetricPoint("loss", Scalar(3), Scalar(0.25))  # type: ignore[arg-type]
    assert repo.append_metrics(engine, run.id, [point]) == 1
    assert repo.series(engine, run.id, "loss").values == (0.25,)


def test_a_large_mixed_batch_is_stored_exactly(engine: Engine) -> None:
    """Sizes that cross the bulk statements' row counts, several keys, non-finite values among them."""
    run = repo.create_run(engine, SPEC)
    special = {7: math.nan, 600: math.inf, 1400: -math.inf}
    points = [
        MetricPoint(key, s, special.get(s, s * 0.5) if key == "a" else -s, epoch=s // 100, wall_time=1000.0 + s)
        for key, n in (("a", 1537), ("b", 513), ("c", 1))
        for s in range(n)
    ]
    assert repo.append_metrics(engine, run.id, points) == 1537 + 513 + 1
    stored = _stored(engine, run.id)
    expected = [
        (
            p.key,
            p.step,
            p.epoch,
            None if isinstance(p.value, float) and math.isnan(p.value) else p.value,
            p.step in special and p.key == "a",
        )
        for p in sorted(points, key=lambda p: (p.key, p.step))
    ]
    assert [(k, s, e, v, bool(f)) for k, s, e, v, f in stored] == expected
    summary = repo.get_run(engine, run.id).metrics
    assert (summary["a"].count, summary["a"].nonfinite, summary["a"].max_value) == (1537, 3, 1536 * 0.5)
    assert (summary["b"].count, summary["b"].min_value, summary["b"].min_step) == (513, -512, 512)
    assert repo.append_metrics(engine, run.id, points) == 0


def test_a_batch_retried_after_a_rollback_is_written_whole(engine: Engine) -> None:
    from db.metrics import prepare, write_batch

    run = repo.create_run(engine, SPEC)
    repo.append_metrics(engine, run.id, _points(100))
    batch = prepare(run.id, _points(200))  # half of it already stored
    with pytest.raises(RuntimeError), connection_scope(engine, write=True) as conn:
        assert write_batch(conn, batch) == 100
        raise RuntimeError("the transaction fails after the write")
    with connection_scope(engine, write=True) as conn:
        conn.execute(text("DELETE FROM metric WHERE run_id = :r"), {"r": run.id})
        conn.execute(text("DELETE FROM metric_rollup WHERE run_id = :r"), {"r": run.id})
    with connection_scope(engine, write=True) as conn:
        assert write_batch(conn, batch) == 200
    assert repo.get_run(engine, run.id).metrics["train/loss"].count == 200
