"""Reading metric series for charts, downsampled in the database.

Three ways, cheapest that is exact enough first:
- at most `max_points` points: the raw points;
- up to RAW_DOWNSAMPLE_LIMIT points: one query over the raw points that keeps,
  per step bucket, the point with the smallest and the largest value;
- longer: the rollup level with the finest buckets that still fit, about a
  thousand rows however long the series.
Every downsampled answer also holds the series' first and last points.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any

from sqlalchemy import BigInteger, Connection, Engine, bindparam, func, literal_column, select, union_all

try:
    from sqlalchemy.dialects.postgresql import distinct_on as _pg_distinct_on
except ImportError:  # SQLAlchemy 2.0
    _pg_distinct_on = None

from core.names import EPOCH_TIME, TRAIN_LOSS
from db.engine import connection_scope
from db.errors import RunNotFound
from db.models import Metric, MetricRollup, Run
from db.rollup import LEVELS, WHOLE_SERIES_LEVEL
from db.run_records import load_runs
from db.types import Comparison, Series, SeriesPoint, stored_float

DEFAULT_MAX_POINTS = 2000
MIN_MAX_POINTS = 4  # one bucket's min and max, plus first and last
# Up to this many points, the raw points are downsampled (exactly `max_points`
# wide buckets); above it, the finest rollup level, with at least
# RAW_DOWNSAMPLE_LIMIT / 2**FINEST_LEVEL buckets, is as good and much cheaper.
RAW_DOWNSAMPLE_LIMIT = 8_000


def series(
    engine: Engine,
    run_id: str,
    key: str,
    since_step: int | None = None,
    max_points: int = DEFAULT_MAX_POINTS,
) -> Series:
    """At most `max_points` points of one metric, for a chart.

    With `since_step`, only points after that step: the raw points when there
    are at most `max_points` of them (a live chart appends them), else that
    range downsampled. An existing run without this key gives an empty series;
    an unknown run raises RunNotFound.
    """
    if max_points < MIN_MAX_POINTS:
        raise ValueError(f"max_points must be at least {MIN_MAX_POINTS}, got {max_points}")
    with connection_scope(engine) as conn:
        return read_series(conn, run_id, key, since_step, max_points)


def series_many(
    engine: Engine, run_id: str, since: dict[str, int | None], max_points: int = DEFAULT_MAX_POINTS
) -> dict[str, Series]:
    """`series` of several keys in one connection: each key's points after its step in `since` (None: the
    whole series, downsampled). What a live chart reads when a few of a run's series grew."""
    if max_points < MIN_MAX_POINTS:
        raise ValueError(f"max_points must be at least {MIN_MAX_POINTS}, got {max_points}")
    with connection_scope(engine) as conn:
        return {key: read_series(conn, run_id, key, step, max_points) for key, step in since.items()}


# The two reads of a live chart's refresh, built once (a live page runs them for every series that grew,
# several times a second: building the statement each time cost more than running it).
_WHOLE = select(MetricRollup.__table__).where(
    MetricRollup.run_id == bindparam("run_id"),
    MetricRollup.level == WHOLE_SERIES_LEVEL,
    MetricRollup.key == bindparam("key"),
)
_AFTER = (
    select(Metric.step, Metric.value)
    .where(Metric.run_id == bindparam("run_id"), Metric.key == bindparam("key"), Metric.step > bindparam("since"))
    .order_by(Metric.step)
    .limit(bindparam("limit"))
)


