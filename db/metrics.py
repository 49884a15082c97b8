"""Appending metric points: batched, idempotent, rollup kept up to date.

Points are validated and their rows planned first, outside any transaction;
then one transaction holds the run's append lock (SQLite: the
database write lock taken by BEGIN IMMEDIATE; Postgres: an advisory lock per
run). Under that lock the points already stored are known exactly, so only
genuinely new points are inserted and folded into the rollup: re-appending a
batch (a resumed run replaying steps) changes nothing. The insert still says
ON CONFLICT DO NOTHING as a second line of defence.
"""

from __future__ import annotations

import time
from bisect import bisect_left, bisect_right
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from functools import lru_cache
from itertools import islice, repeat
from math import isfinite
from operator import attrgetter, index, itemgetter, lt
from typing import Any

from sqlalchemy import Connection, Engine, case, select, text
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.sql.dml import Insert

from db.engine import connection_scope
from db.errors import RunNotFound
from db.models import Metric, MetricRollup, Run
from db.rollup import MAX_STEP, ROW_COLUMNS, WHOLE_SERIES_LEVEL, rollup_rows
from db.types import KEY_LEN, MetricPoint, MetricSummary, stored_float

METRIC_COLUMNS = ("run_id", "key", "step", "epoch", "value", "nonfinite", "wall_time")
# Bound parameters per IN list: below SQLite's historical limit of 999.
IN_CHUNK = 900
# Rows per executemany call: bounds the driver's memory on huge appends.
WRITE_CHUNK = 10_000
# Namespace of the Postgres advisory locks taken while appending ("td").
_PG_LOCK_NAMESPACE = 0x7464

# key -> (key, step, value, epoch, wall_time) tuples, as given
_Series = dict[str, list[tuple[Any, ...]]]
_extract = attrgetter("key", "step", "value", "epoch", "wall_time")
_KEY, _STEP, _VALUE, _EPOCH, _WALL = (itemgetter(i) for i in range(5))


def append_metrics(engine: Engine, run_id: str, points: Iterable[MetricPoint]) -> int:
    """Store metric points of one run; returns how many were new.

    Points whose (key, step) is already stored, in the database or earlier in
    the same batch, are ignored. NaN and ±inf are stored and flagged
    (`nonfinite`). Raises RunNotFound for an unknown run and ValueError for a
    bad key, step or value, before anything is written.
    """
    # All the Python work happens before the transaction: on SQLite the write
    # lock, shared by every worker, is then held only for the SQL itself.
    batch = prepare(run_id, points)
    with connection_scope(engine, write=True) as conn:
        return write_batch(conn, batch)


@dataclass
class Batch:
    """Validated points of one run, with the rows to write if all of them are new."""

    run_id: str
    columns: dict[str, tuple[list[int], list[float], list[tuple]]]  # key -> steps, values, items
    wall_time: float  # for points given without one
    rows: list[tuple[Any, ...]] = field(default_factory=list)
    rollups: list[tuple[Any, ...]] = field(default_factory=list)


def prepare(run_id: str, points: Iterable[MetricPoint]) -> Batch:
    """Validate and group points, and plan their rows (raises ValueError on bad input)."""
    columns = {key: _columns(key, items) for key, items in group_points(points).items()}
    batch = Batch(run_id, columns, time.time())
    _plan(batch, {})
    return batch


def group_points(points: Iterable[MetricPoint]) -> _Series:
    """Group points by key, checking each key once."""
    items = list(map(_extract, points))
    try:
        keys = set(map(_KEY, items))
    except TypeError:  # an unhashable key
        raise ValueError("metric keys must be non-empty strings") from None
    for key in keys:
        _check_key(key)
    if len(keys) == 1:
        return {keys.pop(): items}
    series: _Series = {key: [] for key in keys}
    for item in items:
        series[item[0]].append(item)
    return series


def _check_key(key: object) -> None:
    if not isinstance(key, str) or not key:
        raise ValueError(f"metric key {key!r}: must be a non-empty string")
    if len(key) > KEY_LEN:
        raise ValueError(
            f"metric key {key[:40]!r}... is {len(key)} characters long; the limit is {KEY_LEN}"
        )


