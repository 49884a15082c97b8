"""Runs logged by people's own scripts (`run.source` = `mlflow`: app/tracking/ answers the MLflow client for them).

Such a run has no spec to run, no queue and no worker: its stored spec holds what the script logged about itself,
`{"params": {...}, "tags": {...}}` (MLflow's params are written once, its tags may change), so that the pages show
and compare a script's params like a spec's fields. Its metric points take torchdeck's own path (db.metrics'
batched, idempotent append: a point per key and step, the first one stored wins, so a client's retry never
duplicates one). Each write is its heartbeat: the reaper marks a run whose script fell silent `lost`
(`mark_silent`), and a lost run the script writes to again is running again. A run is never claimed by a worker
(its queue is NULL) nor counted as waiting for one.

Params, tags, metric points and the heartbeat of one request are written in one transaction under the run's append
lock (db.metrics.lock_run_for_append), so concurrent requests of one script never lose each other's fields."""

from __future__ import annotations

import hashlib
import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import Connection, Engine, case, func, select, update

from db.artifact_records import artifact_record, artifact_row, list_artifacts
from db.engine import connection_scope, session_scope
from db.errors import RunNotFound
from db.metrics import lock_run_for_append, prepare, write_batch
from db.models import Artifact, Metric, Run
from db.run_records import get_run
from db.runs import new_id
from db.types import (
    DEFAULT_PROJECT,
    FINISHED_STATUSES,
    NAME_LEN,
    OWNER_LEN,
    ArtifactRecord,
    MetricPoint,
    RunRecord,
    check_text,
    utcnow,
)

SOURCE = "mlflow"
FILE_KIND = "file"  # the artifact kind of a script's files (their path in meta["path"])
# What a script's end says about its run (MLflow's terminal RunStatus → torchdeck's status).
ENDS = {"FINISHED": "completed", "FAILED": "failed", "KILLED": "cancelled"}


class NotExternal(ValueError):
    """A run that torchdeck's worker writes: nothing else logs into it."""

    def __init__(self, run_id: str):
        super().__init__(
            f"run {run_id} was launched by torchdeck: only its worker writes to it (log from your script into a run "
            "your script created)"
        )
        self.run_id = run_id


class TooManyRunning(ValueError):
    """A person's scripts have as many runs running as they may."""

    def __init__(self, owner: str, running: int, limit: int):
        super().__init__(
            f"{owner} has {running} runs of scripts running, the most one person may ({limit}): end some "
            "(mlflow.end_run) or wait until torchdeck marks the silent ones lost"
        )
        self.owner, self.running, self.limit = owner, running, limit


class ParamChanged(ValueError):
    """A param logged again with another value (params are written once, as in MLflow)."""

    def __init__(self, key: str, old: str, new: str):
        super().__init__(
            f"param {key!r} of this run is already {old!r}: a param is written once (log {new!r} under another key, "
            "or as a tag)"
        )
        self.key = key


def create_run(
    engine: Engine,
    *,
    owner: str,
    project: str = DEFAULT_PROJECT,
    name: str | None = None,
    tags: Mapping[str, str] | None = None,
    started_at: datetime | None = None,
    max_running: int | None = None,
) -> RunRecord:
    """A new running external run of `owner` in `project` (the caller checked they may contribute to it).
    TooManyRunning when `owner` has `max_running` scripts' runs running already (counted in the transaction that
    stores the new one: concurrent scripts of one person never overshoot it)."""
    run_id = new_id()
    check_text("owner", owner, OWNER_LEN)
    name = name or run_id
    check_text("name", name, NAME_LEN)
    now = utcnow()
    row = Run(
        id=run_id,
        name=name,
        owner=owner,
        status="running",
        spec={"params": {}, "tags": dict(tags or {})},
        # Its own hash: two scripts' runs are never "the same spec" (seed groups, repeats).
        spec_hash=hashlib.sha256(f"{SOURCE}:{run_id}".encode()).hexdigest(),
        created_at=now,
        started_at=started_at or now,
        heartbeat_at=now,
        attempt=0,
        summary={},
        cancel_requested=False,
        queue=None,
        priority=0,
        project=project,
        source=SOURCE,
    )
    with connection_scope(engine, write=True) as conn:
        if max_running is not None:
            _check_running(conn, owner, max_running)
        conn.execute(Run.__table__.insert().values({c.name: getattr(row, c.key) for c in Run.__table__.columns}))
    return get_run(engine, run_id)


