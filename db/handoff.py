"""A run its own worker gives back at once: `lost` (claimable again) without waiting for its heartbeat to go
stale, because the worker knows the run cannot go on in this attempt but can resume from its checkpoint (one of
the processes of a multi-process run died). The reaper's path (db.runs.mark_lost) stays for workers that die."""

from __future__ import annotations

from sqlalchemy import Engine, update

from db.engine import session_scope
from db.errors import RunNotFound
from db.models import Run
from db.types import utcnow


def mark_run_lost(engine: Engine, run_id: str, *, worker_id: str) -> bool:
    """Mark the running run of `worker_id` `lost` now; False, changing nothing, when it is no longer that
    worker's running run (claimed elsewhere, finished). Raises RunNotFound for an unknown run."""
    with session_scope(engine) as session:
        stmt = (
            update(Run)
            .where(Run.id == run_id, Run.status == "running", Run.worker_id == worker_id)
            .values(status="lost", heartbeat_at=utcnow())
            .execution_options(synchronize_session=False)
        )
        if session.execute(stmt).rowcount == 1:
            return True
        if session.get(Run, run_id) is None:
            raise RunNotFound(run_id)
        return False
