"""What the UI and the CLI do to runs: validate and submit, cancel, clone. No torch here:
runs are enqueued by task name, so the UI never imports the training code."""

from __future__ import annotations

import hashlib
import os
import re
import shutil
from collections.abc import Iterable
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any

from sqlalchemy import Engine

from app import admission, queue_words
from app.admission import DEFAULT_MAX_QUEUED, MAX_QUEUED_ENV, max_queued_per_owner  # noqa: F401 - this module's API
from app.auth import PermissionDenied, User, check_can_modify
from core.config import RunSpec
from core.redact import redact
from core.names import JOBS_QUEUE, RUN_TASK, STALE_AFTER_ENV, STALE_AFTER_S, gpus_offered, queue_of
from db.engine import data_home, database_url, make_engine
from db.repo import (
    ArtifactRecord,
    RunNotFound,
    RunRecord,
    RunStillActive,
    WorkerRecord,
    delete_run,
    get_run,
    request_cancel,
)
from db.repo import set_notes as store_notes, set_tags as store_tags



def broker_url() -> str:
    """$TORCHDECK_BROKER_URL; else the private broker a running `torchdeck up` recorded; else local Redis."""
    url = os.environ.get("TORCHDECK_BROKER_URL")
    if url:
        return url
    recorded = data_home() / "broker.url"
    if recorded.is_file():
        return recorded.read_text().strip()
    return "redis://127.0.0.1:6379/0"


@lru_cache(maxsize=4)
def _celery(url: str):
    from celery import Celery

    c = Celery("torchdeck-client", broker=url)
    c.conf.update(task_serializer="json", accept_content=["json"], task_ignore_result=True,
                  broker_connection_timeout=5, broker_connection_max_retries=2)
    return c


@lru_cache(maxsize=8)
def engine_for(url: str) -> Engine:
    """One engine (one connection pool) per database URL for the whole process: the pages, the CLI, the jobs."""
    return make_engine(url)


def get_engine() -> Engine:
    """The engine of $TORCHDECK_DATABASE_URL (default: the SQLite file under $TORCHDECK_HOME)."""
    return engine_for(database_url())


def run_queue(spec: RunSpec) -> str:
    """The queue a run waits in, its GPU count included (core.names.queue_of: gpu-xN for N > 1 GPUs)."""
    return queue_of(spec.model_dump(mode="json"))


def enqueue(run_id: str, spec: RunSpec) -> None:
    _celery(broker_url()).send_task(RUN_TASK, args=[run_id], queue=run_queue(spec))




def enqueue_job(task: str, kwargs: dict[str, Any], expires_s: float | None = None) -> None:
    """A dashboard job for the jobs workers, by task name; a message no worker took within expires_s is dropped
    when one finally receives it (the dashboard has stopped waiting for its answer by then)."""
    _celery(broker_url()).send_task(task, kwargs=kwargs, queue=JOBS_QUEUE, expires=expires_s)


def stale_after_s() -> float:
    """The workers' own limit (TORCHDECK_STALE_AFTER_S, worker/settings.py): a worker whose heartbeat is older is gone."""
    return float(os.environ.get(STALE_AFTER_ENV) or STALE_AFTER_S)


@dataclass(frozen=True)
class QueueStatus:
    """Who would take a run from `queue` now: the live workers that consume it, and the most GPUs one run may
    have on any live worker (what a multi-GPU run that nobody takes is told)."""

    queue: str
    workers: tuple[WorkerRecord, ...]
    most_gpus: int = 0

    @property
    def served(self) -> bool:
        return bool(self.workers)

    def message(self) -> str:
        if self.served:
            names = ", ".join(f"{w.id} on {w.hostname}" + (" (busy)" if w.current_run_id else "") for w in self.workers[:5])
            more = f" and {len(self.workers) - 5} more" if len(self.workers) > 5 else ""
            return f"queue '{self.queue}' is served by {len(self.workers)} live worker(s): {names}{more}"
        return queue_words.unserved(self.queue, self.most_gpus)

    def gap(self) -> str:
        """Why nobody takes the run, in a few words (a table cell)."""
        return queue_words.gap(self.queue, self.most_gpus)