def _check_running(conn: Connection, owner: str, limit: int) -> None:
    if conn.dialect.name == "postgresql":  # SQLite's writers are serialised already
        conn.execute(select(func.pg_advisory_xact_lock(func.hashtext(f"scripts:{owner}"))))
    running = conn.execute(
        select(func.count()).select_from(Run).where(Run.owner == owner, Run.source == SOURCE, Run.status == "running")
    ).scalar_one()
    if running >= limit:
        raise TooManyRunning(owner, running, limit)


def log(
    engine: Engine,
    run_id: str,
    *,
    points: Iterable[MetricPoint] = (),
    params: Mapping[str, str] | None = None,
    tags: Mapping[str, str] | None = None,
    deleted_tags: Iterable[str] = (),
    name: str | None = None,
) -> int:
    """Write what one request of a script logged, in one transaction: params (ParamChanged for one already stored
    with another value), tags (set or deleted), metric points (those whose key and step are stored are ignored;
    ValueError for a bad one, before anything is written), and the run's heartbeat (a lost run is running again).
    Returns how many points were new. RunNotFound, NotExternal."""
    batch = prepare(run_id, points)  # validated before the transaction
    if name is not None:
        check_text("name", name, NAME_LEN)
    with connection_scope(engine, write=True) as conn:
        lock_run_for_append(conn, run_id)
        row = conn.execute(select(Run.source, Run.spec).where(Run.id == run_id)).one()
        if row.source != SOURCE:
            raise NotExternal(run_id)
        values: dict[str, Any] = _fields(run_id, row.spec, params or {}, tags or {}, deleted_tags)
        if name is not None:
            values["name"] = name
        new = write_batch(conn, batch) if batch.series else 0
        _beat(conn, run_id, **values)
        return new


def _fields(
    run_id: str, spec: Mapping[str, Any], params: Mapping[str, str], tags: Mapping[str, str], deleted: Iterable[str]
) -> dict[str, Any]:
    """The run's new spec column (only when it changes)."""
    stored_params = dict(spec.get("params") or {})
    stored_tags = dict(spec.get("tags") or {})
    for key, value in params.items():
        old = stored_params.get(key)
        if old is not None and old != value:
            raise ParamChanged(key, old, value)
        stored_params[key] = value
    stored_tags.update(tags)
    for key in deleted:
        stored_tags.pop(key, None)
    if stored_params == spec.get("params") and stored_tags == spec.get("tags"):
        return {}
    return {"spec": {**spec, "params": stored_params, "tags": stored_tags}}


def _beat(conn: Connection, run_id: str, **values: Any) -> None:
    revived = case((Run.status == "lost", "running"), else_=Run.status)
    conn.execute(update(Run).where(Run.id == run_id).values(heartbeat_at=utcnow(), status=revived, **values))


def end(engine: Engine, run_id: str, mlflow_status: str, *, ended_at: datetime | None = None) -> RunRecord:
    """The script's word on its run: RUNNING (started again: `mlflow.start_run(run_id=...)`), or its end
    (FINISHED, FAILED, KILLED: completed, failed, cancelled). ValueError for another status."""
    if mlflow_status == "RUNNING":
        values: dict[str, Any] = {"status": "running", "finished_at": None, "heartbeat_at": utcnow()}
    elif mlflow_status in ENDS:
        values = {"status": ENDS[mlflow_status], "finished_at": ended_at or utcnow(), "progress": None}
    else:
        raise ValueError(f"status {mlflow_status!r}: RUNNING, FINISHED, FAILED or KILLED")
    with connection_scope(engine, write=True) as conn:
        lock_run_for_append(conn, run_id)
        if conn.execute(select(Run.source).where(Run.id == run_id)).scalar_one() != SOURCE:
            raise NotExternal(run_id)
        conn.execute(update(Run).where(Run.id == run_id).values(**values))
    return get_run(engine, run_id)


def rename(engine: Engine, run_id: str, name: str) -> None:
    check_text("name", name, NAME_LEN)
    with connection_scope(engine, write=True) as conn:
        found = conn.execute(update(Run).where(Run.id == run_id, Run.source == SOURCE).values(name=name)).rowcount
    if not found:
        get_run(engine, run_id)  # RunNotFound when there is none
        raise NotExternal(run_id)


