"""Follows: a person follows runs, and the dashboard tells them when one ends (app/ui/frame.py).

A follow is keyed by (owner, run): following twice is one follow, unfollowing what is not followed does
nothing. Deleting a run deletes its follows (the foreign key cascades, on both backends)."""

from __future__ import annotations

from datetime import datetime
from typing import NamedTuple

from sqlalchemy import Engine, delete, select
from sqlalchemy.dialects import postgresql, sqlite

from db.engine import connection_scope
from db.errors import RunNotFound
from db.models import Follow, Run
from db.types import OWNER_LEN, utcnow


class FollowedRun(NamedTuple):
    """A followed run as the frame needs it: enough to tell its end, without reading the run's spec."""

    run_id: str
    status: str
    name: str
    finished_at: datetime | None


def _check_owner(owner: str) -> None:
    if not 0 < len(owner) <= OWNER_LEN:
        raise ValueError(f"follower: 1 to {OWNER_LEN} characters")


def follow(engine: Engine, owner: str, run_id: str) -> bool:
    """`owner` follows the run; True when the follow is new. RunNotFound when there is no such run."""
    _check_owner(owner)
    insert = {"sqlite": sqlite.insert, "postgresql": postgresql.insert}[engine.dialect.name]
    with connection_scope(engine, write=True) as conn:
        # FOR SHARE on Postgres: the run cannot be deleted between this read and the insert.
        if conn.execute(select(Run.id).where(Run.id == run_id).with_for_update(read=True)).first() is None:
            raise RunNotFound(run_id)
        stmt = insert(Follow.__table__).values(owner=owner, run_id=run_id, created_at=utcnow())
        stmt = stmt.on_conflict_do_nothing(index_elements=["owner", "run_id"]).returning(Follow.run_id)
        return conn.execute(stmt).first() is not None  # RETURNING: psycopg's rowcount here may be -1


def unfollow(engine: Engine, owner: str, run_id: str) -> bool:
    """`owner` no longer follows the run; True when they did."""
    with connection_scope(engine, write=True) as conn:
        table = Follow.__table__
        return conn.execute(delete(table).where(table.c.owner == owner, table.c.run_id == run_id)).rowcount == 1


def followed(engine: Engine, owner: str) -> list[FollowedRun]:
    """The runs `owner` follows, oldest follow first, with each run's status, name and end (one query)."""
    query = (
        select(Run.id, Run.status, Run.name, Run.finished_at)
        .join(Follow, Follow.run_id == Run.id)
        .where(Follow.owner == owner)
        .order_by(Follow.created_at, Follow.run_id)
    )
    with connection_scope(engine) as conn:
        return [FollowedRun(*row) for row in conn.execute(query)]
