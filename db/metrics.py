"""Appending metric points: batched, idempotent, rollup kept up to date.

Points are validated and their rows planned first, outside any transaction;
then one transaction holds the run's append lock (SQLite: the
database write lock taken by BEGIN IMMEDIATE; Postgres: an advisory lock per
run). Under that lock the points already stored are known exactly, so only
genuinely new points are inserted and folded into the rollup: re-appending a
batch (a resumed run replaying steps) changes nothing. The inserts still say
ON CONFLICT DO NOTHING as a second line of defence.

Rows reach the database in a few large statements rather than one statement
per row: per-row binding in the driver, not the database, was the bottleneck
(see `_write_sqlite` and `_write_postgres`).
"""

from __future__ import annotations

import sqlite3
import time
from bisect import bisect_left, bisect_right
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from functools import cache, lru_cache
from itertools import chain, compress, islice, repeat
from math import isfinite, isnan
from operator import attrgetter, index, lt, not_
from typing import Any

from sqlalchemy import Connection, Dialect, Engine, case, select, text
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.sql.dml import Insert

from db.engine import connection_scope
from db.errors import NotOwned, RunNotFound
from db.models import Metric, MetricRollup, Run
from db.rollup import MAX_STEP, ROW_COLUMNS, WHOLE_SERIES_LEVEL, rollup_rows
from db.types import KEY_LEN, MetricPoint, MetricSummary, stored_float

METRIC_COLUMNS = ("run_id", "key", "step", "epoch", "value", "nonfinite", "wall_time")
# Bound parameters per IN list: below SQLite's historical limit of 999.
IN_CHUNK = 900
# SQLite: rows per multi-row INSERT. A power of two (see `_chunk_sizes`); at
# 512 rows the statement takes a few ms to prepare, once per connection, and
# larger ones are no faster per row.
SQLITE_ROWS = 512
# Postgres: rows per unnest statement; bounds the size of the array literals.
PG_ROWS = 10_000
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


@dataclass
class Columns:
    """One key's points, validated, column by column: steps sorted and unique,
    the other fields in step order. NaN stays NaN here (NULL once stored)."""

    key: str
    steps: list[int]
    values: list[float]
    epochs: list[int | None]
    walls: list[float]
    finite: bool  # every value is finite: the common case, written the fast way

    def __len__(self) -> int:
        return len(self.steps)

    def select(self, keep: Sequence[bool]) -> Columns:
        """The points where `keep` is true."""
        values = list(compress(self.values, keep))
        return Columns(self.key, list(compress(self.steps, keep)), values,
                       list(compress(self.epochs, keep)), list(compress(self.walls, keep)),
                       self.finite or all(map(isfinite, values)))


@dataclass
class Batch:
    """Validated points of one run, and the rows to write for those not stored yet."""

    run_id: str
    series: list[Columns]
    new: list[Columns] = field(default_factory=list)
    rollups: list[tuple[Any, ...]] = field(default_factory=list)  # ROW_COLUMNS but run_id
    # The stored steps `new` leaves out: a batch retried after a rollback is planned again.
    planned_without: dict[str, set[int]] = field(default_factory=dict)


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
        raise ValueError(
            f"metric key {key[:40]!r}... is {len(key)} characters long; the limit is {KEY_LEN}"
        )


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
        _write_postgres(conn, batch)
    else:
        _write_sqlite(conn, batch)
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


@cache
def _statements(dialect_name: str) -> tuple[Insert, Insert]:
    """The metric insert and the rollup upsert, in the dialect's ON CONFLICT syntax
    (the bulk statements keep their column list and conflict clause)."""
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



def _write_sqlite(conn: Connection, batch: Batch) -> None:
    """Multi-row INSERT … SELECT FROM (VALUES …) statements on the raw sqlite3 connection.

    The sqlite3 module's executemany binds and steps one row at a time through
    Python; a 512-row statement bound from one flat list, with the columns
    shared by every row (run id, key) bound once, measured about 3x cheaper
    per row of CPU, as cheap as rows generated inside SQLite itself. (One
    JSON document per chunk unpacked with json_each measured about as slow as
    executemany: every row's fields are parsed again by ->>.) Non-finite
    values are rare: they go through a plain executemany, flagged, so that
    the bulk statement can write `nonfinite = 0` as a constant.
    """
    dialect = conn.dialect
    cursor = conn.connection.driver_connection.cursor()  # type: ignore[union-attr]
    try:
        metric_head, metric_conflict = _insert_parts(dialect, "metric")
        for columns in batch.new:
            flagged: list[tuple[Any, ...]] = []
            if not columns.finite:
                finite = list(map(isfinite, columns.values))
                odd = columns.select(list(map(not_, finite)))
                flagged = list(zip(repeat(batch.run_id), repeat(columns.key), odd.steps, odd.epochs,
                                   map(_stored, odd.values), repeat(True), odd.walls))
                columns = columns.select(finite)
            flat = list(chain.from_iterable(zip(columns.steps, columns.epochs, columns.values, columns.walls)))
            _sqlite_bulk(cursor, metric_head, metric_conflict, "?, ?, column1, column2, column3, 0, column4",
                         (batch.run_id, columns.key), flat, 4)
            if flagged:
                placeholders = ", ".join("?" * len(METRIC_COLUMNS))
                cursor.executemany(f"{metric_head} VALUES ({placeholders}){metric_conflict}", flagged)
        width = len(ROW_COLUMNS) - 1
        select_list = "?, " + ", ".join(f"column{i}" for i in range(1, width + 1))
        _sqlite_bulk(cursor, *_insert_parts(dialect, "metric_rollup"), select_list,
                     (batch.run_id,), list(chain.from_iterable(batch.rollups)), width)
    finally:
        cursor.close()