def queue_status(queue: str, engine: Engine | None = None) -> QueueStatus:
    """The live workers (heartbeat within the workers' stale limit) that consume `queue`."""
    from datetime import UTC, datetime

    from db.repo import list_workers

    now, limit = datetime.now(UTC), stale_after_s()
    alive = [w for w in list_workers(engine or get_engine()) if (now - w.heartbeat_at).total_seconds() <= limit]
    most = max((gpus_offered(w.queues) for w in alive), default=0)
    return QueueStatus(queue, tuple(w for w in alive if queue in w.queues), most)


def submit(spec: RunSpec, *, name: str | None = None, owner: str = "local", tags: list[str] | None = None,
           parent_id: str | None = None, engine: Engine | None = None) -> RunRecord:
    """Store a validated spec as a queued run and enqueue it (the New run form, a clone, "start from a run's
    weights", `torchdeck submit`, a re-run). Invalid specs never get here: RunSpec validation happens first
    (the form and the CLI show each field's error). Refused by the gate of every new run (app.admission):
    a field out of bounds or a path the run may not read (SpecError) and, in team mode, an owner over the
    queued-runs limit (QueueLimitReached)."""
    engine = engine or get_engine()
    [run] = admission.store([spec], owner=owner, engine=engine, names=[name or spec.name], tags=tags or [],
                             parent_id=parent_id)
    try:
        enqueue(run.id, spec)
    except Exception as e:
        from db.repo import finish_run

        where = redact(broker_url())
        finish_run(engine, run.id, "failed", error=redact(f"could not reach the queue at {where}: {e}"))
        raise RuntimeError(redact(f"the run was stored but the broker is unreachable ({where}): {e}. "
                           "Is a worker stack running? Start it with `make up` or `torchdeck up`.")) from e
    return run


def cancel(run_id: str, engine: Engine | None = None, *, by: User) -> RunRecord:
    """A queued run is cancelled at once (its message is refused when delivered); a running one stops between steps.
    Only the run's owner or an admin may (app.auth.PermissionDenied otherwise)."""
    engine = engine or get_engine()
    run = get_run(engine, run_id)
    check_can_modify(by, run, "cancel", owner_label(run.owner, engine))
    return request_cancel(engine, run_id)


def set_tags(run_id: str, tags: Iterable[str], engine: Engine | None = None, *, by: User) -> RunRecord:
    """Replace a run's tags, at any time after launch. Only the run's owner or an admin may (PermissionDenied)."""
    engine = engine or get_engine()
    run = get_run(engine, run_id)
    check_can_modify(by, run, "tag", owner_label(run.owner, engine))
    return store_tags(engine, run_id, tags)


def set_notes(run_id: str, notes: str, engine: Engine | None = None, *, by: User) -> RunRecord:
    """Replace a run's notes (plain text, at most db.types.NOTES_LEN characters: ValueError beyond; blank clears
    them). Only the run's owner or an admin may (PermissionDenied)."""
    engine = engine or get_engine()
    run = get_run(engine, run_id)
    check_can_modify(by, run, "annotate", owner_label(run.owner, engine))
    return store_notes(engine, run_id, notes)


def remove(run_id: str, engine: Engine | None = None, *, by: User) -> list[str]:
    """Delete a finished run with its rows and its files under the artifact root. Only the run's owner or an
    admin may (app.auth.PermissionDenied otherwise)."""
    engine = engine or get_engine()
    run = get_run(engine, run_id)
    check_can_modify(by, run, "delete", owner_label(run.owner, engine))
    uris = delete_run(engine, run_id)
    artifact_store().delete_prefix(f"runs/{run_id}")  # the run's files in the store (local folder or bucket)
    root = artifact_root()
    run_dir = root / "runs" / run_id
    if run_dir.is_dir() and root in run_dir.resolve().parents:  # this host's working copy, if any
        shutil.rmtree(run_dir)
    return uris


def rerun(run_id: str, *, owner: str, engine: Engine | None = None) -> RunRecord:
    """The same spec again, as a new queued run whose parent is the original, owned by whoever re-runs it
    (a re-run is a clone: anyone may make one). Through the same gate as any new run (submit)."""
    engine = engine or get_engine()
    r = get_run(engine, run_id)
    return submit(spec_of(r), name=r.name, owner=owner, tags=list(r.tags), parent_id=r.id, engine=engine)


