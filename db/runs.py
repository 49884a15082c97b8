"""The run lifecycle: create, claim, heartbeat, cancel, finish, lose, delete.

Every state change is one conditional UPDATE (`... WHERE status IN (...)`)
whose row count says whether it happened, so two workers (or a worker and the
UI) racing on the same run cannot both win, on either backend.
"""

from __future__ import annotations

import math
import uuid
from collections.abc import Iterable, Mapping, Sequence
from datetime import timedelta
from typing import Any

from sqlalchemy import Connection, Engine, delete, func, literal, select, update
from sqlalchemy.orm import Session

from core.names import spec_hash
from core.redact import redact
from db.engine import connection_scope, session_scope
from db.errors import RunNotFound, RunStillActive
from db.metrics import IN_CHUNK, lock_run_for_append, summaries
from db.models import Artifact, Event, Metric, MetricRollup, Run, RunTag
from db.quota import check_queued
from db.types import (
    CLAIMABLE_STATUSES,
    FINISHED_STATUSES,
    NAME_LEN,
    NOTES_LEN,
    OWNER_LEN,
    RUN_STATUSES,
    TAG_LEN,
    WORKER_ID_LEN,
    HeartbeatReply,
    RunRecord,
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
) -> RunRecord:
    """Store a new `queued` run. `spec` is the validated RunSpec as plain JSON data. With `max_queued`,
    QueueLimitReached when the owner already has that many queued runs (counted in the same transaction)."""
    return create_runs(
        engine, [(spec, name)], owner=owner, tags=tags, parent_id=parent_id, max_queued=max_queued, group_id=group_id
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
) -> list[RunRecord]:
    """Store several `queued` runs, each (spec as JSON data, name or None), in one transaction: all or none.
    With `max_queued`, QueueLimitReached when the owner's queued runs and these would be more than that
    (counted in the same transaction: a seed group never overshoots the limit half-way)."""
    tag_list = check_tags(tags)
    rows = []
    for spec, name in runs:
        stored_spec, digest = spec_json(spec)
        run_id = new_id()
        name = readable_name(spec, run_id) if name is None else name.strip()
        _check_text("name", name, NAME_LEN)
        rows.append(
            Run(
                id=run_id,
                name=name,
                owner=owner,
                status="queued",
                spec=stored_spec,
                spec_hash=digest,
                created_at=utcnow(),
                attempt=0,
                summary={},
                parent_id=parent_id,
                cancel_requested=False,
                group_id=group_id,
            )
        )
    _check_text("owner", owner, OWNER_LEN)
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


def readable_name(spec: Mapping[str, Any], run_id: str) -> str:
    """The name of a run launched without one: its dataset, its model and the start of its id
    (`digits-simple_cnn-3fa2c1`); `run-3fa2c1` for a spec that names neither."""
    named = [
        s["name"].strip()
        for s in (spec.get("data"), spec.get("model"))
        if isinstance(s, Mapping) and isinstance(s.get("name"), str) and s["name"].strip()
    ]
    return "-".join([*(named or ["run"]), run_id[:6]])[-NAME_LEN:]


def _check_text(field: str, value: str, limit: int) -> None:
    if not isinstance(value, str) or not value.strip():
        raise ValueError(f"{field} must be a non-empty string, got {value!r}")
    if len(value) > limit:
        raise ValueError(f"{field} is {len(value)} characters long; the limit is {limit}")


def check_tags(tags: Iterable[str]) -> list[str]:
    """Tags stripped and de-duplicated, in order; each non-empty and short enough."""
    out: list[str] = []
    for tag in tags:
        _check_text("tag", tag, TAG_LEN)
        if tag.strip() not in out:
            out.append(tag.strip())
    return out


def set_tags(engine: Engine, run_id: str, tags: Iterable[str]) -> RunRecord:
    """Replace the run's tags."""
    tag_list = check_tags(tags)
    with session_scope(engine) as session:
        _write_tags(session, run_id, tag_list)
    return get_run(engine, run_id)


def _write_tags(session: Session, run_id: str, tag_list: list[str]) -> None:
    _require(session, run_id)
    session.execute(delete(RunTag).where(RunTag.run_id == run_id))
    session.add_all(RunTag(run_id=run_id, tag=tag) for tag in tag_list)


