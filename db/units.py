"""Runs grouped for the Runs page: one row per sweep, one per seed group (runs that differ only by seed) and one
per other run, paged in the database (a GROUP BY over the matching runs), so a page costs a few queries whatever
the number of runs. The filters are list_runs's."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from sqlalchemy import Engine, and_, case, distinct, func, literal, or_, select
from sqlalchemy.orm import aliased

from db.engine import connection_scope
from db.listing import MAX_PAGE, METRIC_SORT_PREFIX, SORT_COLUMNS
from db.listing import conditions as run_conditions
from db.models import MetricRollup, Run, Sweep
from db.rollup import WHOLE_SERIES_LEVEL
from db.run_records import load_runs
from db.sweeps import _sweep as sweep_record
from db.types import RunRecord, SweepRecord

SWEEP, GROUP, RUN = "sweep", "seed group", "run"
_PREFIX = {"s": SWEEP, "g": GROUP, "r": RUN}


@dataclass(frozen=True)
class Unit:
    kind: str  # SWEEP, GROUP or RUN
    id: str  # the sweep's, the group's or the run's id
    runs: int  # its runs that match the filters


@dataclass(frozen=True)
class UnitPage:
    units: tuple[Unit, ...]
    total: int  # rows that match
    runs: int  # runs that match
    limit: int
    offset: int


def _unit_key(by_sweep: bool) -> Any:
    """'s:<sweep id>', 'g:<group id>' or 'r:<run id>'. Filtered to one sweep, its seed groups are the rows."""
    whens = [(Run.group_id.is_not(None), literal("g:") + Run.group_id)]
    if by_sweep:
        whens.insert(0, (Run.sweep_id.is_not(None), literal("s:") + Run.sweep_id))
    return case(*whens, else_=literal("r:") + Run.id)


def _sort_source(sort: str) -> tuple[Any, Any]:
    """The column a row is sorted by (its runs' largest or smallest value) and the table to select it from."""
    if sort.startswith(METRIC_SORT_PREFIX):
        whole = aliased(MetricRollup)
        joined = Run.__table__.outerjoin(
            whole,
            and_(
                whole.run_id == Run.id, whole.level == WHOLE_SERIES_LEVEL, whole.key == sort[len(METRIC_SORT_PREFIX) :]
            ),
        )
        return whole.last_value, joined
    if sort not in SORT_COLUMNS:
        raise ValueError(f"cannot sort by {sort!r}; use one of {', '.join(SORT_COLUMNS)} or 'metric:<key>'")
    return SORT_COLUMNS[sort], Run.__table__


def list_units(
    engine: Engine,
    *,
    status: Sequence[str] = (),
    tag: Sequence[str] = (),
    owner: str | None = None,
    text: str | None = None,
    sweep_id: str | None = None,
    sort: str = "created_at",
    descending: bool = True,
    limit: int = 50,
    offset: int = 0,
    project: str | None = None,
) -> UnitPage:
    """One page of rows over the runs matching the filters (those of db.listing.list_runs, `project` too), sorted by
    their runs' largest value of `sort` (smallest when ascending), ties by key so that pages never overlap. A
    sweep's and a seed group's runs are all of one project (a run's project is its sweep's, a repeat's its run's)."""
    if not 1 <= limit <= MAX_PAGE:
        raise ValueError(f"limit must be between 1 and {MAX_PAGE}, got {limit}")
    conditions = run_conditions(tuple(status) or None, tuple(tag) or None, owner, text, None)
    if sweep_id is not None:
        conditions.append(Run.sweep_id == sweep_id)
    if project is not None:
        conditions.append(Run.project == project)
    column, source = _sort_source(sort)
    matching = (
        select(_unit_key(sweep_id is None).label("unit"), column.label("k"))
        .select_from(source)
        .where(*conditions)
        .subquery()
    )
    agg = func.max(matching.c.k) if descending else func.min(matching.c.k)
    order = (agg.desc() if descending else agg.asc()).nulls_last()
    page = (
        select(matching.c.unit, func.count().label("n"))
        .group_by(matching.c.unit)
        .order_by(order, matching.c.unit.desc() if descending else matching.c.unit.asc())
        .limit(limit)
        .offset(offset)
    )
    with connection_scope(engine) as conn:
        total, runs = conn.execute(
            select(func.count(distinct(matching.c.unit)), func.count()).select_from(matching)
        ).one()
        rows = conn.execute(page).all()
    units = tuple(Unit(_PREFIX[row.unit[0]], row.unit[2:], int(row.n)) for row in rows)
    return UnitPage(units=units, total=int(total), runs=int(runs), limit=limit, offset=offset)


@dataclass(frozen=True)
class Members:
    """The runs behind a page of rows, and the rows' sweeps."""

    runs: dict[Unit, list[RunRecord]]  # a sweep's runs by trial, a seed group's oldest first, or the run itself
    sweeps: dict[str, SweepRecord]  # by id


def members(engine: Engine, units: Sequence[Unit]) -> Members:
    """Each row's runs, all of them (not only those matching the filters): a sweep's by trial then creation, a seed
    group's oldest first, a run's itself; a row whose sweep or runs are gone is left out. A few queries for the
    whole page (the rows' run ids, the runs, the sweeps), however many rows it has."""
    ids = {kind: list(dict.fromkeys(u.id for u in units if u.kind == kind)) for kind in (SWEEP, GROUP, RUN)}
    whose = or_(Run.sweep_id.in_(ids[SWEEP]), Run.group_id.in_(ids[GROUP]), Run.id.in_(ids[RUN]))
    with connection_scope(engine) as conn:
        rows = conn.execute(select(Run.id, Run.sweep_id, Run.group_id, Run.trial, Run.created_at).where(whose)).all()
        found = load_runs(conn, [row.id for row in rows])
        sweeps = (
            {row.id: sweep_record(row) for row in conn.execute(select(Sweep.__table__).where(Sweep.id.in_(ids[SWEEP])))}
            if ids[SWEEP]
            else {}
        )
    by_unit: dict[tuple[str, str], list] = {}
    for row in sorted(rows, key=lambda row: (row.trial is not None, row.trial or 0, row.created_at, row.id)):
        for kind, key in ((SWEEP, row.sweep_id), (GROUP, row.group_id), (RUN, row.id)):
            by_unit.setdefault((kind, key), []).append(row.id)
    out = {}
    for u in units:
        runs = [found[i] for i in by_unit.get((u.kind, u.id), ()) if i in found]
        if runs and (u.kind != SWEEP or u.id in sweeps):
            out[u] = runs
    return Members(out, sweeps)


def load(engine: Engine, run_ids: Iterable[str]) -> dict[str, RunRecord]:
    """The runs that exist among these, by id (a few queries for the lot)."""
    with connection_scope(engine) as conn:
        return load_runs(conn, list(run_ids))
