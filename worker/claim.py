"""Which run a delivered message starts: a message is a token for its queue, not a ticket for its run.

The broker hands a queue's messages out first in, first out and cannot reorder them; the database can choose
among the queued runs atomically (db/queue_order.py holds the order and why). So the worker that receives the
message for run X takes the best queued run of X's queue, which is X only when X is next. X keeps a message: if
another run was taken and X is still queued, X's message is sent again at once, so every queued run still has one
(the reaper's resend_missing looks for each queued run's id in the broker). A `lost` run named by its message is
resumed first, as before: it was already running once. A message whose run is running or over is a token already
spent (the run that took its turn still has its own message) and is skipped."""

from __future__ import annotations

import logging

from sqlalchemy import Engine

from core.names import queue_of
from db.repo import RunRecord, claim_next, claim_run, get_run
from worker.reaper import send
from worker.settings import WorkerSettings

log = logging.getLogger("torchdeck.worker")


def take_turn(
    engine: Engine, run_id: str, worker_id: str, device: str | None = None, settings: WorkerSettings | None = None
) -> RunRecord | None:
    """The run this delivery of `run_id`'s message starts (claimed: `running`, this worker's), or None to skip
    it. Raises RunNotFound when the named run was deleted (its message is dropped as before)."""
    s = settings or WorkerSettings()
    named = get_run(engine, run_id)
    if named.status == "lost":
        return claim_run(engine, run_id, worker_id, device=device)
    if named.status != "queued":
        return None
    run = claim_next(engine, queue_of(named.spec), worker_id, device, half_life_s=s.fair_half_life_s)
    if run is not None and run.id != run_id and get_run(engine, run_id).status == "queued":
        log.info("run %s goes before %s in their queue: %s's message sent again", run.id, run_id, run_id)
        send(named)
    return run
