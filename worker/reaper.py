"""The reaper, one of the worker's background duties (worker/tasks.py runs it every reap_every_s): runs whose
worker died are sent again to resume from their last checkpoint, until max_attempts; runs of people's own scripts
(db/external.py) that fell silent are lost; runs whose broker message
was lost are sent again; every running sweep is advanced; the alert rules are evaluated (worker/alerts.py). Also
the supervisor's way back for a run that lost a rank, and the sending of a run to its queue (by task name: a run's
queue is in its spec).

Every transition is conditional on the run still being where the reaper found it (`lost`, unclaimed): a worker
may claim it meanwhile, and concurrent reapers never double-queue."""

from __future__ import annotations

import logging

from sqlalchemy import Engine

from core.names import RUN_QUEUES, RUN_TASK, queue_of
from db.external import mark_silent
from db.repo import (
    EventInput,
    RunNotFound,
    append_events,
    finish_run,
    get_run,
    list_sweeps,
    mark_lost,
    mark_run_lost,
    unclaimed_runs,
)
from worker.alerts import check_alerts
from worker.broker import run_ids_in_broker
from worker.celery_app import app
from worker.notify import notify_run_end
from worker.settings import WorkerSettings

log = logging.getLogger("torchdeck.worker")


def reap(engine: Engine, settings: WorkerSettings | None = None) -> list[str]:
    """Runs whose heartbeat went stale are `lost`: re-queued (they resume from their last checkpoint)
    until max_attempts, then failed. mark_lost is atomic, so concurrent reapers never double-queue, and
    every later transition is conditional on the run still being `lost`: a worker may claim it meanwhile."""
    s = settings or WorkerSettings()
    requeued = []
    for run_id in mark_lost(engine, s.stale_after_s):
        r = get_run(engine, run_id)
        if requeue_or_fail(
            engine,
            r,
            s,
            f"worker {r.worker_id} stopped heartbeating",
            "its worker stopped heartbeating (crashed, killed or disconnected)",
        ):
            requeued.append(run_id)
    for run_id in mark_silent(engine, s.script_silent_after_s):
        said = (
            f"its script wrote nothing for {s.script_silent_after_s / 60:g} min: lost (killed, or its machine went "
            "away); it is running again if the script writes again"
        )
        append_events(engine, run_id, [EventInput("lifecycle", "warning", said, code="lost")])
    sent = resend_missing(engine, s)
    for sweep in list_sweeps(engine, status=("running",)):
        advance_sweep(engine, sweep.id)  # a worker that died between a trial's end and its advance stalls no sweep
    check_alerts(engine, s)  # after the above: a run it just failed or a sweep it just ended is seen this round
    return requeued + sent


def requeue_or_fail(engine: Engine, r, s: WorkerSettings, what: str, why: str, notify: bool = True) -> bool:
    """A `lost` run: sent again to resume from its last checkpoint (True), or failed once it has been tried
    max_attempts times (notified unless the caller's run task notifies its end itself). Every write is conditional
    on the run still being `lost`: a worker may claim it meanwhile."""
    if r.attempt >= s.max_attempts:
        if (
            finish_run(
                engine, r.id, "failed", only_from=("lost",), error=f"lost {r.attempt} times: {why}; not retried again"
            )
            is not None
            and notify
        ):
            notify_run_end(engine, r.id, settings=s)
        return False
    append_events(
        engine,
        r.id,
        [
            EventInput(
                "lifecycle",
                "warning",
                f"{what}; re-queued (attempt {r.attempt + 1} of {s.max_attempts}) to "
                f"'{queue_of(r.spec)}', resuming from the last checkpoint",
                code="lost",
            )
        ],
    )
    send(r)
    return True


def resume_after_rank_loss(engine: Engine, run_id: str, worker_id: str, s: WorkerSettings) -> str:
    """The run's process exited because another rank of its multi-process run died (its event names the rank):
    the run is marked lost now, not after its heartbeat goes stale, and re-queued like a run whose worker died.
    A run someone asked to cancel is cancelled instead; one that is no longer this worker's is left alone."""
    try:
        if not mark_run_lost(engine, run_id, worker_id=worker_id):
            log.warning("run %s lost a rank but is no longer ours: left to its new owner", run_id)
            return "abandoned"
        r = get_run(engine, run_id)
        if r.cancel_requested:
            finish_run(engine, run_id, "cancelled", only_from=("lost",), error="cancelled while a rank was lost")
            return "cancelled"
        requeue_or_fail(
            engine,
            r,
            s,
            "a rank of this run's processes died",  # execute_run notifies a failed run's end
            "a rank of its processes died each time (see its rank_lost events)",
            notify=False,
        )
    except RunNotFound:
        return "abandoned"
    except Exception as e:  # noqa: BLE001 - the reaper re-queues it once its heartbeat is stale
        log.error("could not re-queue run %s after its lost rank: %s", run_id, e)
    return "rank lost"


def send(run) -> None:
    """The run's task to the queue its spec needs (the message holds the run's id only)."""
    app.send_task(RUN_TASK, args=[run.id], queue=queue_of(run.spec))


def resend_missing(engine: Engine, s: WorkerSettings) -> list[str]:
    """Runs waiting for a worker (queued, or lost and unclaimed) for longer than requeue_after_s whose
    message is no longer in the broker: sent again, with an event saying so."""
    waiting = unclaimed_runs(engine, s.requeue_after_s)
    if not waiting:
        return []
    # The queues these runs wait in, the multi-GPU ones (gpu-xN) included: a run's spec says which.
    queues = sorted({*RUN_QUEUES, *(queue_of(r.spec) for r in waiting)})
    present = run_ids_in_broker(app, queues, RUN_TASK, delivered_within_s=s.requeue_after_s)
    if present is None:  # the broker cannot be read now: try again next round
        return []
    sent = []
    for r in waiting:
        if r.id in present:
            continue
        send(r)
        append_events(
            engine,
            r.id,
            [
                EventInput(
                    "lifecycle",
                    "warning",
                    f"the queue had no message for this {r.status} run (the broker restarted or a "
                    f"message was lost); sent it again to '{queue_of(r.spec)}'",
                    code="resent",
                )
            ],
        )
        sent.append(r.id)
    return sent


def advance_sweep(engine: Engine, sweep_id: str) -> None:
    """A sweep's run ended here: queue its next trials now (the reaper does it too, later, if this fails)."""
    from sweep.control import advance

    try:
        advance(engine, sweep_id, send)
    except Exception as e:  # noqa: BLE001 - the reaper advances every running sweep again
        log.warning("could not advance sweep %s: %s", sweep_id, e)