def read_series(conn: Connection, run_id: str, key: str, since_step: int | None, max_points: int) -> Series:
    whole = conn.execute(_WHOLE, {"run_id": run_id, "key": key}).first()
    if whole is None:
        if conn.execute(select(Run.id).where(Run.id == run_id)).first() is None:
            raise RunNotFound(run_id)
        return _series(run_id, key, [], False, 1, None)
    lo, hi = whole.first_step, whole.last_step
    if since_step is not None:
        raw = _raw_points(conn, run_id, key, since_step, max_points + 1)
        if len(raw) <= max_points:
            return _series(run_id, key, raw, False, 1, whole)
        lo = since_step + 1
    elif whole.count <= max_points:
        return _series(run_id, key, _raw_points(conn, run_id, key, None, None), False, 1, whole)
    estimate = min(whole.count, hi - lo + 1)  # never fewer than the points in [lo, hi]
    budget = (max_points - 2) // 2
    if estimate <= RAW_DOWNSAMPLE_LIMIT:
        points, width = _downsample_raw(conn, run_id, key, lo, hi, budget)
    else:
        points, width = _downsample_rollup(conn, run_id, key, lo, hi, estimate, budget)
    ends = [(whole.last_step, stored_float(whole.last_value))]
    if since_step is None:
        ends.append((whole.first_step, stored_float(whole.first_value)))
    else:
        ends.append(raw[0])
    return _series(run_id, key, sorted(dict(points + ends).items()), True, width, whole)


def _raw_points(
    conn: Connection, run_id: str, key: str, since_step: int | None, limit: int | None
) -> list[tuple[int, float]]:
    if since_step is not None and limit is not None:
        rows = conn.execute(_AFTER, {"run_id": run_id, "key": key, "since": since_step, "limit": limit})
        return [(step, stored_float(value)) for step, value in rows]
    t = Metric.__table__
    query = select(t.c.step, t.c.value).where(t.c.run_id == run_id, t.c.key == key)
    if since_step is not None:
        query = query.where(t.c.step > since_step)
    query = query.order_by(t.c.step).limit(limit)
    return [(step, stored_float(value)) for step, value in conn.execute(query)]


