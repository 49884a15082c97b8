"""The database side of core's Sink and Control, used inside a run's child process.

The training step only appends to in-memory lists (a lock held for microseconds). Two background
threads do the rest:
- the writer stores events and artifact rows first, then metric points in batches (worker/run_writer.py),
  every `flush_s` or `flush_points`; a point or event the store refuses is dropped on its own (reported
  once as a warning event) and never holds back the rest of its batch; while the database is unreachable
  it keeps everything and retries with backoff, and what exceeds `sink_buffer_points` is spilled to the
  run's folder (worker/spill.py) and replayed when the database is back;
- the heartbeat thread heartbeats every `heartbeat_s` and learns whether to stop, whatever the
  writer is doing.

A run this process no longer owns (another worker claimed it, it was ended elsewhere, or deleted) is
abandoned at once: nothing more is written into it, and `on_abandon` is called (the run's child
exits). Every event gets an idempotency key (see core.events.Sink), so a resumed attempt stores the
events of the steps it replays once.
"""

from __future__ import annotations

import hashlib
import logging
import os
import threading
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path

from sqlalchemy import Engine

from core.names import MAX_EVENT_DATA, bounded  # noqa: F401 - MAX_EVENT_DATA re-exported: the cap the sink applies
from db.artifacts import ArtifactStore, StoredObject
from db.repo import EventInput, MetricPoint, NotOwned, RunNotFound, heartbeat, mark_degraded
from db.types import EVENT_KEY_LEN, json_safe, utcnow
from worker import spill
from worker.run_writer import Artifact, RunWriter
from worker.settings import WorkerSettings

log = logging.getLogger("torchdeck.sink")


