"""Events, artifacts, workers and uploaded datasets."""

from __future__ import annotations

import secrets
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from sqlalchemy import Engine, delete, insert, select

from core.redact import redact, redact_data
from db.engine import connection_scope, session_scope
from db.errors import DatasetNotFound, RunNotFound
from db.metrics import IN_CHUNK, lock_run_for_append
from db.models import Account, Dataset, Event, Run, Worker
from db.types import (
    DATASET_STATUSES,
    DEFAULT_PROJECT,
    EMAIL_LEN,
    EVENT_KEY_LEN,
    EVENT_LEVELS,
    NAME_LEN,
    OWNER_LEN,
    WORKER_ID_LEN,
    AccountRecord,
    DatasetRecord,
    EventInput,
    EventRecord,
    WorkerRecord,
    json_safe,
    utcnow,
)

MAX_EVENTS_PAGE = 10_000


def append_events(engine: Engine, run_id: str, events: Iterable[EventInput], *, worker_id: str | None = None) -> int:
    """Store events of one run in one transaction; returns how many were new.

    An event whose `key` the run already has is ignored (a resumed attempt replaying a step). With
    `worker_id`, nothing is written unless that worker still owns the run (NotOwned). Raises
    ValueError for a malformed event before anything is written (see `event_problem`).
    """
    now = utcnow()
    rows: list[dict[str, Any]] = []
    for event in events:
        problem = event_problem(event)
        if problem:
            raise ValueError(problem)
        rows.append(
            {
                "run_id": run_id,
                "time": event.time or now,
                "kind": event.kind,
                "level": event.level,
                "code": event.code,
                "message": redact(event.message),
                "data": redact_data(json_safe(event.data)) if event.data is not None else None,
                "key": event.key,
            }
        )
    with connection_scope(engine, write=True) as conn:
        lock_run_for_append(conn, run_id, worker_id)
        if not rows:
            return 0
        keyed = [r for r in rows if r["key"] is not None]
        plain = [r for r in rows if r["key"] is None]
        if plain:
            conn.execute(insert(Event), plain)
        if not keyed:
            return len(plain)
        # Keys already stored are left out here (portable); ON CONFLICT covers a key repeated in the batch.
        wanted, known = [r["key"] for r in keyed], set()
        for start in range(0, len(wanted), IN_CHUNK):
            query = select(Event.key).where(Event.run_id == run_id, Event.key.in_(wanted[start : start + IN_CHUNK]))
            known.update(conn.execute(query).scalars())
        fresh = list({r["key"]: r for r in reversed(keyed) if r["key"] not in known}.values())[::-1]
        if fresh:
            conn.execute(insert(Event), fresh)
        return len(plain) + len(fresh)


def event_problem(event: EventInput) -> str | None:
    """Why the store would refuse this event, or None."""
    if event.level not in EVENT_LEVELS:
        return f"event level {event.level!r}: use one of {', '.join(EVENT_LEVELS)}"
    if not event.kind or len(event.kind) > 32:
        return f"event kind {str(event.kind)[:40]!r}: 1 to 32 characters"
    if event.code is not None and len(event.code) > 64:
        return f"event code {event.code[:40]!r}...: at most 64 characters"
    if event.key is not None and not 0 < len(event.key) <= EVENT_KEY_LEN:
        return f"event key {event.key[:40]!r}...: 1 to {EVENT_KEY_LEN} characters"
    return None


def list_events(
    engine: Engine,
    run_id: str,
    *,
    after_id: int = 0,
    level: str | None = None,
    limit: int = 1000,
    kind: str | None = None,
) -> list[EventRecord]:
    """The run's events in order; `after_id` (the last id seen) gives only newer ones, `level` and `kind` only
    those of that level and kind."""
    if not 1 <= limit <= MAX_EVENTS_PAGE:
        raise ValueError(f"limit must be between 1 and {MAX_EVENTS_PAGE}, got {limit}")
    query = select(Event).where(Event.run_id == run_id, Event.id > after_id)
    if level is not None:
        query = query.where(Event.level == level)
    if kind is not None:
        query = query.where(Event.kind == kind)
    with session_scope(engine, write=False) as session:
        if session.get(Run, run_id) is None:
            raise RunNotFound(run_id)
        found = session.execute(query.order_by(Event.id).limit(limit)).scalars()
        return [
            EventRecord(
                id=e.id,
                run_id=e.run_id,
                time=e.time,
                kind=e.kind,
                level=e.level,
                code=e.code,
                message=e.message,
                data=e.data,
            )
            for e in found
        ]


def get_row(engine: Engine, model: type, key: str, missing: type[LookupError], record: Any) -> Any:
    """The record of one row by primary key, or `missing(key)`."""
    with session_scope(engine, write=False) as session:
        row = session.get(model, key)
        if row is None:
            raise missing(key)
        return record(row)


def upsert_worker(
    engine: Engine,
    worker_id: str,
    *,
    hostname: str,
    queues: Sequence[str] = (),
    devices: Sequence[Mapping[str, Any]] = (),
    current_run_id: str | None = None,
) -> WorkerRecord:
    """Register a worker or refresh its heartbeat, queues, devices and current run."""
    if not worker_id or len(worker_id) > WORKER_ID_LEN:
        raise ValueError(f"worker id {worker_id!r}: 1 to {WORKER_ID_LEN} characters")
    now = utcnow()
    with session_scope(engine) as session:
        worker = session.get(Worker, worker_id)
        if worker is None:
            worker = Worker(id=worker_id, started_at=now)
            session.add(worker)
        worker.hostname = hostname[:NAME_LEN]
        worker.queues = list(queues)
        worker.devices = json_safe([dict(d) for d in devices])
        worker.heartbeat_at = now
        worker.current_run_id = current_run_id
        session.flush()
        return _worker(worker)


