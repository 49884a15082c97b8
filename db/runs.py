"""The run lifecycle: create, claim, heartbeat, cancel, finish, lose, delete. Runs are read back by
db/run_records.py; their tags and notes are written by db/run_labels.py.

Every state change is one conditional UPDATE (`... WHERE status IN (...)`)
whose row count says whether it happened, so two workers (or a worker and the
UI) racing on the same run cannot both win, on either backend.
"""

from __future__ import annotations

import math
import uuid
from collections.abc import Iterable, Mapping, Sequence
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import Engine, delete, func, literal, select, update
from sqlalchemy.orm import Session

from core.names import PRIORITIES, queue_of, spec_hash
from core.redact import redact
from db.engine import connection_scope, session_scope
from db.errors import RunNotFound, RunRegistered, RunStillActive
from db.metrics import lock_run_for_append
from db.models import Artifact, Event, Metric, MetricRollup, Run, RunTag
from db.quota import check_queued
from db.registry_tables import ModelVersion
from db.run_labels import check_tags
from db.run_records import get_run, load_runs, require_run
from db.types import (
    CLAIMABLE_STATUSES,
    DEFAULT_PROJECT,
    FINISHED_STATUSES,
    NAME_LEN,
    OWNER_LEN,
    RUN_STATUSES,
    WORKER_ID_LEN,
    HeartbeatReply,
    RunRecord,
    check_text,
    json_safe,
    utcnow,
)

_FINISHABLE = ("queued", "running", "lost")


def new_id() -> str:
    """A short opaque id (48 random bits): fine for URLs, never a path."""
    return uuid.uuid4().hex[:12]


def new_group_id() -> str:
    """A seed group's id: runs that differ only by seed share it."""
    return new_id()


def spec_json(spec: Mapping[str, Any]) -> tuple[dict[str, Any], str]:
    """The spec as stored, and its hash (core.names.spec_hash: canonical JSON, the name left out)."""
    return json_safe(spec), spec_hash(spec)


def create_run(
    engine: Engine,
    spec: Mapping[str, Any],
    *,
    name: str | None = None,
    owner: str = "local",
    tags: Iterable[str] = (),
    parent_id: str | None = None,
    max_queued: int | None = None,
    group_id: str | None = None,
    priority: int = 0,
    project: str = DEFAULT_PROJECT,
) -> RunRecord:
    """Store a new `queued` run. `spec` is the validated RunSpec as plain JSON data. With `max_queued`,
    QueueLimitReached when the owner already has that many queued runs (counted in the same transaction)."""
    return create_runs(
        engine,
        [(spec, name)],
        owner=owner,
        tags=tags,
        parent_id=parent_id,
        max_queued=max_queued,
        group_id=group_id,
        priority=priority,
        project=project,
    )[0]


def create_runs(
    engine: Engine,
    runs: Sequence[tuple[Mapping[str, Any], str | None]],
    *,
    owner: str = "local",
    tags: Iterable[str] = (),
    parent_id: str | None = None,
    max_queued: int | None = None,
    group_id: str | None = None,
    priority: int = 0,
    project: str = DEFAULT_PROJECT,
) -> list[RunRecord]:
    """Store several `queued` runs, each (spec as JSON data, name or None), in one transaction: all or none.
    With `max_queued`, QueueLimitReached when the owner's queued runs and these would be more than that
    (counted in the same transaction: a seed group never overshoots the limit half-way). `priority`: one of
    core.names.PRIORITIES' values, the runs' place in their queue (db/queue_order.py)."""
    tag_list = check_tags(tags)
    if priority not in PRIORITIES.values():
        raise ValueError(f"priority {priority!r}: one of {sorted(PRIORITIES.values())} ({', '.join(PRIORITIES)})")
    rows = [
        queued_row(
            spec,
            None if name is None else name.strip(),
            owner,
            parent_id=parent_id,
            group_id=group_id,
            priority=priority,
            project=project,
        )
        for spec, name in runs
    ]
    check_text("owner", owner, OWNER_LEN)
    with session_scope(engine) as session:
        if parent_id is not None and session.get(Run, parent_id) is None:
            raise RunNotFound(parent_id)
        if max_queued is not None:
            check_queued(session, owner, max_queued, adding=len(rows))
        session.add_all(rows)
        session.flush()  # the run rows must exist before their tags reference them
        session.add_all(RunTag(run_id=row.id, tag=tag) for row in rows for tag in tag_list)
    with connection_scope(engine) as conn:
        found = load_runs(conn, [row.id for row in rows])
    return [found[row.id] for row in rows]


def queued_row(spec: Mapping[str, Any], name: str | None, owner: str, **links: Any) -> Run:
    """A new `queued` run's row, not yet added: the spec as stored with its hash, a fresh id, the name checked
    (None: readable_name's). `links` are the columns that place it: parent_id, group_id, sweep_id, trial."""
    stored_spec, digest = spec_json(spec)
    run_id = new_id()
    name = readable_name(spec, run_id) if name is None else name
    check_text("name", name, NAME_LEN)
    return Run(
        id=run_id,
        name=name,
        owner=owner,
        status="queued",
        spec=stored_spec,
        spec_hash=digest,
        created_at=utcnow(),
        attempt=0,
        summary={},
        cancel_requested=False,
        queue=queue_of(spec),
        **links,
    )


