"""Reads of the team overview: many runs at once, a fixed number of queries however many there are.

- `findings`: per run, its latest warning or error diagnosis and how many it has (one query);
- `curves`: per (run, key), a small curve of at most about `points` values for a sparkline (two queries
  per few hundred series: the whole-series rows, then raw points of short series and a coarse rollup level
  of long ones, in one UNION ALL of one part per level and key).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from math import isfinite

from sqlalchemy import Engine, func, select, union_all

from db.engine import connection_scope
from db.models import Event, Metric, MetricRollup
from db.rollup import COARSEST_LEVEL, LEVELS, WHOLE_SERIES_LEVEL
from db.types import EventRecord

FINDING_LEVELS = ("warning", "error")
CURVE_POINTS = 64
RAW_FACTOR = 4  # up to RAW_FACTOR * points points, a series is read raw and thinned
# Series per statement (one bound parameter each; SQLite allows 32,766).
_CHUNK = 1000


@dataclass(frozen=True)
class Findings:
    """A run's diagnosis warnings and errors: the latest one and how many there are."""

    latest: EventRecord
    count: int


def findings(engine: Engine, run_ids: Sequence[str]) -> dict[str, Findings]:
    """For each run that has any, its latest warning/error event of kind "diagnosis" and their count."""
    ids = list(dict.fromkeys(run_ids))
    out: dict[str, Findings] = {}
    e = Event.__table__
    for start in range(0, len(ids), 1000):
        chunk = ids[start : start + 1000]
        per_run = (
            select(e.c.run_id, func.max(e.c.id).label("last_id"), func.count().label("n"))
            .where(e.c.run_id.in_(chunk), e.c.kind == "diagnosis", e.c.level.in_(FINDING_LEVELS))
            .group_by(e.c.run_id)
            .subquery()
        )
        query = select(e, per_run.c.n).join(per_run, e.c.id == per_run.c.last_id)
        with connection_scope(engine) as conn:
            for row in conn.execute(query):
                out[row.run_id] = Findings(
                    EventRecord(
                        id=row.id,
                        run_id=row.run_id,
                        time=row.time,
                        kind=row.kind,
                        level=row.level,
                        code=row.code,
                        message=row.message,
                        data=row.data,
                    ),
                    int(row.n),
                )
    return out


def curve_level(last_step: int, points: int) -> int:
    """The finest rollup level whose buckets from step 0 to `last_step` are at most `points`."""
    return next((lv for lv in LEVELS if (last_step >> lv) + 1 <= points), COARSEST_LEVEL)


def curves(
    engine: Engine, wanted: Iterable[tuple[str, str]], points: int = CURVE_POINTS
) -> dict[tuple[str, str], list[float]]:
    """A small curve per (run id, key) asked for that has points, oldest first: the raw values of a short
    series (evenly thinned to at most about `points`), else the last value of each bucket of the finest rollup
    level with at most `points` buckets. Non-finite values are left out; series without points are absent."""
    pairs = list(dict.fromkeys(wanted))
    out: dict[tuple[str, str], list[float]] = {}
    for start in range(0, len(pairs), _CHUNK):
        out.update(_curves(engine, pairs[start : start + _CHUNK], points))
    return out


def _curves(engine: Engine, pairs: list[tuple[str, str]], points: int) -> dict[tuple[str, str], list[float]]:
    r, m = MetricRollup.__table__, Metric.__table__
    asked = set(pairs)
    whole = select(r.c.run_id, r.c.key, r.c.count, r.c.last_step).where(
        r.c.level == WHOLE_SERIES_LEVEL, r.c.run_id.in_({p[0] for p in pairs}), r.c.key.in_({p[1] for p in pairs})
    )
    with connection_scope(engine) as conn:
        sizes = {
            (row.run_id, row.key): (row.count, row.last_step)
            for row in conn.execute(whole)
            if (row.run_id, row.key) in asked
        }
        # One part per (level, key), not per series: a handful of parts however many runs there are.
        groups: dict[tuple[int | None, str], list[str]] = {}
        for (run_id, key), (count, last_step) in sizes.items():
            level = None if count <= RAW_FACTOR * points else curve_level(last_step, points)  # None: raw points
            groups.setdefault((level, key), []).append(run_id)
        parts = [
            select(m.c.run_id, m.c.key, m.c.step.label("at"), m.c.value).where(m.c.key == key, m.c.run_id.in_(ids))
            if level is None
            else select(r.c.run_id, r.c.key, r.c.bucket.label("at"), r.c.last_value.label("value")).where(
                r.c.level == level, r.c.key == key, r.c.run_id.in_(ids)
            )
            for (level, key), ids in groups.items()
        ]
        if not parts:
            return {}
        held: dict[tuple[str, str], list[tuple[int, float]]] = {}
        for run_id, key, at, value in conn.execute(union_all(*parts) if len(parts) > 1 else parts[0]):
            if value is not None and isfinite(value):
                held.setdefault((run_id, key), []).append((at, value))
    out = {pair: [float(v) for _, v in sorted(found)] for pair, found in held.items()}
    return {pair: _thinned(values, points) for pair, values in out.items()}


def _thinned(values: list[float], points: int) -> list[float]:
    """At most about `points` of `values`, evenly spaced, the last one kept."""
    if len(values) <= points:
        return values
    every = -(-len(values) // points)
    kept = values[::every]
    if (len(values) - 1) % every:
        kept.append(values[-1])
    return kept
