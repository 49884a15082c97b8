"""Runs read back as RunRecords: one by id, several by id, or the rows a query found completed with their tags
and metric summaries, in a fixed number of queries however many runs."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from sqlalchemy import Connection, Engine, select
from sqlalchemy.orm import Session

from db.engine import connection_scope
from db.errors import RunNotFound
from db.metrics import IN_CHUNK, summaries
from db.models import Run, RunTag
from db.types import RunRecord


def get_run(engine: Engine, run_id: str) -> RunRecord:
    """The run with its tags and metric summaries; RunNotFound if there is none."""
    with connection_scope(engine) as conn:
        found = load_runs(conn, [run_id])
    if run_id not in found:
        raise RunNotFound(run_id)
    return found[run_id]


def load_runs(conn: Connection, run_ids: Sequence[str]) -> dict[str, RunRecord]:
    """Runs by id with tags and summaries: three queries however many runs."""
    rows: list[Any] = []
    for start in range(0, len(run_ids), IN_CHUNK):
        chunk = list(run_ids[start : start + IN_CHUNK])
        rows += conn.execute(select(Run.__table__).where(Run.id.in_(chunk))).all()
    return records(conn, rows)


def records(conn: Connection, rows: Sequence[Any]) -> dict[str, RunRecord]:
    """Run rows completed with their tags and metric summaries (two queries)."""
    ids = [row.id for row in rows]
    tags: dict[str, list[str]] = {run_id: [] for run_id in ids}
    for start in range(0, len(ids), IN_CHUNK):
        query = select(RunTag.run_id, RunTag.tag).where(RunTag.run_id.in_(ids[start : start + IN_CHUNK]))
        for run_id, tag in conn.execute(query.order_by(RunTag.tag)):
            tags[run_id].append(tag)
    metrics = summaries(conn, ids)
    return {row.id: to_record(row, tags[row.id], metrics[row.id]) for row in rows}


def to_record(row: Any, tags: Sequence[str], metrics: Mapping[str, Any]) -> RunRecord:
    return RunRecord(
        id=row.id,
        name=row.name,
        owner=row.owner,
        status=row.status,
        spec=row.spec,
        spec_hash=row.spec_hash,
        created_at=row.created_at,
        started_at=row.started_at,
        finished_at=row.finished_at,
        heartbeat_at=row.heartbeat_at,
        worker_id=row.worker_id,
        device=row.device,
        attempt=row.attempt,
        progress=row.progress,
        summary=row.summary or {},
        error=row.error,
        tags=tuple(tags),
        parent_id=row.parent_id,
        cancel_requested=bool(row.cancel_requested),
        degraded=row.degraded,
        sweep_id=row.sweep_id,
        trial=row.trial,
        group_id=row.group_id,
        metrics=metrics,
        notes=row.notes or "",
        priority=row.priority or 0,
        project=row.project,
        source=row.source,
    )


def require_run(session: Session, run_id: str) -> Run:
    """The run's row, or RunNotFound."""
    run = session.get(Run, run_id)
    if run is None:
        raise RunNotFound(run_id)
    return run