def _stored(value: float) -> float | None:
    """NaN is stored as NULL (SQLite cannot store NaN; Postgres then agrees)."""
    return None if isnan(value) else value


def _sqlite_bulk(
    cursor: sqlite3.Cursor, head: str, conflict: str, select_list: str,
    shared: tuple[Any, ...], flat: list[Any], width: int,
) -> None:
    """Insert the rows laid end to end in `flat` (`width` values each), `shared` bound once per statement."""
    limit = cursor.connection.getlimit(sqlite3.SQLITE_LIMIT_VARIABLE_NUMBER)
    largest = SQLITE_ROWS
    while largest > 1 and len(shared) + largest * width > limit:  # a build with fewer parameters
        largest //= 2
    start = 0
    for rows in _chunk_sizes(len(flat) // width, largest):
        end = start + rows * width
        cursor.execute(_sqlite_bulk_sql(head, conflict, select_list, width, rows), (*shared, *flat[start:end]))
        start = end


def _chunk_sizes(n: int, largest: int) -> Iterator[int]:
    """`n` rows as full statements of `largest` rows (a power of two), then the
    remainder in powers of two: at most ~2·log2(largest) distinct statements,
    each prepared once per connection and then found in the sqlite3 module's
    statement cache, whatever the batch sizes."""
    while n >= largest:
        yield largest
        n -= largest
    while n:
        size = 1 << (n.bit_length() - 1)
        yield size
        n -= size


@lru_cache(maxsize=256)
def _sqlite_bulk_sql(head: str, conflict: str, select_list: str, width: int, rows: int) -> str:
    row = "(" + ", ".join("?" * width) + ")"
    # Anonymous `?` (numbered ones make preparing quadratic in the parameters);
    # they bind in textual order: the select list's shared values come first.
    # `WHERE true` lets SQLite's parser tell the ON CONFLICT clause from a join.
    return f"{head} SELECT {select_list} FROM (VALUES {', '.join([row] * rows)}) WHERE true{conflict}"


def _write_postgres(conn: Connection, batch: Batch) -> None:
    """One INSERT … SELECT FROM unnest(arrays) per PG_ROWS rows, the run id bound once.

    executemany pays a round trip per row, about 10x slower; each array goes
    as one literal string (lists adapted by the driver cost a third more).
    """
    keys: list[str] = []
    steps: list[int] = []
    epochs: list[int | None] = []
    values: list[float | None] = []
    flags: list[bool] = []
    walls: list[float] = []
    for columns in batch.new:
        keys += repeat(columns.key, len(columns))
        steps += columns.steps
        epochs += columns.epochs
        walls += columns.walls
        if columns.finite:
            values += columns.values
            flags += repeat(False, len(columns))
        else:
            values += map(_stored, columns.values)
            flags += (not isfinite(v) for v in columns.values)
    metric = (keys, steps, epochs, values, flags, walls)
    rollup = list(zip(*batch.rollups))
    for table, arrays in (("metric", metric), ("metric_rollup", rollup)):
        sql = _pg_bulk_sql(conn.dialect, table)
        for start in range(0, len(arrays[0]), PG_ROWS):
            params = {f"c{i}": pg_array(a[start:start + PG_ROWS]) for i, a in enumerate(arrays)}
            conn.exec_driver_sql(sql, {"run_id": batch.run_id, **params})


_pg_sql: dict[str, str] = {}


def _pg_bulk_sql(dialect: Dialect, table: str) -> str:
    # INSERT INTO t (run_id, a, b) SELECT %(run_id)s, * FROM unnest(%(c0)s::A[], %(c1)s::B[]) ON CONFLICT ...
    if table not in _pg_sql:
        head, conflict = _insert_parts(dialect, table)
        columns = Metric.__table__.c if table == "metric" else MetricRollup.__table__.c
        names = METRIC_COLUMNS if table == "metric" else ROW_COLUMNS
        arrays = ", ".join(
            f"%(c{i})s::{columns[name].type.compile(dialect=dialect)}[]" for i, name in enumerate(names[1:])
        )
        _pg_sql[table] = f"{head} SELECT %(run_id)s::VARCHAR, * FROM unnest({arrays}){conflict}"
    return _pg_sql[table]


def pg_array(values: Sequence[Any]) -> str:
    """A Postgres array literal of ints, floats, bools, strings and NULLs."""
    kinds = set(map(type, values))
    if kinds == {int} or (kinds == {float} and isfinite(sum(values))):
        return "{" + ",".join(map(repr, values)) + "}"
    if kinds == {bool}:
        return "{" + ",".join(["t" if v else "f" for v in values]) + "}"
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
        return "NaN" if isnan(value) else ("Infinity" if value > 0 else "-Infinity")
    return repr(int(value) if not isinstance(value, float) else value)


_parts: dict[tuple[str, str], tuple[str, str]] = {}


def _insert_parts(dialect: Dialect, table: str) -> tuple[str, str]:
    """`INSERT INTO t (columns)` and ` ON CONFLICT …` of the table's insert in the
    dialect's syntax; the bulk statements put their own rows in between."""
    if (dialect.name, table) not in _parts:
        metric, rollup = _statements(dialect.name)
        stmt, columns = (metric, METRIC_COLUMNS) if table == "metric" else (rollup, ROW_COLUMNS)
        sql = str(stmt.compile(dialect=dialect, column_keys=list(columns)))
        head, rest = sql.split(" VALUES (", 1)
        listed = head.split("(", 1)[1].rstrip(")").replace('"', "").split(", ")
        assert listed == list(columns), f"the rows' column order must be the statement's: {listed}"
        _parts[dialect.name, table] = head, " ON CONFLICT " + rest.split(" ON CONFLICT ", 1)[1]
    return _parts[dialect.name, table]


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
