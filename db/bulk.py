"""Bulk writes of metric points and rollup rows, in each dialect's fastest form.

Rows reach the database in a few large statements rather than one statement per row: per-row binding in
the driver, not the database, was the bottleneck. SQLite: multi-row INSERT … SELECT FROM (VALUES …) on the
raw sqlite3 connection; Postgres: INSERT … SELECT FROM unnest(arrays). Both keep ON CONFLICT DO NOTHING
for points and an upsert that merges the rollup rows (db.metrics plans what to write, under the run's
append lock).
"""

from __future__ import annotations

import sqlite3
from collections.abc import Iterator, Sequence
from functools import cache, lru_cache
from itertools import chain, repeat
from math import isfinite, isnan
from operator import not_
from typing import Any

from sqlalchemy import Connection, Dialect, case
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.sql.dml import Insert

from db.batch import Batch
from db.models import Metric, MetricRollup
from db.rollup import ROW_COLUMNS

METRIC_COLUMNS = ("run_id", "key", "step", "epoch", "value", "nonfinite", "wall_time")
# SQLite: rows per multi-row INSERT. A power of two (see `_chunk_sizes`); at
# 512 rows the statement takes a few ms to prepare, once per connection, and
# larger ones are no faster per row.
SQLITE_ROWS = 512
# Postgres: rows per unnest statement; bounds the size of the array literals.
PG_ROWS = 10_000


@cache
def _statements(dialect_name: str) -> tuple[Insert, Insert]:
    """The metric insert and the rollup upsert, in the dialect's ON CONFLICT syntax
    (the bulk statements keep their column list and conflict clause)."""
    insert = {"sqlite": sqlite.insert, "postgresql": postgresql.insert}[dialect_name]
    metric = insert(Metric.__table__).on_conflict_do_nothing(index_elements=["run_id", "key", "step"])
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
    upsert = upsert.on_conflict_do_update(index_elements=["run_id", "level", "key", "bucket"], set_=merged)
    return metric, upsert


def write_sqlite(conn: Connection, batch: Batch) -> None:
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
                flagged = list(
                    zip(
                        repeat(batch.run_id),
                        repeat(columns.key),
                        odd.steps,
                        odd.epochs,
                        map(_stored, odd.values),
                        repeat(True),
                        odd.walls,
                    )
                )
                columns = columns.select(finite)
            flat = list(chain.from_iterable(zip(columns.steps, columns.epochs, columns.values, columns.walls)))
            _sqlite_bulk(
                cursor,
                metric_head,
                metric_conflict,
                "?, ?, column1, column2, column3, 0, column4",
                (batch.run_id, columns.key),
                flat,
                4,
            )
            if flagged:
                placeholders = ", ".join("?" * len(METRIC_COLUMNS))
                cursor.executemany(f"{metric_head} VALUES ({placeholders}){metric_conflict}", flagged)
        width = len(ROW_COLUMNS) - 1
        select_list = "?, " + ", ".join(f"column{i}" for i in range(1, width + 1))
        _sqlite_bulk(
            cursor,
            *_insert_parts(dialect, "metric_rollup"),
            select_list,
            (batch.run_id,),
            list(chain.from_iterable(batch.rollups)),
            width,
        )
    finally:
        cursor.close()


def _stored(value: float) -> float | None:
    """NaN is stored as NULL (SQLite cannot store NaN; Postgres then agrees)."""
    return None if isnan(value) else value


def _sqlite_bulk(
    cursor: sqlite3.Cursor,
    head: str,
    conflict: str,
    select_list: str,
    shared: tuple[Any, ...],
    flat: list[Any],
    width: int,
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


def write_postgres(conn: Connection, batch: Batch) -> None:
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
            params = {f"c{i}": pg_array(a[start : start + PG_ROWS]) for i, a in enumerate(arrays)}
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
