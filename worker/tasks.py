"""The run task (thin: it claims, spawns and supervises) and the worker's background duties
(its own heartbeat row, and the reaper that re-queues runs whose worker died: worker/reaper.py)."""

from __future__ import annotations

import logging
import multiprocessing as mp
import os
import secrets
import signal
import socket
import threading
import time

from celery import signals
from sqlalchemy import Engine

from core.names import RUN_TASK, gpu_key, is_run_queue
from db.engine import make_engine
from db.repo import (
    EventInput,
    RunNotFound,
    append_events,
    finish_run,
    get_run,
    heartbeat,
    upsert_worker,
)
from worker.celery_app import app
from worker.child import ABANDONED_EXIT, RANK_LOST_EXIT, spare_main
from worker.claim import take_turn
from worker.exits import describe_exit, run_processes
from worker.notify import notify_run_end
from worker.reaper import advance_sweep, reap, resume_after_rank_loss
from worker.settings import WorkerSettings

log = logging.getLogger("torchdeck.worker")

_engine: Engine | None = None
_state = {"worker_id": None, "current_run": None, "queues": []}


def engine() -> Engine:
    global _engine
    if _engine is None:
        _engine = make_engine()
    return _engine


def new_worker_id(node: str) -> str:
    """Unique per worker process: two workers started with the same node name on one host (two
    `torchdeck up`, two `torchdeck worker`) still never pass for each other in the claim, heartbeat and
    finish guards. The node name comes first, so a person still sees which worker it is."""
    return f"{node}/{os.getpid()}-{secrets.token_hex(3)}"


@app.task(name=RUN_TASK, acks_late=True, reject_on_worker_lost=True, ignore_result=True)
def execute_run(run_id: str) -> str:
    """Claim the best queued run of this message's queue (worker/claim.py: the message is a token for its queue;
    a lost run named by it is resumed), then run it in a fresh spawned process. A duplicate delivery finds the run
    taken and exits."""
    worker_id = _state["worker_id"] or new_worker_id(socket.gethostname())
    try:
        run = take_turn(engine(), run_id, worker_id, device=_device_label())
    except RunNotFound:
        log.info("run %s was deleted: skipping this delivery", run_id)
        return "skipped"
    if run is None:
        log.info("run %s is running elsewhere or finished, and its queue is empty: skipping this delivery", run_id)
        return "skipped"
    _state["current_run"] = run.id
    try:
        return supervise(run.id, worker_id)
    finally:
        _state["current_run"] = None
        if run.sweep_id is not None:
            advance_sweep(engine(), run.sweep_id)
        notify_run_end(engine(), run.id, worker_id=worker_id)  # (in the background: only if it ended here)


def _device_label() -> str:
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    return f"cuda:{visible}" if visible not in (None, "") else "cpu"


PRELOAD = "worker.preload"  # imported once by the fork server: what every run's process needs (see there)


def start_context(method: str):
    """The multiprocessing context a run's process starts from (WorkerSettings.run_start). forkserver: the
    worker's fork server (started with its first run process) imports PRELOAD once and forks every run process
    from it; where the platform has none, spawn."""
    if method == "forkserver" and "forkserver" in mp.get_all_start_methods():
        ctx = mp.get_context("forkserver")
        ctx.set_forkserver_preload([PRELOAD])  # (read when the server starts: later calls change nothing)
        return ctx
    return mp.get_context("spawn")


