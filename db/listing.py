"""The runs table of the dashboard: filters, sort, pagination, summary metrics.

A page costs four queries whatever its size (count, the page of runs, their
tags, their summaries): never one query per run.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from sqlalchemy import Engine, and_, exists, func, or_, select
from sqlalchemy.orm import aliased

from db import filters
from db.engine import connection_scope
from db.models import MetricRollup, Run, RunTag
from db.rollup import WHOLE_SERIES_LEVEL
from db.run_records import records
from db.types import RUN_STATUSES, RunPage

SORT_COLUMNS = {
    "created_at": Run.created_at,
    "started_at": Run.started_at,
    "finished_at": Run.finished_at,
    "heartbeat_at": Run.heartbeat_at,
    "name": Run.name,
    "owner": Run.owner,
    "status": Run.status,
    "attempt": Run.attempt,
}
NULLABLE_SORTS = frozenset(k for k, c in SORT_COLUMNS.items() if c.nullable)
METRIC_SORT_PREFIX = "metric:"  # "metric:val/acc" sorts by that metric's last value
MAX_PAGE = 1000


def list_runs(
    engine: Engine,
    *,
    status: str | Iterable[str] | None = None,
    tag: str | Iterable[str] | None = None,
    owner: str | None = None,
    text: str | None = None,
    parent_id: str | None = None,
    sweep_id: str | None = None,
    group_id: str | None = None,
    project: str | None = None,
    source: str | None = None,
    expression: str | None = None,
    sort: str = "created_at",
    descending: bool = True,
    limit: int = 50,
    offset: int = 0,
) -> RunPage:
    """One page of runs matching every filter given, with the total that match.

    `sweep_id`, `group_id` and `project` keep a sweep's trials, a seed group's runs, a project's
    runs; `source` those torchdeck runs ("torchdeck") or those scripts log ("mlflow"). `status` and `tag` take one
    value or several (any of the statuses; all of the tags). `text` matches a part of the name, of a tag or of the notes
    (any case) or the start of the id. `expression` is a filter expression
    (db.filters: `val/acc > 0.9 and optim.lr <= 1e-3`; FilterError when it
    cannot be read). `sort` is a column in SORT_COLUMNS or "metric:<key>";
    runs without a value sort last either way, and ties are broken by id so
    that pages never overlap.
    """
    if not 1 <= limit <= MAX_PAGE:
        raise ValueError(f"limit must be between 1 and {MAX_PAGE}, got {limit}")
    if offset < 0:
        raise ValueError(f"offset must be 0 or more, got {offset}")
    where = conditions(status, tag, owner, text, parent_id, expression=expression)
    if sweep_id is not None:
        where.append(Run.sweep_id == sweep_id)
    if group_id is not None:
        where.append(Run.group_id == group_id)
    if project is not None:
        where.append(Run.project == project)
    if source is not None:
        where.append(Run.source == source)
    page_query = select(Run.__table__).where(*where)
    page_query = _ordered(page_query, sort, descending).limit(limit).offset(offset)
    with connection_scope(engine) as conn:
        total = conn.execute(select(func.count()).select_from(Run).where(*where)).scalar_one()
        rows = conn.execute(page_query).all()
        runs = records(conn, rows)
    return RunPage(runs=tuple(runs[row.id] for row in rows), total=total, limit=limit, offset=offset)


def _as_tuple(value: str | Iterable[str] | None) -> tuple[str, ...]:
    if value is None:
        return ()
    return (value,) if isinstance(value, str) else tuple(value)


def conditions(
    status: str | Iterable[str] | None,
    tag: str | Iterable[str] | None,
    owner: str | None,
    text: str | None,
    parent_id: str | None,
    *,
    expression: str | None = None,
) -> list[Any]:
    conditions: list[Any] = filters.conditions(expression)
    statuses = _as_tuple(status)
    unknown = [s for s in statuses if s not in RUN_STATUSES]
    if unknown:
        raise ValueError(f"unknown run status {unknown[0]!r}; known: {', '.join(RUN_STATUSES)}")
    if statuses:
        conditions.append(Run.status.in_(statuses))
    for one_tag in _as_tuple(tag):
        conditions.append(Run.id.in_(select(RunTag.run_id).where(RunTag.tag == one_tag)))
    if owner is not None:
        conditions.append(Run.owner == owner)
    if parent_id is not None:
        conditions.append(Run.parent_id == parent_id)
    if text is not None and text.strip():
        needle = text.strip()
        conditions.append(
            or_(
                Run.name.icontains(needle, autoescape=True),
                Run.id.startswith(needle.lower(), autoescape=True),
                Run.notes.icontains(needle, autoescape=True),
                exists().where(RunTag.run_id == Run.id, RunTag.tag.icontains(needle, autoescape=True)),
            )
        )
    return conditions


def _ordered(query: Any, sort: str, descending: bool) -> Any:
    if sort.startswith(METRIC_SORT_PREFIX):
        key = sort[len(METRIC_SORT_PREFIX) :]
        whole = aliased(MetricRollup)
        query = query.outerjoin(
            whole,
            and_(
                whole.run_id == Run.id,
                whole.level == WHOLE_SERIES_LEVEL,
                whole.key == key,
            ),
        )
        column: Any = whole.last_value
    elif sort in SORT_COLUMNS:
        column = SORT_COLUMNS[sort]
    else:
        raise ValueError(f"cannot sort by {sort!r}; use one of {', '.join(SORT_COLUMNS)} or 'metric:<key>'")
    ordering = column.desc() if descending else column.asc()
    if sort in NULLABLE_SORTS or sort.startswith(METRIC_SORT_PREFIX):
        # Same order on both backends: SQLite and Postgres disagree on where NULLs go.
        ordering = ordering.nulls_last()
    # A column that is never NULL is ordered plainly: the database then reads the page from an index
    # (ix_run_created_at_id for the default order) instead of sorting every matching run.
    return query.order_by(ordering, Run.id.desc() if descending else Run.id.asc())


def owners_and_tags(engine: Engine, project: str | None = None) -> tuple[list[str], list[str]]:
    """Every owner and every tag in use (in one project's runs, or in all), sorted: the Runs page's filter
    choices."""
    owners_q, tags_q = select(Run.owner).distinct(), select(RunTag.tag).distinct()
    if project is not None:
        owners_q = owners_q.where(Run.project == project)
        tags_q = tags_q.join(Run, Run.id == RunTag.run_id).where(Run.project == project)
    with connection_scope(engine) as conn:
        owners = sorted(conn.execute(owners_q).scalars())
        tags = sorted(conn.execute(tags_q).scalars())
    return owners, tags
