"""The queue and the database as the dashboard and the CLI reach them: the Celery client that sends runs and
jobs by task name (so the dashboard never imports the worker or the training code), the queue a run waits in and
the live workers that serve it, and one database engine per URL for the whole process."""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from functools import lru_cache
from typing import Any

from sqlalchemy import Engine

from app.services import queue_words
from core.config import RunSpec
from core.names import JOBS_QUEUE, RUN_TASK, STALE_AFTER_ENV, STALE_AFTER_S, gpus_offered, queue_of
from db.engine import data_home, database_url, make_engine
from db.repo import WorkerRecord


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
    c.conf.update(
        task_serializer="json",
        accept_content=["json"],
        task_ignore_result=True,
        broker_connection_timeout=5,
        broker_connection_max_retries=2,
    )
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
    """The workers' own limit (TORCHDECK_STALE_AFTER_S, worker/settings.py): a worker whose heartbeat is older is
    gone."""
    return float(os.environ.get(STALE_AFTER_ENV) or STALE_AFTER_S)


def heartbeat_age_s(w: WorkerRecord, now: datetime | None = None) -> float:
    """Seconds since the worker's last heartbeat."""
    return ((now or datetime.now(UTC)) - w.heartbeat_at).total_seconds()


def is_alive(w: WorkerRecord, now: datetime | None = None) -> bool:
    """Whether the worker is alive: its heartbeat within stale_after_s. The one rule of the Workers page, the
    Overview's queue, `torchdeck doctor` and `torchdeck submit`."""
    return heartbeat_age_s(w, now) <= stale_after_s()


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
            names = ", ".join(
                f"{w.id} on {w.hostname}" + (" (busy)" if w.current_run_id else "") for w in self.workers[:5]
            )
            more = f" and {len(self.workers) - 5} more" if len(self.workers) > 5 else ""
            return f"queue '{self.queue}' is served by {len(self.workers)} live worker(s): {names}{more}"
        return queue_words.unserved(self.queue, self.most_gpus)

    def gap(self) -> str:
        """Why nobody takes the run, in a few words (a table cell)."""
        return queue_words.gap(self.queue, self.most_gpus)


def queue_status(queue: str, engine: Engine | None = None) -> QueueStatus:
    """The live workers (heartbeat within the workers' stale limit) that consume `queue`."""
    from db.repo import list_workers

    now = datetime.now(UTC)
    alive = [w for w in list_workers(engine or get_engine()) if is_alive(w, now)]
    most = max((gpus_offered(w.queues) for w in alive), default=0)
    return QueueStatus(queue, tuple(w for w in alive if queue in w.queues), most)


# `torchdeck up` starts its workers with the stack; they register (a heartbeat in the workers table) a few
# seconds later. Within FRESH_STACK_S of its start, a queue nobody serves yet is asked again for WORKERS_WAIT_S.
FRESH_STACK_S = 60.0
WORKERS_WAIT_S = 15.0


def fresh_stack() -> bool:
    """Whether the broker in use is that of a `torchdeck up` on this host started less than FRESH_STACK_S ago
    (it records its private broker's URL under TORCHDECK_HOME as it starts)."""
    recorded = data_home() / "broker.url"
    try:
        started = recorded.stat().st_mtime
        mine = recorded.read_text().strip() == broker_url()
    except OSError:
        return False
    return mine and 0 <= time.time() - started < FRESH_STACK_S


def queue_status_after_start(
    queue: str, engine: Engine | None = None, *, waiting: Callable[[float], None], poll_s: float = 0.5
) -> QueueStatus:
    """queue_status, but on a stack that has just started (fresh_stack) and whose workers serve `queue` nobody
    yet, asked again every poll_s until one does, for WORKERS_WAIT_S at most; `waiting(seconds)` is told once,
    when the wait begins."""
    status = queue_status(queue, engine)
    if status.served or not fresh_stack():
        return status
    limit = WORKERS_WAIT_S
    waiting(limit)
    deadline = time.monotonic() + limit
    while not status.served and time.monotonic() < deadline:
        time.sleep(min(poll_s, max(deadline - time.monotonic(), 0.0)))
        status = queue_status(queue, engine)
    return status