class DbSink:
    """Buffered Sink + Control for one run. `close()` stores everything (retrying) before returning."""

    def __init__(
        self,
        engine: Engine,
        run_id: str,
        worker_id: str | None,
        settings: WorkerSettings | None = None,
        store: ArtifactStore | None = None,
        run_dir: Path | None = None,
        attempt: int = 1,
        on_abandon: Callable[[str], None] | None = None,
        scope: str | None = None,
        on_artifact: Callable[[str], None] | None = None,
    ):
        """`worker_id`: the worker that owns the run (its writes are guarded and it heartbeats); None for a job
        on a run nobody executes (an export now): no heartbeat, no ownership. `scope` prefixes the keys of
        events without a step (default `a<attempt>`); `on_artifact(kind)` is told of each artifact stored."""
        self.engine, self.run_id, self.worker_id, self.attempt = engine, run_id, worker_id, attempt
        self.s = settings or WorkerSettings()
        self.on_abandon = on_abandon
        self.scope = scope or f"a{attempt}"
        self._points: list[MetricPoint] = []
        self._events: list[EventInput] = []
        self._artifacts: list[Artifact] = []
        self.spill = spill.SpillDir(run_dir / "spill") if run_dir is not None else None
        # Files go to the store beside the loop when it is not the local run root (worker/artifacts.py).
        self.uploader = None
        if store is not None and run_dir is not None:
            from worker.artifacts import Uploader, needs_upload

            if needs_upload(store, run_dir):
                self.uploader = Uploader(store, run_id, run_dir, self._stored, self._upload_problem)
        self._progress: float | None = None
        self._cancel = False
        self._owned = True
        self.abandoned: str | None = None  # why this process gave the run up
        self.degraded: str | None = None
        self._degraded_pending = False
        self._keys: Counter[str] = Counter()
        self.writer = RunWriter(engine, run_id, worker_id, self.event, on_artifact)
        self._overflowed = self.failures = 0  # points dropped over the memory cap; failed writes (retried)
        self._lock = threading.Lock()
        self._done = threading.Condition(self._lock)
        self._queued = self._stored_upto = 0  # items handed over / stored so far (flush waits on these)
        self._last_step = 0
        self._flush_points, self._hard_cap = self.s.flush_points, 2 * self.s.sink_buffer_points
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._threads = [threading.Thread(target=self._write_loop, name=f"db-sink-{run_id}", daemon=True)]
        if worker_id is not None:
            self._threads.append(threading.Thread(target=self._beat_loop, name=f"db-beat-{run_id}", daemon=True))
        for t in self._threads:
            t.start()

    # --- Sink (called from the training loop: never blocks on the database) ----------------------
    def metrics(self, step: int, epoch: int, values: dict[str, float]) -> None:
        now = time.time()
        pts = [MetricPoint(k, step, float(v), epoch, now) for k, v in values.items()]
        with self._lock:
            self._points.extend(pts)
            self._queued += len(pts)
            n = len(self._points)
        if n >= self._flush_points:
            self._wake.set()
            if n > self._hard_cap:  # the writer is stuck in a long call: keep memory bounded
                self._spill_memory()

    def event(self, kind: str, level: str, message: str, data: dict | None = None, *, step: int | None = None) -> None:
        data = dict(data or {})
        code = data.get("code")
        ev = EventInput(
            kind=kind,
            level=level if level in ("debug", "info", "warning", "error") else "info",
            message=message[:4000],
            code=code,
            data=bounded(json_safe(data)),
            time=utcnow(),
            key=self._event_key(kind, code, step),
        )
        with self._lock:
            self._events.append(ev)
            self._queued += 1

    def _event_key(self, kind: str, code: str | None, step: int | None) -> str:
        """`s<step>:kind:code:n` for an event of the training (the same in every attempt that replays the
        step), `a<attempt>:kind:code:n` for one of this attempt's start-up; n counts repeats."""
        base = f"{f's{step}' if step is not None else self.scope}:{kind}:{code or '-'}"
        with self._lock:
            n = self._keys[base]
            self._keys[base] += 1
        key = f"{base}:{n}"
        return key if len(key) <= EVENT_KEY_LEN else "h:" + hashlib.sha256(key.encode()).hexdigest()

    def artifact(self, kind: str, path: str, meta: dict | None = None) -> None:
        if self.uploader is not None:
            self.uploader.submit(kind, str(path), json_safe(meta or {}))  # registered once stored
            return
        self._stored(kind, None, str(path), json_safe(meta or {}))

    def _stored(self, kind: str, obj: StoredObject | None, path: str, meta: dict) -> None:
        """The file is in the store (from the uploader), or local (obj None: registered by its path)."""
        with self._lock:
            self._artifacts.append((kind, path, meta, obj))
            self._queued += 1
        self._wake.set()

    def _upload_problem(self, message: str) -> None:
        self.event("artifacts", "warning", message, {"code": "upload_failed"})

    def progress(self, done: int, total: int) -> None:
        self._last_step = done
        self._progress = min(1.0, done / total) if total else None

    # --- Control ------------------------------------------------------------------------------------
    def should_stop(self) -> bool:
        return self._cancel or not self._owned

    # --- what happened to what was handed over -----------------------------------------------------------
    @property
    def dropped(self) -> int:
        """Points and events not recorded: refused by the store, or over the memory cap with no folder to spill to."""
        return self.writer.dropped + self._overflowed

    @property
    def written(self) -> int:
        """Metric points stored."""
        return self.writer.written

    # --- flushing -----------------------------------------------------------------------------------
    def flush(self, timeout: float | None = None) -> bool:
        """Wait until everything handed over so far is stored (core calls it before each checkpoint).
        False when that did not happen in time: what is held is then spilled to the run's folder (so the
        checkpoint is never ahead of what is kept), and the run is marked degraded, with an event."""
        timeout = self.s.flush_timeout_s if timeout is None else timeout
        with self._lock:
            target = self._queued
        self._wake.set()
        with self._done:
            ok = self._done.wait_for(lambda: self._stored_upto >= target or self.abandoned is not None, timeout)
        if ok:
            return self.abandoned is None
        kept = self._spill_memory()
        where = f"kept in {self.spill.root} until it is" if kept and self.spill else "held in memory until it is"
        self.mark_degraded(
            f"the database did not store this run's metrics within {timeout:.0f} s at step "
            f"{self._last_step}; they are {where} reachable again"
        )
        return False

    def mark_degraded(self, reason: str) -> None:
        """The run's stored record may be incomplete: say so on the run (once) and in an event."""
        if self.degraded is None:
            self.degraded = reason
            self._degraded_pending = True
            log.warning("run %s degraded: %s", self.run_id, reason)
            self.event("lifecycle", "warning", reason, {"code": "degraded"})
        self._wake.set()

    def close(self, timeout: float = 90.0) -> None:
        if self.uploader is not None:
            self.uploader.close()  # every file in the store (and handed back for registration) first
        if self.abandoned is None:
            self.flush(timeout)
        self._stop.set()
        self._wake.set()
        for t in self._threads:
            t.join(timeout=10)

    # --- the writer thread --------------------------------------------------------------------------
    def _write_loop(self) -> None:
        _yield_to_training()
        backoff = 0.0
        while self.abandoned is None:
            if backoff:
                time.sleep(backoff)  # honour the backoff even while points keep arriving
            else:
                self._wake.wait(self.s.flush_s)
            self._wake.clear()
            try:
                self._write_once()
                backoff = 0.0
            except (NotOwned, RunNotFound) as e:
                self._abandon(f"{e}")
                return
            except Exception as e:  # noqa: BLE001 - the database may be unreachable: keep, retry, spill
                self.failures += 1
                backoff = min(5.0, max(0.25, backoff * 2))
                log.warning("database write failed (%s); retrying in %.1fs", e.__class__.__name__, backoff)
                if len(self._points) > self.s.sink_buffer_points:
                    self._spill_memory()
                continue
            if self._stop.is_set() and not self._pending():
                return

    def _pending(self) -> bool:
        with self._lock:
            held = bool(self._points or self._events or self._artifacts)
        return held or self._degraded_pending or bool(self.spill and self.spill.count())

    def _write_once(self) -> None:
        with self._lock:
            upto = self._queued
            events, self._events = self._events, []
            artifacts, self._artifacts = self._artifacts, []
            points, self._points = self._points, []
        try:  # each of the writer's calls removes from its list what it stored
            self.writer.events(events)  # events and artifact rows first: they never wait behind metric points
            self.writer.artifacts(artifacts)
            if self._degraded_pending:
                mark_degraded(self.engine, self.run_id, self.degraded or "degraded")
                self._degraded_pending = False
            if self.spill is not None:
                self.writer.replay(self.spill)
            self.writer.points(points)
            with self._lock:  # the reports of what was refused just now go with this flush
                events, self._events = self._events, []
            self.writer.events(events)
        except Exception:
            # Put back what was not stored, in order, ahead of anything newer. Re-storing what did get
            # stored is harmless: points by (key, step) and events by their key are kept once.
            with self._lock:
                self._events[:0] = events
                self._artifacts[:0] = artifacts
                self._points[:0] = points
            raise
        with self._done:
            self._stored_upto = max(self._stored_upto, upto)
            self._done.notify_all()

    # --- spilling ------------------------------------------------------------------------------------
    def _spill_memory(self) -> bool:
        """Move every buffered point and event to a spill file (no run folder: keep them in memory)."""
        if self.spill is None:
            with self._lock:
                over = len(self._points) - self._hard_cap
                if over > 0:  # no folder to spill to: bounded memory, the oldest points go
                    del self._points[:over]
                    self._overflowed += over
            return False
        with self._lock:
            points, self._points = self._points, []
            events, self._events = self._events, []
        try:
            path = self.spill.write(points, events)
        except OSError as e:
            log.error("could not spill %d points of run %s: %s", len(points), self.run_id, e)
            with self._lock:
                self._points[:0], self._events[:0] = points, events
            return False
        if path is not None:
            log.warning(
                "database unreachable: %d points and %d events of run %s kept in %s",
                len(points),
                len(events),
                self.run_id,
                path,
            )
        return True

    # --- the heartbeat thread -------------------------------------------------------------------------
    def _beat_loop(self) -> None:
        while not self._stop.is_set() and self.abandoned is None:
            try:
                reply = heartbeat(self.engine, self.run_id, worker_id=self.worker_id, progress=self._progress)
            except RunNotFound as e:
                self._abandon(f"{e} (deleted)")
                return
            except Exception as e:  # noqa: BLE001 - the database may be briefly away; the writer keeps the data
                log.warning("heartbeat of run %s failed: %s", self.run_id, e.__class__.__name__)
            else:
                self._cancel = reply.cancel_requested
                if not reply.owned:
                    self._abandon(f"run {self.run_id!r} is no longer owned by worker {self.worker_id!r}")
                    return
            self._stop.wait(self.s.heartbeat_s)

    def _abandon(self, reason: str) -> None:
        """Another worker owns the run now, or it is gone: write nothing more into it."""
        with self._done:
            if self.abandoned is not None:
                return
            self.abandoned, self._owned = reason, False
            self._points, self._events, self._artifacts = [], [], []
            self._done.notify_all()
        log.warning("giving up run %s: %s", self.run_id, reason)
        self._wake.set()
        if self.on_abandon is not None:
            self.on_abandon(reason)


WRITER_NICENESS = 10


def _yield_to_training() -> None:
    """Linux: run the calling thread (the writer) at a lower priority than the training threads, so on a busy
    machine batching points never takes a core from a training step; it still gets its share, and the
    heartbeat thread keeps the normal priority."""
    try:
        os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), WRITER_NICENESS)
    except (AttributeError, OSError):  # another OS, or not allowed: the default priority is fine too
        pass