def _downsample_raw(
    conn: Connection, run_id: str, key: str, lo: int, hi: int, budget: int
) -> tuple[list[tuple[int, float]], int]:
    """Per bucket of `width` steps, the points with the smallest and largest finite value.

    Each backend's cheapest SQL for "the row holding a group's minimum": on
    SQLite a bare column beside min()/max() comes from that row (documented
    behaviour, no sort at all); on Postgres, DISTINCT ON. Window functions,
    the portable way, sort every point twice and cost 2-5x as much.
    """
    t = Metric.__table__
    width = -(-(hi - lo + 1) // budget)  # ceil: at most `budget` buckets
    # Integers we computed, inlined: Postgres must see the same expression in
    # the select list and in GROUP BY / DISTINCT ON (bound, they would differ).
    bucket = (t.c.step - literal_column(str(int(lo)), BigInteger)) // literal_column(str(int(width)), BigInteger)
    where = (t.c.run_id == run_id, t.c.key == key, t.c.step.between(lo, hi), ~t.c.nonfinite)
    if conn.dialect.name == "sqlite":
        parts = [
            select(t.c.step, extreme(t.c.value)).where(*where).group_by(bucket) for extreme in (func.min, func.max)
        ]
    else:
        parts = [
            _distinct_on(select(t.c.step, t.c.value).where(*where), bucket)
            .order_by(bucket, value_order, t.c.step)
            .subquery()
            .select()
            for value_order in (t.c.value.asc(), t.c.value.desc())
        ]
    return [(step, value) for step, value in conn.execute(union_all(*parts))], width


def _distinct_on(query: Any, *columns: Any) -> Any:
    """SELECT DISTINCT ON (columns) in SQLAlchemy 2.1's spelling, or 2.0's."""
    if _pg_distinct_on is not None:
        return query.ext(_pg_distinct_on(*columns))
    return query.distinct(*columns)


def _downsample_rollup(
    conn: Connection, run_id: str, key: str, lo: int, hi: int, estimate: int, budget: int
) -> tuple[list[tuple[int, float]], int]:
    """Bucket extremes from the finest rollup level with at most `budget` buckets in [lo, hi]."""
    level = next(
        (lv for lv in LEVELS if min(estimate, (hi >> lv) - (lo >> lv) + 1) <= budget),
        WHOLE_SERIES_LEVEL,
    )
    r = MetricRollup.__table__
    query = select(r.c.min_step, r.c.min_value, r.c.max_step, r.c.max_value).where(
        r.c.run_id == run_id,
        r.c.level == level,
        r.c.key == key,
        r.c.bucket.between(lo >> level, hi >> level),
    )
    points: list[tuple[int, float]] = []
    for min_step, min_value, max_step, max_value in conn.execute(query):
        # A bucket straddling `lo` may hold its extreme before the range asked for.
        if min_step is not None and min_step >= lo:
            points.append((min_step, min_value))
        if max_step is not None and max_step >= lo:
            points.append((max_step, max_value))
    return points, 1 << level if level != WHOLE_SERIES_LEVEL else hi - lo + 1


def _series(
    run_id: str,
    key: str,
    points: Sequence[tuple[int, float]],
    downsampled: bool,
    width: int,
    whole: Any,
) -> Series:
    def point(step: int | None, value: float | None) -> SeriesPoint | None:
        return None if step is None else SeriesPoint(step, stored_float(value))

    return Series(
        run_id=run_id,
        key=key,
        steps=tuple(step for step, _ in points),
        values=tuple(value for _, value in points),
        downsampled=downsampled,
        bucket_width=width,
        total_points=whole.count if whole is not None else 0,
        nonfinite_points=whole.nonfinite if whole is not None else 0,
        first=point(whole.first_step, whole.first_value) if whole is not None else None,
        last=point(whole.last_step, whole.last_value) if whole is not None else None,
        min=point(whole.min_step, whole.min_value) if whole is not None else None,
        max=point(whole.max_step, whole.max_value) if whole is not None else None,
    )


def compare(
    engine: Engine,
    run_ids: Sequence[str],
    keys: Sequence[str],
    max_points: int = DEFAULT_MAX_POINTS,
) -> Comparison:
    """Runs side by side: their records and each requested key's series."""
    with connection_scope(engine) as conn:
        runs = load_runs(conn, list(run_ids))
        missing = [run_id for run_id in run_ids if run_id not in runs]
        if missing:
            raise RunNotFound(missing[0])
        charts = {run_id: {key: read_series(conn, run_id, key, None, max_points) for key in keys} for run_id in run_ids}
    return Comparison(runs=tuple(runs[run_id] for run_id in run_ids), series=charts)


def epoch_anchors(engine: Engine, run_id: str) -> list[tuple[int, int, float]]:
    """(step, epoch, wall_time) at the end of each epoch, plus the first and last logged training step
    (epoch 0: not an epoch end): enough to map steps onto epochs and seconds. Reads a few rows by primary key."""
    m = Metric.__table__
    base = select(m.c.step, m.c.epoch, m.c.wall_time).where(m.c.run_id == run_id)
    with connection_scope(engine) as conn:
        ends = list(conn.execute(base.where(m.c.key == EPOCH_TIME).order_by(m.c.step)))
        first = conn.execute(base.where(m.c.key == TRAIN_LOSS).order_by(m.c.step).limit(1)).first()
        last = conn.execute(base.where(m.c.key == TRAIN_LOSS).order_by(m.c.step.desc()).limit(1)).first()
    # Training steps anchor time only (epoch 0 = "not an epoch end"); epoch ends win on a shared step.
    rows = [(r[0], 0, r[2]) for r in (first, last) if r is not None] + [tuple(r) for r in ends]
    return sorted({int(s): (int(s), int(e or 0), float(w)) for s, e, w in rows}.values())


def iter_points(engine: Engine, run_id: str) -> Iterator[tuple[str, int, int | None, float, float]]:
    """Every stored point of a run, by key then step: (key, step, epoch, value (NaN for NaN), wall_time)."""
    m = Metric.__table__
    query = (
        select(m.c.key, m.c.step, m.c.epoch, m.c.value, m.c.wall_time)
        .where(m.c.run_id == run_id)
        .order_by(m.c.key, m.c.step)
    )
    with connection_scope(engine) as conn:
        for key, step, epoch, value, wall in conn.execute(query):
            yield key, step, epoch, stored_float(value), wall
