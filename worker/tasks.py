"""The run task (thin: it claims, spawns and supervises) and the worker's background duties
(its own heartbeat row and the reaper that re-queues runs whose worker died)."""

from __future__ import annotations

import logging
import multiprocessing as mp
import os
import signal
import socket
import threading
import time

from celery import signals
from sqlalchemy import Engine

from db.engine import make_engine
from db.repo import (
    EventInput,
    append_events,
    claim_run,
    finish_run,
    get_run,
    heartbeat,
    mark_lost,
    requeue_lost,
    upsert_worker,
)
from worker.celery_app import QUEUES, RUN_TASK, app
from worker.child import spare_main
from worker.settings import WorkerSettings

log = logging.getLogger("torchdeck.worker")

_engine: Engine | None = None
_state = {"worker_id": None, "current_run": None, "queues": []}


def engine() -> Engine:
    global _engine
    if _engine is None:
        _engine = make_engine()
    return _engine


def queue_for(spec: dict) -> str:
    return "cpu" if spec.get("device") == "cpu" else "gpu"


def describe_exit(code: int | None) -> str:
    """Turn a child's exit code into a reason a person can act on."""
    if code is None:
        return "the run process did not exit"
    if code < 0:
        sig = signal.Signals(-code).name if -code in signal.Signals._value2member_map_ else str(-code)
        if -code == signal.SIGKILL:
            return "killed by SIGKILL — out of memory? (the kernel's OOM killer sends SIGKILL; lower train.batch_size)"
        return f"the run process was terminated by {sig}"
    return f"the run process exited with code {code} before recording a result"


@app.task(name=RUN_TASK, acks_late=True, reject_on_worker_lost=True, ignore_result=True)
def execute_run(run_id: str) -> str:
    """Claim, then run in a fresh spawned process. A duplicate delivery finds the run taken and exits."""
    worker_id = _state["worker_id"] or f"{socket.gethostname()}:{os.getpid()}"
    run = claim_run(engine(), run_id, worker_id, device=_device_label())
    if run is None:
        log.info("run %s is running elsewhere or finished: skipping this delivery", run_id)
        return "skipped"
    _state["current_run"] = run_id
    try:
        return supervise(run_id, worker_id)
    finally:
        _state["current_run"] = None


def _device_label() -> str:
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    return f"cuda:{visible}" if visible not in (None, "") else "cpu"


class Spare:
    """One fresh spawned process kept ready (libraries imported, no run yet). Spawn, not fork: CUDA
    never survives a fork, and a fresh process returns all its memory when the run ends."""

    def __init__(self) -> None:
        self.proc: mp.Process | None = None
        self.conn = None

    def fill(self) -> None:
        if self.proc is not None and self.proc.is_alive():
            return
        ctx = mp.get_context("spawn")
        parent, child = ctx.Pipe()
        self.proc = ctx.Process(target=spare_main, args=(child,), name="torchdeck-run", daemon=False)
        self.proc.start()
        child.close()
        self.conn = parent

    def take(self, job: tuple) -> mp.Process:
        self.fill()
        proc, conn = self.proc, self.conn
        self.proc = self.conn = None
        conn.send(job)
        conn.close()
        return proc


    def close(self) -> None:
        if self.conn is not None:
            try:
                self.conn.send(None)  # "no run for you": the spare exits
            except OSError:
                pass
        if self.proc is not None:
            self.proc.join(5)
            if self.proc.is_alive():
                self.proc.kill()
        self.proc = self.conn = None


_spare = Spare()


def supervise(run_id: str, worker_id: str, settings: WorkerSettings | None = None) -> str:
    """Hand the run to a fresh process, relay a cancel (stop between steps → SIGTERM → SIGKILL), explain its exit."""
    s = settings or WorkerSettings()
    proc = _spare.take((run_id, worker_id, engine().url.render_as_string(hide_password=False)))
    try:
        return _watch(proc, run_id, worker_id, s)
    finally:
        _spare.fill()  # ready for the next run