def _columns(key: str, items: list[tuple[Any, ...]]) -> tuple[list[int], list[float], list[tuple]]:
    """Steps (sorted, unique, validated), values as floats, and the items in that order.

    Written as whole-list operations because it runs on every appended point.
    """
    try:
        steps = list(map(index, map(_STEP, items)))
    except TypeError:
        bad = next(item[1] for item in items if not hasattr(item[1], "__index__"))
        raise ValueError(f"metric {key!r}: step {bad!r} is not an integer") from None
    if not all(map(lt, steps, islice(steps, 1, None))):  # not strictly increasing
        first_wins: dict[int, tuple] = {}
        for step, item in zip(steps, items):
            first_wins.setdefault(step, item)
        steps = sorted(first_wins)
        items = [first_wins[s] for s in steps]
    if steps[0] < 0 or steps[-1] > MAX_STEP:
        bad = steps[0] if steps[0] < 0 else steps[-1]
        raise ValueError(f"metric {key!r}: step {bad} is outside 0..{MAX_STEP}")
    try:
        values = list(map(float, map(_VALUE, items)))
    except (TypeError, ValueError):
        bad = next(i for i in items if not isinstance(i[2], (int, float)) and not _is_number(i[2]))
        raise ValueError(f"metric {key!r} at step {bad[1]}: value {bad[2]!r} is not a number") from None
    return steps, values, items


def _is_number(value: object) -> bool:
    try:
        float(value)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        return False
    return True


def write_batch(conn: Connection, batch: Batch) -> int:
    """Write a prepared batch inside the caller's write transaction; returns the new points."""
    lock_run_for_append(conn, batch.run_id)
    stored = _stored_steps(conn, batch.run_id, {key: c[0] for key, c in batch.columns.items()})
    if stored:  # a replay: plan again without the points already there
        _plan(batch, stored)
    if not batch.rows:
        return 0
    statements = _statements(conn.dialect.name)
    for start in range(0, len(batch.rows), WRITE_CHUNK):
        _execute_many(conn, statements[0], METRIC_COLUMNS, batch.rows[start:start + WRITE_CHUNK])
    _execute_many(conn, statements[1], ROW_COLUMNS, batch.rollups)
    return len(batch.rows)


def _plan(batch: Batch, stored: dict[str, set[int]]) -> None:
    """The metric rows and rollup rows for the batch's points not in `stored`."""
    rows: list[tuple[Any, ...]] = []
    new_series: list[tuple[str, list[int], list[float]]] = []
    for key, (steps, values, items) in batch.columns.items():
        if key in stored:
            keep = [i for i, step in enumerate(steps) if step not in stored[key]]
            steps, values, items = ([seq[i] for i in keep] for seq in (steps, values, items))
        if not steps:
            continue
        flags: Iterable[bool] = repeat(False)
        kept: list[float | None] = values  # type: ignore[assignment]
        if not all(map(isfinite, values)):
            flags = [not isfinite(v) for v in values]
            kept = [None if v != v else v for v in values]  # NaN is stored as NULL
        walls = list(map(_WALL, items))
        if None in walls:
            walls = [batch.wall_time if w is None else w for w in walls]
        rows.extend(zip(repeat(batch.run_id), repeat(key), steps, map(_EPOCH, items), kept, flags, walls))
        new_series.append((key, steps, values))
    batch.rows = rows
    batch.rollups = rollup_rows(batch.run_id, new_series)


def lock_run_for_append(conn: Connection, run_id: str) -> None:
    """Fail with RunNotFound for an unknown run; serialize appends to one run on Postgres."""
    if conn.dialect.name == "postgresql":
        conn.execute(
            text(f"SELECT pg_advisory_xact_lock({_PG_LOCK_NAMESPACE}, hashtext(:run_id))"),
            {"run_id": run_id},
        )
    if conn.execute(select(Run.id).where(Run.id == run_id)).first() is None:
        raise RunNotFound(run_id)