def refused_removal(run_id: str, *, by: User, engine: Engine | None = None) -> str | None:
    """Delete a run (remove); returns why that was refused, or None when it is gone."""
    try:
        remove(run_id, engine=engine, by=by)
    except PermissionDenied as e:
        return str(e)
    except RunStillActive:
        return f"run {run_id} is still running: cancel it first"
    except RunNotFound:
        return None
    return None


def owner_labels(keys: Iterable[str | None], engine: Engine | None = None) -> dict[str, str]:
    """How to show each owner: an account that signed in here by its name (and verified e-mail), never by
    its `<issuer>#<subject>` key; any other owner (an e-mail stored before identities were keyed, a local
    user name, a CLI user) as it is stored."""
    from db.repo import accounts

    wanted = {k for k in keys if k}
    found = accounts(engine or get_engine(), wanted) if wanted else {}
    labels = {}
    for key in wanted:
        a = found.get(key)
        if a is None:
            labels[key] = key
        elif a.email:
            labels[key] = f"{a.name} ({a.email})" if a.email.lower() != a.name.lower() else a.name
        else:  # a name anyone may choose at the provider: marked, and told apart from a look-alike by its key
            labels[key] = f"{a.name} (unverified {hashlib.sha256(key.encode()).hexdigest()[:6]})"
    return labels


def owner_label(owner: str | None, engine: Engine | None = None) -> str:
    """One owner as owner_labels shows it ('' for none)."""
    return owner_labels([owner], engine).get(owner, "") if owner else ""


def latest_by_kind(artifacts: list[ArtifactRecord]) -> dict[str, ArtifactRecord]:
    """Exports can be made again; the newest artifact of each kind wins."""
    out: dict[str, ArtifactRecord] = {}
    for a in sorted(artifacts, key=lambda a: a.created_at):
        out[a.kind] = a
    return out


def artifact_root() -> Path:
    """This host's run root: the artifact store's folder when it is local, else a local working copy."""
    from db.artifacts import local_run_root

    return local_run_root()


def artifact_store():
    """The artifact store of $TORCHDECK_ARTIFACTS (a folder by default, or s3://bucket/prefix)."""
    from db.artifacts import open_store

    return open_store()


# --- artifact downloads: by opaque id only ----------------------------------------------------------------

_ARTIFACT_ID = re.compile(r"^[0-9A-Za-z_-]{1,64}$")


class InvalidArtifactId(ValueError):
    """An artifact id that is not one: ids are opaque tokens, never paths."""


class ArtifactUnavailable(LookupError):
    """The artifact is registered but its bytes cannot be read from this host."""


class ArtifactChanged(ArtifactUnavailable):
    """The bytes behind an artifact id are not those it was registered with (sha256 or size): never served."""


def _artifact_record(artifact_id: str, engine: Engine | None):
    from db.repo import get_artifact

    if not isinstance(artifact_id, str) or not _ARTIFACT_ID.match(artifact_id):
        raise InvalidArtifactId(f"{str(artifact_id)[:80]!r} is not an artifact id: downloads name an artifact by its "
                                "opaque id (letters and digits), never by a path")
    return get_artifact(engine or get_engine(), artifact_id)  # ArtifactNotFound for an unknown id


def _artifact_source(record) -> tuple[Any, str | None, Path | None]:
    """(store, key, None) when the artifact is in the store; (None, None, path) for a file a run registered
    under this host's run root; ArtifactUnavailable otherwise. Only the database's URI decides, and never
    anything else of the data folder (it holds the database and the sign-in secrets)."""
    from urllib.parse import unquote, urlparse

    store = artifact_store()
    key = store.key_of(record.uri)
    if key is not None:
        return store, key, None
    parsed = urlparse(record.uri)
    if parsed.scheme in ("file", ""):
        path = Path(unquote(parsed.path)).resolve()
        if artifact_root() in path.parents:
            return None, None, path
    raise ArtifactUnavailable(f"artifact {record.id} ({record.kind}) is stored at {record.uri}, outside this "
                              f"installation's artifact store ({store.url}): it cannot be downloaded here")