class Spare:
    """One fresh process kept ready (libraries imported, no run yet), forked from the worker's fork server
    (or spawned: WorkerSettings.run_start). Never a fork of the worker itself, and never of a process that
    touched CUDA: the fork server only imports (worker.preload), so CUDA is first initialised in the run's own
    process; a process serves one run and returns all its memory when it ends. The process ticks a shared
    pulse from its start (worker.child.start_pulse) and sets `ready` once its imports are done."""

    def __init__(self, method: str | None = None) -> None:
        self.method = method  # None: WorkerSettings().run_start, read at each fill
        self.proc: mp.Process | None = None
        self.conn = None
        self.pulse = None
        self.ready = None  # a shared double: the monotonic time the process finished its imports (0 until then)
        self.started = 0.0

    def fill(self) -> None:
        if self.proc is not None and self.proc.is_alive():
            return
        ctx = start_context(self.method or WorkerSettings().run_start)
        parent, child = ctx.Pipe()
        self.pulse = ctx.Value("d", time.monotonic(), lock=False)
        self.ready = ctx.Value("d", 0.0, lock=False)
        self.started = time.monotonic()
        self.proc = ctx.Process(
            target=spare_main, args=(child, self.pulse, self.ready), name="torchdeck-run", daemon=False
        )
        self.proc.start()
        child.close()
        self.conn = parent

    def take(self, job: tuple) -> tuple[mp.Process, object]:
        self.fill()
        proc, conn, pulse, ready, started = self.proc, self.conn, self.pulse, self.ready, self.started
        self.proc = self.conn = self.pulse = self.ready = None
        conn.send(job)
        conn.close()
        now = time.monotonic()
        if ready.value:
            log.debug("run %s: handed to a ready process (its imports done %.1f s ago)", job[0], now - ready.value)
        else:  # the run starts once they are: what a sweep's next trial waits for after a short trial
            log.info("run %s: handed to a process still importing (started %.1f s ago)", job[0], now - started)
        return proc, pulse

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
        self.proc = self.conn = self.pulse = self.ready = None


_spare = Spare()


def supervise(run_id: str, worker_id: str, settings: WorkerSettings | None = None) -> str:
    """Hand the run to a fresh process, relay a cancel (stop between steps → SIGTERM → SIGKILL), explain its exit."""
    s = settings or WorkerSettings()
    proc, pulse = _spare.take((run_id, worker_id, engine().url.render_as_string(hide_password=False)))
    _spare.fill()  # the next run's process is ready while this one trains: the next run starts at once
    try:
        return _watch(proc, pulse, run_id, worker_id, s)
    finally:
        _spare.fill()  # (it died meanwhile: ready again for the next run)


class _Watch:
    """The supervisor's view of its child: alive (ticking its pulse), cancelled, still the run's owner."""

    def __init__(self, proc: mp.Process, pulse, run_id: str, worker_id: str, s: WorkerSettings) -> None:
        self.proc, self.pulse, self.run_id, self.worker_id, self.s = proc, pulse, run_id, worker_id, s
        self.cancel_at: float | None = None
        self.termed = False
        self.silent = False  # the child stopped ticking (hung, stopped): logged once
        self.gave_up: str | None = None

    def responsive(self, now: float) -> bool:
        return now - self.pulse.value < max(3 * self.s.heartbeat_s, 2.0)

    def check(self, now: float) -> None:
        if self.responsive(now):
            if self.silent:
                log.info("run %s: its process responds again", self.run_id)
            self.silent = False
            # The worker heartbeats too: a child still importing torch on a busy machine is not lost.
            reply = heartbeat(engine(), self.run_id, worker_id=self.worker_id)
            if self.cancel_at is None and reply.cancel_requested:
                self.cancel_at = now  # the child sees it through its own heartbeat and stops between steps
            if not reply.owned:
                run = get_run(engine(), self.run_id)
                if run.worker_id != self.worker_id:  # (if it finished as ours, the child is exiting: let it)
                    self._give_up(f"the run is {run.status} on {run.worker_id}")
            return
        if not self.silent:
            self.silent = True
            log.warning("run %s: its process stopped responding; no heartbeat for it until it does", self.run_id)
        try:  # a hung child keeps no run: once another worker has it (or it is gone), kill the child
            run = get_run(engine(), self.run_id)
        except RunNotFound:
            self._give_up("the run was deleted")
            return
        if run.worker_id != self.worker_id or run.finished:
            self._give_up(f"the run is {run.status} on {run.worker_id}")

    def _give_up(self, why: str) -> None:
        self.gave_up = why
        log.warning("run %s: %s; killing its process here", self.run_id, why)
        self.proc.kill()

    def relay_cancel(self, now: float) -> None:
        if self.cancel_at is None:
            return
        if not self.termed and now - self.cancel_at > self.s.cancel_grace_s:
            self.proc.terminate()
            self.termed = True
        elif self.termed and now - self.cancel_at > self.s.cancel_grace_s + 10:
            self.proc.kill()