def _stored_steps(conn: Connection, run_id: str, series: dict[str, list[int]]) -> dict[str, set[int]]:
    """Steps of the batch already stored, per key. Appends past the stored range
    (nearly all of them) are recognised from the whole-series rows alone."""
    ranges = _stored_ranges(conn, run_id, list(series))
    found: dict[str, set[int]] = {}
    t = Metric.__table__
    for key, (first, last) in ranges.items():
        steps = series[key]  # sorted
        candidates = steps[bisect_left(steps, first):bisect_right(steps, last)]
        for start in range(0, len(candidates), IN_CHUNK):
            chunk = candidates[start:start + IN_CHUNK]
            query = select(t.c.step).where(t.c.run_id == run_id, t.c.key == key, t.c.step.in_(chunk))
            found.setdefault(key, set()).update(conn.execute(query).scalars())
    return found


def _stored_ranges(conn: Connection, run_id: str, keys: Sequence[str]) -> dict[str, tuple[int, int]]:
    r = MetricRollup.__table__
    ranges: dict[str, tuple[int, int]] = {}
    for start in range(0, len(keys), IN_CHUNK):
        query = select(r.c.key, r.c.first_step, r.c.last_step).where(
            r.c.run_id == run_id, r.c.level == WHOLE_SERIES_LEVEL, r.c.key.in_(keys[start:start + IN_CHUNK])
        )
        ranges.update((key, (first, last)) for key, first, last in conn.execute(query))
    return ranges


@lru_cache(maxsize=None)
def _statements(dialect_name: str) -> tuple[Insert, Insert]:
    """The metric insert and the rollup upsert, in the dialect's ON CONFLICT syntax."""
    insert = {"sqlite": sqlite.insert, "postgresql": postgresql.insert}[dialect_name]
    metric = insert(Metric.__table__).on_conflict_do_nothing(
        index_elements=["run_id", "key", "step"]
    )
    r = MetricRollup.__table__
    upsert = insert(r)
    new = upsert.excluded

    def pick(condition: Any, column: str) -> Any:
        return case((condition, new[column]), else_=r.c[column])

    lower = new.min_value < r.c.min_value
    higher = new.max_value > r.c.max_value
    earlier = new.first_step < r.c.first_step
    later = new.last_step > r.c.last_step
    # A NULL extreme means "no finite value yet": any finite one replaces it.
    lower = lower | r.c.min_value.is_(None)
    higher = higher | r.c.max_value.is_(None)
    merged = {
        "count": r.c.count + new.count,
        "nonfinite": r.c.nonfinite + new.nonfinite,
        **{c: pick(lower, c) for c in ("min_step", "min_value")},
        **{c: pick(higher, c) for c in ("max_step", "max_value")},
        **{c: pick(earlier, c) for c in ("first_step", "first_value")},
        **{c: pick(later, c) for c in ("last_step", "last_value")},
    }
    upsert = upsert.on_conflict_do_update(
        index_elements=["run_id", "level", "key", "bucket"], set_=merged
    )
    return metric, upsert


_compiled: dict[tuple[str, int], tuple[str, tuple[str, ...] | None]] = {}


def _execute_many(conn: Connection, stmt: Insert, columns: Sequence[str], rows: list[tuple]) -> None:
    """Insert many rows with the least work per row each backend allows.

    SQLite: the driver's executemany on plain tuples (SQLAlchemy's own turns
    every row into a dict and back, which costs more than the insert itself).
    Postgres: one statement per chunk that unnests one array per column,
    each sent as an array literal (executemany pays a round trip per row,
    about 10x slower; lists adapted by the driver cost a third more).
    """
    if not rows:
        return
    cache_key = (conn.dialect.name, id(stmt))
    if cache_key not in _compiled:
        _compiled[cache_key] = _compile(conn, stmt, columns)
    sql, order = _compiled[cache_key]
    if conn.dialect.name == "postgresql":
        conn.exec_driver_sql(sql, {name: pg_array(values) for name, values in zip(columns, zip(*rows))})
    elif order == tuple(columns):
        conn.exec_driver_sql(sql, rows)
    else:
        where = [columns.index(name) for name in order or ()]
        conn.exec_driver_sql(sql, [tuple(row[i] for i in where) for row in rows])


