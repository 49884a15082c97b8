"""Appending metric points: batched, idempotent, rollup kept up to date.

Points are validated and their rows planned first, outside any transaction;
then one transaction holds the run's append lock (SQLite: the
database write lock taken by BEGIN IMMEDIATE; Postgres: an advisory lock per
run). Under that lock the points already stored are known exactly, so only
genuinely new points are inserted and folded into the rollup: re-appending a
batch (a resumed run replaying steps) changes nothing. The inserts still say
ON CONFLICT DO NOTHING as a second line of defence.

The rows themselves are written by db.bulk, in a few large statements per dialect.
"""

from __future__ import annotations

import time
from bisect import bisect_left, bisect_right
from collections.abc import Iterable, Sequence
from itertools import islice
from math import isfinite
from operator import attrgetter, index, lt

from sqlalchemy import Connection, Engine, bindparam, select, text

from db.batch import Batch, Columns
from db.bulk import write_postgres, write_sqlite
from db.engine import connection_scope
from db.errors import NotOwned, RunNotFound
from db.models import Metric, MetricRollup, Run
from db.rollup import MAX_STEP, WHOLE_SERIES_LEVEL, rollup_rows
from db.types import KEY_LEN, MetricPoint, MetricSummary, stored_float

# Bound parameters per IN list: below SQLite's historical limit of 999.
IN_CHUNK = 900
# Namespace of the Postgres advisory locks taken while appending ("td").
_PG_LOCK_NAMESPACE = 0x7464

_key, _step, _value, _epoch, _wall = map(attrgetter, ("key", "step", "value", "epoch", "wall_time"))


def append_metrics(engine: Engine, run_id: str, points: Iterable[MetricPoint], *, worker_id: str | None = None) -> int:
    """Store metric points of one run; returns how many were new.

    Points whose (key, step) is already stored, in the database or earlier in
    the same batch, are ignored. NaN and ±inf are stored and flagged
    (`nonfinite`). Raises RunNotFound for an unknown run and ValueError for a
    bad key, step or value, before anything is written (`point_problem` says
    which point). With `worker_id`, nothing is written unless that worker still
    owns the run (NotOwned): a worker that lost its run never writes into it.
    """
    # All the Python work happens before the transaction: on SQLite the write
    # lock, shared by every worker, is then held only for the SQL itself.
    batch = prepare(run_id, points)
    with connection_scope(engine, write=True) as conn:
        return write_batch(conn, batch, worker_id)


def point_problem(point: MetricPoint) -> str | None:
    """Why append_metrics would refuse this point, or None (the same checks, one point)."""
    try:
        _check_key(point.key)
        _columns(point.key, [point], 0.0)
    except ValueError as e:
        return str(e)
    return None


def prepare(run_id: str, points: Iterable[MetricPoint]) -> Batch:
    """Validate and group points, and plan their rows (raises ValueError on bad input)."""
    wall_time = time.time()  # for points given without one
    batch = Batch(run_id, [_columns(key, group, wall_time) for key, group in group_points(points).items()])
    _plan(batch, {})
    return batch


def group_points(points: Iterable[MetricPoint]) -> dict[str, list[MetricPoint]]:
    """Group points by key, checking each key once."""
    points = list(points)
    keys = list(map(_key, points))
    try:
        distinct = set(keys)
    except TypeError:  # an unhashable key
        raise ValueError("metric keys must be non-empty strings") from None
    for key in distinct:
        _check_key(key)
    if len(distinct) == 1:
        return {distinct.pop(): points}
    series: dict[str, list[MetricPoint]] = {key: [] for key in distinct}
    for key, point in zip(keys, points):
        series[key].append(point)
    return series


def _check_key(key: object) -> None:
    if not isinstance(key, str) or not key:
        raise ValueError(f"metric key {key!r}: must be a non-empty string")
    if len(key) > KEY_LEN:
        raise ValueError(f"metric key {key[:40]!r}... is {len(key)} characters long; the limit is {KEY_LEN}")


def _columns(key: str, points: list[MetricPoint], wall_time: float) -> Columns:
    """One key's points as validated columns.

    Written as whole-list operations (map, all, sum: loops in C) because it
    runs on every appended point.
    """
    try:
        steps = list(map(index, map(_step, points)))
    except TypeError:
        bad = next(p.step for p in points if not hasattr(p.step, "__index__"))
        raise ValueError(f"metric {key!r}: step {bad!r} is not an integer") from None
    if not all(map(lt, steps, islice(steps, 1, None))):  # not strictly increasing
        first_wins: dict[int, MetricPoint] = {}
        for step, point in zip(steps, points):
            first_wins.setdefault(step, point)
        steps = sorted(first_wins)
        points = [first_wins[s] for s in steps]
    if steps[0] < 0 or steps[-1] > MAX_STEP:
        bad = steps[0] if steps[0] < 0 else steps[-1]
        raise ValueError(f"metric {key!r}: step {bad} is outside 0..{MAX_STEP}")
    try:
        values = list(map(float, map(_value, points)))
    except (TypeError, ValueError):
        bad = next(p for p in points if not isinstance(p.value, (int, float)) and not _is_number(p.value))
        raise ValueError(f"metric {key!r} at step {bad.step}: value {bad.value!r} is not a number") from None
    walls = list(map(_wall, points))
    if None in walls:
        walls = [wall_time if w is None else w for w in walls]
    # One pass in C: the sum of finite values is finite unless it overflows,
    # in which case the exact test below decides.
    finite = isfinite(sum(values)) or all(map(isfinite, values))
    return Columns(key, steps, values, list(map(_epoch, points)), walls, finite)


def _is_number(value: object) -> bool:
    try:
        float(value)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        return False
    return True


