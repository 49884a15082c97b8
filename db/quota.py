"""The per-person limit of queued runs (TORCHDECK_MAX_QUEUED_PER_OWNER, applied by the dashboard's gate and by
a sweep's controller): counted in the transaction that stores the new runs, so that concurrent submissions
by one owner never overshoot it."""

from __future__ import annotations

from sqlalchemy import Connection, Engine, func, select
from sqlalchemy.orm import Session

from db.engine import connection_scope
from db.errors import QueueLimitReached
from db.models import Run


def check_queued(session: Session, owner: str, limit: int, adding: int = 1) -> None:
    """QueueLimitReached when the owner's queued runs and `adding` more would be over `limit`. Concurrent
    submissions by one owner count one after the other: SQLite serialises writers, and Postgres takes a
    per-owner transaction lock first (held until the caller's transaction ends, its new runs stored)."""
    if session.get_bind().dialect.name == "postgresql":
        session.execute(select(func.pg_advisory_xact_lock(func.hashtext(f"queued:{owner}"))))
    queued = _queued(session, owner)
    if queued + adding > limit:
        raise QueueLimitReached(owner, queued, limit, adding)


def _queued(session_or_conn: Session | Connection, owner: str) -> int:
    return session_or_conn.execute(
        select(func.count()).select_from(Run).where(Run.owner == owner, Run.status == "queued")
    ).scalar_one()


def queued_count(engine: Engine, owner: str) -> int:
    """How many queued runs `owner` has now (a hint: the count that decides is taken where runs are stored)."""
    with connection_scope(engine) as conn:
        return _queued(conn, owner)