def list_workers(engine: Engine) -> list[WorkerRecord]:
    """All registered workers, most recently seen first."""
    with session_scope(engine, write=False) as session:
        found = session.execute(select(Worker).order_by(Worker.heartbeat_at.desc())).scalars()
        return [_worker(w) for w in found]


def remove_worker(engine: Engine, worker_id: str) -> bool:
    with session_scope(engine) as session:
        return session.execute(delete(Worker).where(Worker.id == worker_id)).rowcount == 1


def _worker(w: Worker) -> WorkerRecord:
    return WorkerRecord(
        id=w.id,
        hostname=w.hostname,
        queues=tuple(w.queues),
        devices=tuple(w.devices),
        started_at=w.started_at,
        heartbeat_at=w.heartbeat_at,
        current_run_id=w.current_run_id,
    )


def create_dataset(
    engine: Engine,
    name: str,
    uri: str,
    *,
    classes: Sequence[str] = (),
    counts: Mapping[str, int] | None = None,
    status: str = "pending",
    owner: str | None = None,
    project: str = DEFAULT_PROJECT,
) -> DatasetRecord:
    """Register an uploaded dataset. Names are unique: a second one raises ValueError."""
    _check_dataset(name, status)
    if owner is not None and not 0 < len(owner) <= OWNER_LEN:
        raise ValueError(f"dataset owner: 1 to {OWNER_LEN} characters")
    with session_scope(engine) as session:
        if session.execute(select(Dataset.id).where(Dataset.name == name)).first() is not None:
            raise ValueError(f"a dataset named {name!r} already exists")
        dataset = Dataset(
            id=secrets.token_hex(6),
            name=name,
            uri=uri,
            classes=list(classes),
            counts=dict(counts or {}),
            status=status,
            error=None,
            created_at=utcnow(),
            owner=owner,
            project=project,
        )
        session.add(dataset)
        session.flush()
        return _dataset(dataset)


def update_dataset(
    engine: Engine,
    dataset_id: str,
    *,
    status: str | None = None,
    classes: Sequence[str] | None = None,
    counts: Mapping[str, int] | None = None,
    error: str | None = None,
) -> DatasetRecord:
    """Change what is known of a dataset (after its upload was checked, say)."""
    with session_scope(engine) as session:
        dataset = session.get(Dataset, dataset_id)
        if dataset is None:
            raise DatasetNotFound(dataset_id)
        if status is not None:
            _check_dataset(dataset.name, status)
            dataset.status = status
        if classes is not None:
            dataset.classes = list(classes)
        if counts is not None:
            dataset.counts = dict(counts)
        dataset.error = error
        session.flush()
        return _dataset(dataset)


def get_dataset(engine: Engine, dataset_id: str) -> DatasetRecord:
    return get_row(engine, Dataset, dataset_id, DatasetNotFound, _dataset)


def list_datasets(engine: Engine, status: str | None = None, project: str | None = None) -> list[DatasetRecord]:
    """By name (of one project, or of all)."""
    query = select(Dataset).order_by(Dataset.name)
    if project is not None:
        query = query.where(Dataset.project == project)
    if status is not None:
        query = query.where(Dataset.status == status)
    with session_scope(engine, write=False) as session:
        return [_dataset(d) for d in session.execute(query).scalars()]


def delete_dataset(engine: Engine, dataset_id: str) -> str:
    """Forget a dataset; returns its URI so the caller can remove the files."""
    with session_scope(engine) as session:
        dataset = session.get(Dataset, dataset_id)
        if dataset is None:
            raise DatasetNotFound(dataset_id)
        session.delete(dataset)
        return dataset.uri


def _check_dataset(name: str, status: str) -> None:
    if not name or not name.strip() or len(name) > NAME_LEN:
        raise ValueError(f"dataset name {name!r}: 1 to {NAME_LEN} characters")
    if status not in DATASET_STATUSES:
        raise ValueError(f"dataset status {status!r}: use one of {', '.join(DATASET_STATUSES)}")


def _dataset(d: Dataset) -> DatasetRecord:
    return DatasetRecord(
        id=d.id,
        name=d.name,
        uri=d.uri,
        classes=tuple(d.classes),
        counts=dict(d.counts),
        status=d.status,
        error=d.error,
        created_at=d.created_at,
        owner=d.owner,
        project=d.project,
    )


def upsert_account(engine: Engine, key: str, name: str, email: str | None = None) -> AccountRecord:
    """Record an identity seen signing in (its name and verified e-mail may change between sign-ins)."""
    if not 0 < len(key) <= OWNER_LEN:
        raise ValueError(f"account key: 1 to {OWNER_LEN} characters")
    name = (name or key)[:NAME_LEN]
    email = email[:EMAIL_LEN] if email else None
    with session_scope(engine) as session:
        account = session.get(Account, key)
        if account is None:
            account = Account(key=key, name=name, email=email, seen_at=utcnow())
            session.add(account)
        else:
            account.name, account.email, account.seen_at = name, email, utcnow()
        session.flush()
        return AccountRecord(key=account.key, name=account.name, email=account.email, seen_at=account.seen_at)


def accounts(engine: Engine, keys: Iterable[str]) -> dict[str, AccountRecord]:
    """The accounts behind these owner keys (keys never seen signing in, like a CLI user's, are absent)."""
    wanted = sorted(set(keys))
    found: dict[str, AccountRecord] = {}
    with session_scope(engine, write=False) as session:
        for i in range(0, len(wanted), IN_CHUNK):
            for a in session.execute(select(Account).where(Account.key.in_(wanted[i : i + IN_CHUNK]))).scalars():
                found[a.key] = AccountRecord(key=a.key, name=a.name, email=a.email, seen_at=a.seen_at)
    return found