def _watch(proc: mp.Process, pulse, run_id: str, worker_id: str, s: WorkerSettings) -> str:
    w = _Watch(proc, pulse, run_id, worker_id, s)
    next_check = 0.0
    while proc.is_alive():
        proc.join(timeout=0.5)
        now = time.monotonic()
        if now >= next_check and w.gave_up is None:
            next_check = now + s.heartbeat_s
            try:
                w.check(now)
            except RunNotFound:
                w._give_up("the run was deleted")
            except Exception as e:  # noqa: BLE001 - the database may be briefly away; the child keeps going
                log.warning("could not heartbeat run %s: %s", run_id, e)
        w.relay_cancel(now)
    code = proc.exitcode
    # A run of several processes whose rank 0 (this process) was SIGKILLed lost a rank too: resumed, attempts bounded.
    if w.gave_up is None and (
        code == RANK_LOST_EXIT
        or (code == -signal.SIGKILL and w.cancel_at is None and run_processes(engine(), run_id) > 1)
    ):
        return resume_after_rank_loss(engine(), run_id, worker_id, s)
    if w.gave_up is not None or code == ABANDONED_EXIT:
        log.warning("run %s left to its new owner (%s)", run_id, w.gave_up or "its process gave it up")
        return "abandoned"
    if code != 0:
        status = "cancelled" if w.cancel_at is not None else "failed"
        reason = describe_exit(code)
        try:
            if finish_run(engine(), run_id, status, error=reason, worker_id=worker_id) is not None:
                append_events(
                    engine(),
                    run_id,
                    [EventInput("lifecycle", "error", reason, code="process_exit", data={"exitcode": code})],
                )
        except Exception as e:  # noqa: BLE001
            log.error("could not record the end of run %s: %s", run_id, e)
    return f"exit {code}"


# --- the worker's background duties -----------------------------------------------------------------


def _devices() -> list[dict]:
    from worker.child import gpu_metrics

    gpus = gpu_metrics()
    n = len({k.split("_")[0] for k in gpus})
    return [
        {"kind": "gpu", "index": i, "util": gpus.get(gpu_key(i, "util")), "mem_mb": gpus.get(gpu_key(i, "mem_mb"))}
        for i in range(n)
    ] or [{"kind": "cpu", "cores": os.cpu_count()}]


def _background(stop: threading.Event, s: WorkerSettings) -> None:
    next_reap = 0.0
    while not stop.wait(min(s.heartbeat_s, 5.0)):
        try:
            upsert_worker(
                engine(),
                _state["worker_id"],
                hostname=socket.gethostname(),
                queues=_state["queues"],
                devices=_devices(),
                current_run_id=_state["current_run"],
            )
            if time.monotonic() >= next_reap:
                next_reap = time.monotonic() + s.reap_every_s
                for run_id in reap(engine(), s):
                    log.warning("re-queued lost run %s", run_id)
        except Exception as e:  # noqa: BLE001 - keep the worker alive through database outages
            log.warning("worker heartbeat/reaper failed: %s", e)


def _forget_earlier_selves(node: str, s: WorkerSettings) -> None:
    """Rows of earlier processes of this worker (same node name, no heartbeat for stale_after_s): each
    process has its own id, so a restarted worker would otherwise leave its old row behind forever."""
    from datetime import UTC, datetime

    from db.repo import list_workers, remove_worker

    try:
        now = datetime.now(UTC)
        for w in list_workers(engine()):
            if (w.id == node or w.id.startswith(node + "/")) and (
                now - w.heartbeat_at
            ).total_seconds() > s.stale_after_s:
                remove_worker(engine(), w.id)
    except Exception as e:  # noqa: BLE001 - housekeeping never stops a worker from starting
        log.warning("could not remove this worker's earlier rows: %s", e)


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
    node = sender.hostname if sender is not None else socket.gethostname()
    _state["worker_id"] = new_worker_id(node)
    _forget_earlier_selves(node, WorkerSettings())
    _state["queues"] = (
        sorted(q.name for q in sender.app.amqp.queues.consume_from.values()) if sender is not None else []
    )
    threading.Thread(target=_background, args=(_stop, WorkerSettings()), name="worker-duties", daemon=True).start()
    if sender is None or any(is_run_queue(q) for q in _state["queues"]):  # a jobs-only worker runs no run
        _spare.fill()


@signals.worker_shutdown.connect
def _on_shutdown(**_: object) -> None:
    _stop.set()
    _spare.close()
