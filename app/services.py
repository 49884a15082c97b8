"""What the UI and the CLI do to runs: validate and submit, cancel, clone. No torch here:
runs are enqueued by task name, so the UI never imports the training code."""

from __future__ import annotations

import os
import shutil
from functools import lru_cache
from pathlib import Path
from typing import Any

from sqlalchemy import Engine

from core.config import RunSpec
from db.engine import data_home, make_engine
from db.repo import RunRecord, create_run, delete_run, get_run, request_cancel

RUN_TASK = "torchdeck.execute_run"  # the name worker.tasks registers; enqueued by name only


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


@lru_cache(maxsize=4)
def _engine(url: str | None) -> Engine:
    return make_engine(url)


def get_engine() -> Engine:
    return _engine(os.environ.get("TORCHDECK_DATABASE_URL") or None)


def enqueue(run_id: str, spec: RunSpec) -> None:
    _celery(broker_url()).send_task(RUN_TASK, args=[run_id], queue=spec.resource)


def submit(spec: RunSpec, *, name: str | None = None, owner: str = "local", tags: list[str] | None = None,
           parent_id: str | None = None, engine: Engine | None = None) -> RunRecord:
    """Store a validated spec as a queued run and enqueue it. Invalid specs never get here:
    RunSpec validation happens first (the form and the CLI show each field's error)."""
    engine = engine or get_engine()
    run = create_run(engine, spec.model_dump(mode="json"), name=name or spec.name, owner=owner, tags=tags or [],
                     parent_id=parent_id)
    try:
        enqueue(run.id, spec)
    except Exception as e:
        from db.repo import finish_run

        finish_run(engine, run.id, "failed", error=f"could not reach the queue at {broker_url()}: {e}")
        raise RuntimeError(f"the run was stored but the broker is unreachable ({broker_url()}): {e}. "
                           "Is a worker stack running? Start it with `make up` or `torchdeck up`.") from e
    return run


def cancel(run_id: str, engine: Engine | None = None) -> RunRecord:
    """A queued run is cancelled at once (its message is refused when delivered); a running one stops between steps."""
    return request_cancel(engine or get_engine(), run_id)


def remove(run_id: str, engine: Engine | None = None) -> list[str]:
    """Delete a finished run with its rows and its files under the artifact root."""
    engine = engine or get_engine()
    uris = delete_run(engine, run_id)
    root = artifact_root()
    run_dir = root / "runs" / run_id
    if run_dir.is_dir() and root in run_dir.resolve().parents:
        shutil.rmtree(run_dir)
    return uris


def artifact_root() -> Path:
    root = os.environ.get("TORCHDECK_ARTIFACTS")
    return (Path(root).expanduser() if root else data_home() / "artifacts").resolve()


def spec_of(run: RunRecord) -> RunSpec:
    return RunSpec.model_validate(dict(run.spec))


def clone_spec(run_id: str, overrides: list[str] | None = None, engine: Engine | None = None) -> RunSpec:
    run = get_run(engine or get_engine(), run_id)
    data: dict[str, Any] = dict(run.spec)
    return RunSpec.from_dict(data, overrides or [])