def readable_name(spec: Mapping[str, Any], run_id: str) -> str:
    """The name of a run launched without one: its dataset, its model and the start of its id
    (`digits-simple_cnn-3fa2c1`); `run-3fa2c1` for a spec that names neither."""
    named = [
        s["name"].strip()
        for s in (spec.get("data"), spec.get("model"))
        if isinstance(s, Mapping) and isinstance(s.get("name"), str) and s["name"].strip()
    ]
    return "-".join([*(named or ["run"]), run_id[:6]])[-NAME_LEN:]


def _update(session: Session, run_id: str, statuses: Sequence[str], **values: Any) -> bool:
    """One conditional UPDATE; True when this call changed the run."""
    stmt = (
        update(Run)
        .where(Run.id == run_id, Run.status.in_(statuses))
        .values(**values)
        .execution_options(synchronize_session=False)
    )
    return session.execute(stmt).rowcount == 1


def claim_run(
    engine: Engine, run_id: str, worker_id: str, device: str | None = None, *, now: datetime | None = None
) -> RunRecord | None:
    """Atomically take a `queued` or `lost` run: `running`, attempt + 1 (started and heartbeat at `now`, default
    the present: a simulation passes its own clock).

    Returns None when the run is running elsewhere or finished (a run delivered
    twice runs once). Raises RunNotFound for an unknown run.
    """
    check_text("worker_id", worker_id, WORKER_ID_LEN)
    now = now or utcnow()
    with session_scope(engine) as session:
        claimed = _update(
            session,
            run_id,
            CLAIMABLE_STATUSES,
            status="running",
            attempt=Run.attempt + 1,
            worker_id=worker_id,
            device=device,
            # A resumed run keeps the time it first started.
            started_at=func.coalesce(Run.started_at, literal(now, Run.started_at.type)),
            heartbeat_at=now,
            finished_at=None,
            error=None,
        )
        if not claimed:
            require_run(session, run_id)
            return None
    return get_run(engine, run_id)


def heartbeat(
    engine: Engine, run_id: str, *, worker_id: str | None = None, progress: float | None = None
) -> HeartbeatReply:
    """Record that the run is alive (and its progress, 0..1); say whether to stop.

    With `worker_id`, only that worker's heartbeat counts, and it brings back a
    run the UI had marked `lost` while the worker was merely slow.
    """
    if progress is not None and not (math.isfinite(progress) and 0.0 <= progress <= 1.0):
        raise ValueError(f"progress must be a fraction between 0 and 1, got {progress!r}")
    values: dict[str, Any] = {"heartbeat_at": utcnow(), "status": "running"}
    if progress is not None:
        values["progress"] = progress
    statuses = ("running", "lost") if worker_id is not None else ("running",)
    with session_scope(engine) as session:
        stmt = (
            update(Run)
            .where(Run.id == run_id, Run.status.in_(statuses))
            .values(**values)
            .execution_options(synchronize_session=False)
        )
        if worker_id is not None:
            stmt = stmt.where(Run.worker_id == worker_id)
        owned = session.execute(stmt).rowcount == 1
        run = require_run(session, run_id)
        return HeartbeatReply(cancel_requested=bool(run.cancel_requested), owned=owned)


def request_cancel(engine: Engine, run_id: str) -> RunRecord:
    """Cancel a run: a queued (or lost) run is cancelled at once; a running one is
    asked to stop (`cancel_requested`) and its worker finishes it. Finished runs
    are left as they are."""
    with session_scope(engine) as session:
        done = _update(
            session,
            run_id,
            CLAIMABLE_STATUSES,
            status="cancelled",
            cancel_requested=True,
            finished_at=utcnow(),
        )
        if not done:
            _update(session, run_id, ("running",), cancel_requested=True)
            require_run(session, run_id)
    return get_run(engine, run_id)


def finish_run(
    engine: Engine,
    run_id: str,
    status: str,
    *,
    summary: Mapping[str, Any] | None = None,
    error: str | None = None,
    worker_id: str | None = None,
    only_from: Sequence[str] = _FINISHABLE,
) -> RunRecord | None:
    """End a run with a final status, summary (best metric, final figures) and error.

    Returns None, changing nothing, when the run had already finished, is no
    longer in one of `only_from` (a reaper ends only a run still `lost`, never
    one a worker claimed since), or (with `worker_id`) another worker has
    claimed it since.
    """
    if not set(only_from) <= set(_FINISHABLE):
        raise ValueError(f"only_from {tuple(only_from)}: a run is finished from {_FINISHABLE} only")
    if status not in FINISHED_STATUSES:
        raise ValueError(f"status {status!r} does not finish a run; use one of {FINISHED_STATUSES}")
    values: dict[str, Any] = {
        "status": status,
        "finished_at": utcnow(),
        "error": None if error is None else redact(error),
    }
    if summary is not None:
        values["summary"] = json_safe(summary)
    if status == "completed":
        values["progress"] = 1.0
    with session_scope(engine) as session:
        stmt = (
            update(Run)
            .where(Run.id == run_id, Run.status.in_(tuple(only_from)))
            .values(**values)
            .execution_options(synchronize_session=False)
        )
        if worker_id is not None:
            stmt = stmt.where(Run.worker_id == worker_id)
        if session.execute(stmt).rowcount != 1:
            require_run(session, run_id)
            return None
    return get_run(engine, run_id)