def artifact_problem(record) -> str | None:
    """Why an artifact cannot be downloaded here (cheap: no request to an object store, no hashing; a file
    changed without changing its size is refused by the download itself), or None."""
    try:
        store, key, path = _artifact_source(record)
    except ArtifactUnavailable:
        return "not on this machine nor in this installation's artifact store"
    local = path if path is not None else store.local_path(key)
    if local is None:
        return None
    if not local.is_file():
        return "file removed from the artifact store"
    size = local.stat().st_size
    if record.size is not None and size != record.size:
        return f"file changed since it was stored ({size} bytes, {record.size} stored): not served"
    return None


def artifact_filename(record) -> str:
    """The file's own name (a file: URI's last part decoded: `ré sumé.json`, not `r%C3%A9%20sum%C3%A9.json`)."""
    from urllib.parse import unquote

    name = record.uri.rstrip("/").rsplit("/", 1)[-1]
    name = unquote(name) if record.uri.startswith("file:") else name
    return name or f"{record.kind}-{record.id}"


def open_artifact(artifact_id: str, engine: Engine | None = None):
    """(record, binary file) of an artifact given only its opaque id: streamed from the artifact store
    (local folder or bucket). InvalidArtifactId for anything path-like, db ArtifactNotFound for an
    unknown id, ArtifactUnavailable when its bytes are not reachable from here. The file hashes what it
    serves: the read that completes it raises ArtifactChanged instead when the bytes are not the ones
    registered (the row's sha256 and size). Close the file."""
    from db.artifacts import VerifiedReader

    record = _artifact_record(artifact_id, engine)
    store, key, path = _artifact_source(record)
    try:
        raw = store.open(key) if store is not None else open(path, "rb")  # noqa: SIM115 - the caller closes it
    except FileNotFoundError:
        raise ArtifactUnavailable(f"artifact {record.id} ({record.kind}) is registered but its file is gone "
                                  f"({record.uri})") from None

    return record, VerifiedReader(raw, record.size, record.sha256, lambda why: _changed(record, why))


def _changed(record, why: str) -> ArtifactChanged:
    return ArtifactChanged(f"artifact {record.id}'s file changed since it was stored: {why}; the download "
                           f"is refused ({record.kind}, {record.uri})")


def read_artifact(artifact_id: str, engine: Engine | None = None) -> bytes:
    """The whole artifact, checked against its sha256 on the way: ArtifactChanged when it differs; other errors
    as open_artifact. Held whole in memory: for the small files the pages show (a sample grid, an error
    analysis); a download streams (artifact_pieces, app/downloads.py)."""
    _, f = open_artifact(artifact_id, engine)
    with f:
        return f.read()


DOWNLOAD_PIECE = 1 << 20


def artifact_pieces(artifact_id: str, engine: Engine | None = None):
    """(record, an iterator of its bytes in DOWNLOAD_PIECE pieces) for a download that holds one piece at a time.
    A file on this host is hashed first, piece by piece: ArtifactChanged before a byte is served when it is not
    the registered one. Then (a bucket's file too, which is not read twice) the pieces come through
    open_artifact's check, whose last piece raises ArtifactChanged instead when the bytes changed meanwhile: the
    download breaks off before its end. Other errors as open_artifact, before the first piece."""
    from db.artifacts import file_sha256

    record, reader = open_artifact(artifact_id, engine)
    try:
        store, key, path = _artifact_source(record)
        local = path if path is not None else store.local_path(key)
        if local is not None:
            size, digest = file_sha256(local)
            if record.size is not None and size != record.size:
                raise _changed(record, f"{size} bytes ≠ {record.size} stored")
            if record.sha256 and digest != record.sha256:
                raise _changed(record, f"sha256 {digest} ≠ {record.sha256}")
    except BaseException:
        reader.close()
        raise

    def pieces():
        with reader:
            while piece := reader.read(DOWNLOAD_PIECE):
                yield piece

    return record, pieces()


def spec_of(run: RunRecord) -> RunSpec:
    return RunSpec.model_validate(dict(run.spec))