def check_notes(notes: str | None) -> str | None:
    """Notes as stored: None for none (empty or blank), else the text as written, at most NOTES_LEN characters."""
    if len(notes or "") > NOTES_LEN:
        raise ValueError(f"notes are {len(notes):,} characters long; the limit is {NOTES_LEN:,}: shorten them")
    if "\0" in (notes or ""):
        raise ValueError("notes contain a NUL character (\\0), which the database cannot store: remove it")
    return notes if notes and notes.strip() else None


def set_notes(engine: Engine, run_id: str, notes: str | None) -> RunRecord:
    """Replace the run's notes (plain text; empty clears them)."""
    stored = check_notes(notes)
    with session_scope(engine) as session:
        _write_notes(session, run_id, stored)
    return get_run(engine, run_id)


def _write_notes(session: Session, run_id: str, stored: str | None) -> None:
    if not _update(session, run_id, RUN_STATUSES, notes=stored):
        raise RunNotFound(run_id)


def set_tags_and_notes(engine: Engine, run_id: str, tags: Iterable[str], notes: str | None) -> RunRecord:
    """Replace the run's tags and its notes together: both checked before either is written, and written in one
    transaction (a refused or failed edit changes neither). ValueError for a bad tag or notes, RunNotFound."""
    tag_list, stored = check_tags(tags), check_notes(notes)
    with session_scope(engine) as session:
        _write_tags(session, run_id, tag_list)
        _write_notes(session, run_id, stored)
    return get_run(engine, run_id)


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
    )


def _require(session: Session, run_id: str) -> Run:
    run = session.get(Run, run_id)
    if run is None:
        raise RunNotFound(run_id)
    return run


def _update(session: Session, run_id: str, statuses: Sequence[str], **values: Any) -> bool:
    """One conditional UPDATE; True when this call changed the run."""
    stmt = (
        update(Run)
        .where(Run.id == run_id, Run.status.in_(statuses))
        .values(**values)
        .execution_options(synchronize_session=False)
    )
    return session.execute(stmt).rowcount == 1


def claim_run(engine: Engine, run_id: str, worker_id: str, device: str | None = None) -> RunRecord | None:
    """Atomically take a `queued` or `lost` run: `running`, attempt + 1.

    Returns None when the run is running elsewhere or finished (a run delivered
    twice runs once). Raises RunNotFound for an unknown run.
    """
    _check_text("worker_id", worker_id, WORKER_ID_LEN)
    now = utcnow()
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
            _require(session, run_id)
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
        run = _require(session, run_id)
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
            _require(session, run_id)
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
            _require(session, run_id)
            return None
    return get_run(engine, run_id)


def stale_runs(engine: Engine, older_than_s: float) -> list[RunRecord]:
    """Running runs whose last heartbeat is older than `older_than_s` seconds."""
    cutoff = utcnow() - timedelta(seconds=older_than_s)
    with connection_scope(engine) as conn:
        query = select(Run.id).where(Run.status == "running", Run.heartbeat_at < cutoff)
        ids = list(conn.execute(query.order_by(Run.heartbeat_at)).scalars())
        found = load_runs(conn, ids)
    return [found[run_id] for run_id in ids if run_id in found]


def mark_lost(engine: Engine, older_than_s: float) -> list[str]:
    """Mark running runs with a stale heartbeat `lost` (claimable again); their ids."""
    cutoff = utcnow() - timedelta(seconds=older_than_s)
    with session_scope(engine) as session:
        stmt = (
            update(Run)
            .where(Run.status == "running", Run.heartbeat_at < cutoff)
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
            ((Run.status == "queued") & (Run.created_at < cutoff))
            | ((Run.status == "lost") & (Run.heartbeat_at < cutoff))
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
            _require(session, run_id)
        return changed


def delete_run(engine: Engine, run_id: str, *, force: bool = False) -> list[str]:
    """Delete a run with its metrics, events, artifacts and tags; returns the
    artifact URIs, whose files the caller removes. Children keep existing
    (their parent link is cleared). A running run needs `force=True`; a lost
    run's process, if it still lives, finds its run gone and stops.

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
        uris = list(conn.execute(select(Artifact.uri).where(Artifact.run_id == run_id)).scalars())
        for model in (Metric, MetricRollup, Event, Artifact, RunTag):
            conn.execute(delete(model.__table__).where(model.__table__.c.run_id == run_id))
        conn.execute(update(Run.__table__).where(Run.parent_id == run_id).values(parent_id=None))
        gone = conn.execute(delete(Run.__table__).where(Run.id == run_id, Run.status.in_(deletable))).rowcount
        if gone != 1:  # cannot happen under the row lock; never delete half a run
            raise RunStillActive(run_id, "changing")
    return uris