def stale_runs(engine: Engine, older_than_s: float) -> list[RunRecord]:
    """Running runs whose last heartbeat is older than `older_than_s` seconds."""
    cutoff = utcnow() - timedelta(seconds=older_than_s)
    with connection_scope(engine) as conn:
        query = select(Run.id).where(Run.source == "torchdeck", Run.status == "running", Run.heartbeat_at < cutoff)
        ids = list(conn.execute(query.order_by(Run.heartbeat_at)).scalars())
        found = load_runs(conn, ids)
    return [found[run_id] for run_id in ids if run_id in found]


def mark_lost(engine: Engine, older_than_s: float) -> list[str]:
    """Mark running runs with a stale heartbeat `lost` (claimable again); their ids. Runs of scripts are not
    torchdeck's to re-run: db.external.mark_silent."""
    cutoff = utcnow() - timedelta(seconds=older_than_s)
    with session_scope(engine) as session:
        stmt = (
            update(Run)
            .where(Run.source == "torchdeck", Run.status == "running", Run.heartbeat_at < cutoff)
            .values(status="lost")
            .returning(Run.id)
            .execution_options(synchronize_session=False)
        )
        return sorted(session.execute(stmt).scalars())


def unclaimed_runs(engine: Engine, older_than_s: float, limit: int = 10_000) -> list[RunRecord]:
    """Runs waiting for a worker for longer than `older_than_s`: `queued` ones by creation time, `lost`
    ones by their last heartbeat. The reaper checks that each still has a message in the broker (a
    Redis restarted without persistence, or a reaper that died before sending, leaves none)."""
    cutoff = utcnow() - timedelta(seconds=older_than_s)
    query = (
        select(Run.id)
        .where(
            Run.source == "torchdeck",
            ((Run.status == "queued") & (Run.created_at < cutoff))
            | ((Run.status == "lost") & (Run.heartbeat_at < cutoff)),
        )
        .order_by(Run.created_at)
        .limit(limit)
    )
    with connection_scope(engine) as conn:
        ids = list(conn.execute(query).scalars())
        found = load_runs(conn, ids)
    return [found[run_id] for run_id in ids if run_id in found]


def mark_degraded(engine: Engine, run_id: str, reason: str) -> bool:
    """Record why a run's stored record may be incomplete (the first reason is kept); True if newly marked."""
    with session_scope(engine) as session:
        stmt = (
            update(Run)
            .where(Run.id == run_id, Run.degraded.is_(None))
            .values(degraded=reason[:2000])
            .execution_options(synchronize_session=False)
        )
        changed = session.execute(stmt).rowcount == 1
        if not changed:
            require_run(session, run_id)
        return changed


def delete_run(engine: Engine, run_id: str, *, force: bool = False) -> list[str]:
    """Delete a run with its metrics, events, artifacts and tags; returns the
    artifact URIs, whose files the caller removes. Children keep existing
    (their parent link is cleared). A running run needs `force=True`; a lost
    run's process, if it still lives, finds its run gone and stops. A run whose
    exports are versions of registered models is refused (RunRegistered).

    The run's row is locked first (Postgres: FOR UPDATE; SQLite: the write
    lock of BEGIN IMMEDIATE) and the final DELETE is conditional on the status
    read, so a worker claiming the run concurrently either claims it before
    (and the delete is refused) or finds it gone.
    """
    deletable = tuple(RUN_STATUSES) if force else tuple(s for s in RUN_STATUSES if s != "running")
    with connection_scope(engine, write=True) as conn:
        lock_run_for_append(conn, run_id)  # no append may interleave with the delete
        status = conn.execute(select(Run.status).where(Run.id == run_id).with_for_update()).scalar_one()
        if status not in deletable:
            raise RunStillActive(run_id, status)
        held = conn.execute(
            select(ModelVersion.model_name, ModelVersion.version).where(ModelVersion.run_id == run_id)
        ).all()
        if held:
            raise RunRegistered(run_id, [f"{name} v{version}" for name, version in held])
        uris = list(conn.execute(select(Artifact.uri).where(Artifact.run_id == run_id)).scalars())
        for model in (Metric, MetricRollup, Event, Artifact, RunTag):
            conn.execute(delete(model.__table__).where(model.__table__.c.run_id == run_id))
        conn.execute(update(Run.__table__).where(Run.parent_id == run_id).values(parent_id=None))
        gone = conn.execute(delete(Run.__table__).where(Run.id == run_id, Run.status.in_(deletable))).rowcount
        if gone != 1:  # cannot happen under the row lock; never delete half a run
            raise RunStillActive(run_id, "changing")
    return uris