def _compile(conn: Connection, stmt: Insert, columns: Sequence[str]) -> tuple[str, tuple[str, ...] | None]:
    compiled = stmt.compile(dialect=conn.dialect, column_keys=list(columns))
    sql = str(compiled)
    if conn.dialect.name != "postgresql":
        return sql, tuple(compiled.positiontup or ())
    # INSERT INTO t (a, b) VALUES (%(a)s, %(b)s) ON CONFLICT ...
    #   -> INSERT INTO t (a, b) SELECT * FROM unnest(%(a)s::T[], %(b)s::U[]) ON CONFLICT ...
    head = sql.split(" VALUES (", 1)[0]
    conflict = " ON CONFLICT " + sql.split(" ON CONFLICT ", 1)[1]
    table = stmt.table
    arrays = ", ".join(
        f"%({name})s::{table.c[name].type.compile(dialect=conn.dialect)}[]"  # type: ignore[union-attr]
        for name in columns
    )
    return f"{head} SELECT * FROM unnest({arrays}){conflict}", None


def pg_array(values: Sequence[Any]) -> str:
    """A Postgres array literal of ints, floats, bools, strings and NULLs."""
    kinds = set(map(type, values))
    if kinds == {int} or (kinds == {float} and all(map(isfinite, values))):
        return "{" + ",".join(map(repr, values)) + "}"
    if kinds == {str}:
        quoted = {v: '"' + v.replace("\\", "\\\\").replace('"', '\\"') + '"' for v in set(values)}
        return "{" + ",".join(map(quoted.__getitem__, values)) + "}"
    return "{" + ",".join(map(_pg_item, values)) + "}"


def _pg_item(value: Any) -> str:
    if value is None:
        return "NULL"
    if isinstance(value, bool):
        return "t" if value else "f"
    if isinstance(value, str):
        return '"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'
    if isinstance(value, float) and not isfinite(value):
        return "NaN" if value != value else ("Infinity" if value > 0 else "-Infinity")
    return repr(int(value) if not isinstance(value, float) else value)


def metric_keys(engine: Engine, run_id: str) -> list[str]:
    """The run's metric keys, sorted. Raises RunNotFound for an unknown run."""
    r = MetricRollup.__table__
    with connection_scope(engine) as conn:
        if conn.execute(select(Run.id).where(Run.id == run_id)).first() is None:
            raise RunNotFound(run_id)
        query = select(r.c.key).where(r.c.run_id == run_id, r.c.level == WHOLE_SERIES_LEVEL)
        return sorted(conn.execute(query).scalars())


def summaries(
    conn: Connection, run_ids: Sequence[str], keys: Sequence[str] | None = None
) -> dict[str, dict[str, MetricSummary]]:
    """Per run, per key: the whole-series summary. One query per 900 runs, not one per run."""
    r = MetricRollup.__table__
    out: dict[str, dict[str, MetricSummary]] = {run_id: {} for run_id in run_ids}
    columns = (r.c.run_id, r.c.key, r.c.count, r.c.nonfinite, r.c.last_step, r.c.last_value,
               r.c.min_value, r.c.min_step, r.c.max_value, r.c.max_step)  # MetricSummary's order
    for start in range(0, len(run_ids), IN_CHUNK):
        query = select(*columns).where(
            r.c.run_id.in_(run_ids[start:start + IN_CHUNK]), r.c.level == WHOLE_SERIES_LEVEL
        )
        if keys is not None:
            query = query.where(r.c.key.in_(keys))
        for run_id, key, count, nonfinite, last_step, last_value, *extremes in conn.execute(query):
            out[run_id][key] = MetricSummary(
                key, count, nonfinite, last_step, stored_float(last_value), *extremes
            )
    return out