def _watch(proc: mp.Process, run_id: str, worker_id: str, s: WorkerSettings) -> str:
    cancel_at: float | None = None
    termed = False
    next_check = 0.0
    while proc.is_alive():
        proc.join(timeout=0.5)
        now = time.monotonic()
        if now >= next_check:
            next_check = now + s.heartbeat_s
            try:
                # The worker heartbeats too: a child still importing torch on a busy machine is not lost.
                reply = heartbeat(engine(), run_id, worker_id=worker_id)
                if cancel_at is None and reply.should_stop:
                    cancel_at = now  # the child sees it through its own heartbeat and stops between steps
            except Exception as e:  # noqa: BLE001 - the database may be briefly away; the child keeps going
                log.warning("could not heartbeat run %s: %s", run_id, e)
        if cancel_at is not None and not termed and now - cancel_at > s.cancel_grace_s:
            proc.terminate()
            termed = True
        elif termed and now - cancel_at > s.cancel_grace_s + 10:
            proc.kill()
    code = proc.exitcode
    if code != 0:
        status = "cancelled" if cancel_at is not None else "failed"
        reason = describe_exit(code)
        try:
            finish_run(engine(), run_id, status, error=reason, worker_id=worker_id)
            append_events(engine(), run_id, [EventInput("lifecycle", "error", reason, code="process_exit", data={"exitcode": code})])
        except Exception as e:  # noqa: BLE001
            log.error("could not record the end of run %s: %s", run_id, e)
    return f"exit {code}"


# --- the worker's background duties -----------------------------------------------------------------


def reap(settings: WorkerSettings | None = None) -> list[str]:
    """Runs whose heartbeat went stale are `lost`: re-queued (they resume from their last checkpoint)
    until max_attempts, then failed. mark_lost is atomic, so concurrent reapers never double-queue."""
    s = settings or WorkerSettings()
    requeued = []
    for run_id in mark_lost(engine(), s.stale_after_s):
        r = get_run(engine(), run_id)
        if r.attempt >= s.max_attempts:
            finish_run(engine(), run_id, "failed", error=f"lost {r.attempt} times: its worker stopped heartbeating "
                       "(crashed, killed or disconnected); not retried again")
            continue
        append_events(engine(), run_id, [EventInput(
            "lifecycle", "warning", f"worker {r.worker_id} stopped heartbeating; re-queued (attempt {r.attempt + 1} of "
            f"{s.max_attempts}), resuming from the last checkpoint", code="lost")])
        app.send_task(RUN_TASK, args=[run_id], queue=queue_for(dict(r.spec)))
        requeued.append(run_id)
    for run_id in requeue_lost(engine(), s.requeue_after_s):  # lost but never claimed since: send it again
        r = get_run(engine(), run_id)
        app.send_task(RUN_TASK, args=[run_id], queue=queue_for(dict(r.spec)))
        requeued.append(run_id)
    return requeued


def _devices() -> list[dict]:
    from worker.child import gpu_metrics

    gpus = gpu_metrics()
    n = len({k.split("_")[0] for k in gpus})
    return [{"kind": "gpu", "index": i, "util": gpus.get(f"sys/gpu{i}_util"), "mem_mb": gpus.get(f"sys/gpu{i}_mem_mb")}
            for i in range(n)] or [{"kind": "cpu", "cores": os.cpu_count()}]


def _background(stop: threading.Event, s: WorkerSettings) -> None:
    next_reap = 0.0
    while not stop.wait(min(s.heartbeat_s, 5.0)):
        try:
            upsert_worker(engine(), _state["worker_id"], hostname=socket.gethostname(), queues=_state["queues"],
                          devices=_devices(), current_run_id=_state["current_run"])
            if time.monotonic() >= next_reap:
                next_reap = time.monotonic() + s.reap_every_s
                for run_id in reap(s):
                    log.warning("re-queued lost run %s", run_id)
        except Exception as e:  # noqa: BLE001 - keep the worker alive through database outages
            log.warning("worker heartbeat/reaper failed: %s", e)


_stop = threading.Event()


@signals.worker_ready.connect
def _on_ready(sender=None, **_: object) -> None:
    from db.migrate import check_schema
    from db.repo import SchemaOutOfDate

    try:
        check_schema()  # refuse to work on an out-of-date schema
    except SchemaOutOfDate as e:
        log.critical("%s", e)  # the message names the command to run
        os._exit(3)
    _state["worker_id"] = sender.hostname if sender is not None else f"{socket.gethostname()}:{os.getpid()}"
    _state["queues"] = sorted(q.name for q in sender.app.amqp.queues.consume_from.values()) if sender is not None else []
    threading.Thread(target=_background, args=(_stop, WorkerSettings()), name="worker-duties", daemon=True).start()
    if sender is None or set(_state["queues"]) & set(QUEUES):  # a jobs-only worker (worker/jobs.py) runs no run
        _spare.fill()


@signals.worker_shutdown.connect
def _on_shutdown(**_: object) -> None:
    _stop.set()
    _spare.close()