def mark_silent(engine: Engine, older_than_s: float) -> list[str]:
    """External runs still running whose script wrote nothing for `older_than_s` seconds: now `lost` (the script
    was killed, or its machine went away); their ids. A lost run the script writes to again is running again."""
    cutoff = utcnow() - timedelta(seconds=older_than_s)
    with connection_scope(engine, write=True) as conn:
        stmt = (
            update(Run)
            .where(Run.source == SOURCE, Run.status == "running", Run.heartbeat_at < cutoff)
            .values(status="lost")
            .returning(Run.id)
        )
        return sorted(conn.execute(stmt).scalars())


def history(engine: Engine, run_id: str, key: str, *, offset: int = 0, limit: int = 25_000) -> list[MetricPoint]:
    """The points of one series by step (NaN for a stored NaN), `limit` from `offset`: MLflow's metric history."""
    query = (
        select(Metric.step, Metric.epoch, Metric.value, Metric.nonfinite, Metric.wall_time)
        .where(Metric.run_id == run_id, Metric.key == key)
        .order_by(Metric.step)
        .offset(offset)
        .limit(limit)
    )
    with connection_scope(engine) as conn:
        rows = conn.execute(query).all()
    return [MetricPoint(key, r.step, math.nan if r.value is None else r.value, r.epoch, r.wall_time) for r in rows]


def files(engine: Engine, run_id: str) -> dict[str, ArtifactRecord]:
    """A script's files of the run by the path it gave (the newest upload of each path)."""
    return {a.meta.get("path"): a for a in list_artifacts(engine, run_id, kind=FILE_KIND) if a.meta.get("path")}


def replace_file(
    engine: Engine, run_id: str, path: str, uri: str, *, size: int, sha256: str
) -> tuple[ArtifactRecord, list[str]]:
    """Register a file the script uploaded under `path` (replacing an earlier one of that path: their ids are
    returned), as the run's heartbeat. RunNotFound, NotExternal."""
    artifact = artifact_row(run_id, FILE_KIND, uri, size=size, sha256=sha256, meta={"path": path})
    with session_scope(engine) as session:
        run = session.get(Run, run_id)
        if run is None:
            raise RunNotFound(run_id)
        if run.source != SOURCE:
            raise NotExternal(run_id)
        older = session.execute(select(Artifact).where(Artifact.run_id == run_id, Artifact.kind == FILE_KIND)).scalars()
        replaced = [a for a in older if (a.meta or {}).get("path") == path]
        for a in replaced:
            session.delete(a)
        session.add(artifact)
        run.heartbeat_at = utcnow()
        if run.status == "lost":
            run.status = "running"
    return artifact_record(artifact), [a.id for a in replaced]


@dataclass(frozen=True)
class RunHead:
    """What writing to a run needs to know of it, read in one small query (not its tags or metric summaries)."""

    id: str
    owner: str
    project: str
    source: str
    status: str
    spec: Mapping[str, Any]

    @property
    def external(self) -> bool:
        return self.source != "torchdeck"

    @property
    def finished(self) -> bool:
        return self.status in FINISHED_STATUSES


def head(engine: Engine, run_id: str) -> RunHead:
    """The run's head; RunNotFound."""
    columns = (Run.id, Run.owner, Run.project, Run.source, Run.status, Run.spec)
    with connection_scope(engine) as conn:
        row = conn.execute(select(*columns).where(Run.id == run_id)).first()
    if row is None:
        raise RunNotFound(run_id)
    return RunHead(row.id, row.owner, row.project, row.source, row.status, row.spec or {})


def require_external(engine: Engine, run_id: str) -> RunRecord:
    """The run, if a script writes it: RunNotFound, NotExternal."""
    run = get_run(engine, run_id)
    if run.source != SOURCE:
        raise NotExternal(run_id)
    return run


__all__ = [
    "ENDS",
    "FILE_KIND",
    "SOURCE",
    "NotExternal",
    "ParamChanged",
    "TooManyRunning",
    "RunNotFound",
    "create_run",
    "end",
    "files",
    "head",
    "replace_file",
    "history",
    "log",
    "mark_silent",
    "rename",
    "require_external",
]