def write_batch(conn: Connection, batch: Batch, worker_id: str | None = None) -> int:
    """Write a prepared batch inside the caller's write transaction; returns the new points."""
    lock_run_for_append(conn, batch.run_id, worker_id)
    stored = _stored_steps(conn, batch.run_id, {c.key: c.steps for c in batch.series})
    if stored != batch.planned_without:  # a replay: plan again without the points already there
        _plan(batch, stored)
    if not batch.new:
        return 0
    if conn.dialect.name == "postgresql":
        write_postgres(conn, batch)
    else:
        write_sqlite(conn, batch)
    return sum(map(len, batch.new))


def _plan(batch: Batch, stored: dict[str, set[int]]) -> None:
    """The points of the batch not in `stored`, and their rollup rows."""
    new = []
    for columns in batch.series:
        if columns.key in stored:
            known = stored[columns.key]
            columns = columns.select([step not in known for step in columns.steps])
        if columns.steps:
            new.append(columns)
    batch.new = new
    batch.planned_without = stored
    batch.rollups = rollup_rows((c.key, c.steps, c.values) for c in new)


def lock_run_for_append(conn: Connection, run_id: str, worker_id: str | None = None) -> None:
    """Fail with RunNotFound for an unknown run (NotOwned when `worker_id` no longer owns it);
    serialize appends to one run on Postgres."""
    if conn.dialect.name == "postgresql":
        conn.execute(
            text(f"SELECT pg_advisory_xact_lock({_PG_LOCK_NAMESPACE}, hashtext(:run_id))"),
            {"run_id": run_id},
        )
    row = conn.execute(select(Run.id, Run.worker_id, Run.status).where(Run.id == run_id)).first()
    if row is None:
        raise RunNotFound(run_id)
    if worker_id is not None and (row.worker_id != worker_id or row.status not in ("running", "lost")):
        raise NotOwned(run_id, worker_id)


def _stored_steps(conn: Connection, run_id: str, series: dict[str, list[int]]) -> dict[str, set[int]]:
    """Steps of the batch already stored, per key. Appends past the stored range
    (nearly all of them) are recognised from the whole-series rows alone."""
    ranges = _stored_ranges(conn, run_id, list(series))
    found: dict[str, set[int]] = {}
    t = Metric.__table__
    for key, (first, last) in ranges.items():
        steps = series[key]  # sorted
        candidates = steps[bisect_left(steps, first) : bisect_right(steps, last)]
        for start in range(0, len(candidates), IN_CHUNK):
            chunk = candidates[start : start + IN_CHUNK]
            query = select(t.c.step).where(t.c.run_id == run_id, t.c.key == key, t.c.step.in_(chunk))
            found.setdefault(key, set()).update(conn.execute(query).scalars())
    return found


def _stored_ranges(conn: Connection, run_id: str, keys: Sequence[str]) -> dict[str, tuple[int, int]]:
    r = MetricRollup.__table__
    ranges: dict[str, tuple[int, int]] = {}
    for start in range(0, len(keys), IN_CHUNK):
        query = select(r.c.key, r.c.first_step, r.c.last_step).where(
            r.c.run_id == run_id, r.c.level == WHOLE_SERIES_LEVEL, r.c.key.in_(keys[start : start + IN_CHUNK])
        )
        ranges.update((key, (first, last)) for key, first, last in conn.execute(query))
    return ranges


def metric_keys(engine: Engine, run_id: str) -> list[str]:
    """The run's metric keys, sorted. Raises RunNotFound for an unknown run."""
    r = MetricRollup.__table__
    with connection_scope(engine) as conn:
        if conn.execute(select(Run.id).where(Run.id == run_id)).first() is None:
            raise RunNotFound(run_id)
        query = select(r.c.key).where(r.c.run_id == run_id, r.c.level == WHOLE_SERIES_LEVEL)
        return sorted(conn.execute(query).scalars())


# Built once: a live view runs it several times a second (building it each time cost more than running it).
_COUNTS = select(MetricRollup.key, MetricRollup.count).where(
    MetricRollup.run_id == bindparam("run_id"), MetricRollup.level == WHOLE_SERIES_LEVEL
)


def series_counts(engine: Engine, run_id: str) -> dict[str, int]:
    """Each metric key of the run with its number of points ({} for a run without points or an unknown
    one): what a live view polls to learn which series grew, one short range of the rollup's key."""
    with connection_scope(engine) as conn:
        return {key: int(count) for key, count in conn.execute(_COUNTS, {"run_id": run_id})}


def summaries(
    conn: Connection, run_ids: Sequence[str], keys: Sequence[str] | None = None
) -> dict[str, dict[str, MetricSummary]]:
    """Per run, per key: the whole-series summary. One query per 900 runs, not one per run."""
    r = MetricRollup.__table__
    out: dict[str, dict[str, MetricSummary]] = {run_id: {} for run_id in run_ids}
    columns = (
        r.c.run_id,
        r.c.key,
        r.c.count,
        r.c.nonfinite,
        r.c.last_step,
        r.c.last_value,
        r.c.min_value,
        r.c.min_step,
        r.c.max_value,
        r.c.max_step,
    )  # MetricSummary's order
    for start in range(0, len(run_ids), IN_CHUNK):
        query = select(*columns).where(
            r.c.run_id.in_(run_ids[start : start + IN_CHUNK]), r.c.level == WHOLE_SERIES_LEVEL
        )
        if keys is not None:
            query = query.where(r.c.key.in_(keys))
        for run_id, key, count, nonfinite, last_step, last_value, *extremes in conn.execute(query):
            out[run_id][key] = MetricSummary(key, count, nonfinite, last_step, stored_float(last_value), *extremes)
    return out
