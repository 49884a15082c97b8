"""The database side of core's Sink and Control, used inside a run's child process.

The training step only appends to in-memory lists (a lock held for microseconds); a
background thread writes them in batches every `flush_s` or `flush_points`, heartbeats,
and learns whether the run should stop. When the database is unreachable the thread keeps
the batch and retries with backoff, so a brief outage loses nothing; memory stays bounded.
"""

from __future__ import annotations

import logging
import math
import threading
import time
from pathlib import Path
from typing import Any

from sqlalchemy import Engine

from db.repo import (
    EventInput,
    MetricPoint,
    add_artifact,
    append_events,
    append_metrics,
    heartbeat,
)
from db.store import ArtifactStore, StoredObject, file_sha256
from worker.settings import WorkerSettings

log = logging.getLogger("torchdeck.sink")

MAX_BUFFERED_POINTS = 2_000_000  # ~200 MB; at 1,000 points/s that is half an hour of outage


class DbSink:
    """Buffered Sink + Control for one run. `close()` flushes everything (retrying) before returning."""

    def __init__(self, engine: Engine, run_id: str, worker_id: str, settings: WorkerSettings | None = None,
                 store: ArtifactStore | None = None, run_dir: Path | None = None):
        self.engine, self.run_id, self.worker_id = engine, run_id, worker_id
        self.s = settings or WorkerSettings()
        self._points: list[MetricPoint] = []
        self._events: list[EventInput] = []
        self._artifacts: list[tuple[str, str, dict, StoredObject | None]] = []
        # Files go to the store beside the loop when it is not the local run root (worker/artifacts.py).
        self.uploader = None
        if store is not None and run_dir is not None:
            from worker.artifacts import Uploader, needs_upload

            if needs_upload(store, run_dir):
                self.uploader = Uploader(store, run_id, run_dir, self._stored, self._upload_problem)
        self._progress: float | None = None
        self._cancel = False
        self._owned = True
        self.dropped = 0
        self.written = 0
        self.failures = 0
        self._lock = threading.Lock()
        self._wake = threading.Event()
        self._idle = threading.Event()
        self._stop = threading.Event()
        self._last_beat = 0.0
        self._thread = threading.Thread(target=self._loop, name=f"db-sink-{run_id}", daemon=True)
        self._thread.start()

    # --- Sink (called from the training loop: never blocks on the database) ----------------------
    def metrics(self, step: int, epoch: int, values: dict[str, float]) -> None:
        now = time.time()
        pts = [MetricPoint(k, step, float(v), epoch, now) for k, v in values.items()]
        with self._lock:
            self._points.extend(pts)
            over = len(self._points) - MAX_BUFFERED_POINTS
            if over > 0:  # bounded memory: shed the oldest per-step points, count them
                del self._points[:over]
                self.dropped += over
            n = len(self._points)
        if n >= self.s.flush_points:
            self._wake.set()

    def event(self, kind: str, level: str, message: str, data: dict | None = None) -> None:
        data = dict(data or {})
        ev = EventInput(kind=kind, level=level if level in ("debug", "info", "warning", "error") else "info",
                        message=message[:4000], code=data.get("code"), data=_json_safe(data))
        with self._lock:
            self._events.append(ev)

    def artifact(self, kind: str, path: str, meta: dict | None = None) -> None:
        if self.uploader is not None:
            self.uploader.submit(kind, str(path), _json_safe(meta or {}))  # registered once stored
            return
        with self._lock:
            self._artifacts.append((kind, str(path), _json_safe(meta or {}), None))
        self._wake.set()

    def _stored(self, kind: str, obj: StoredObject | None, path: str, meta: dict) -> None:
        """From the uploader: the file is in the store (or could not get there: then its local path)."""
        with self._lock:
            self._artifacts.append((kind, path, meta, obj))
        self._wake.set()

    def _upload_problem(self, message: str) -> None:
        self.event("artifacts", "warning", message, {"code": "upload_failed"})

    def progress(self, done: int, total: int) -> None:
        self._progress = min(1.0, done / total) if total else None

    # --- Control ------------------------------------------------------------------------------------
    def should_stop(self) -> bool:
        return self._cancel or not self._owned

    # --- flushing -----------------------------------------------------------------------------------
    def flush(self, timeout: float = 60.0) -> bool:
        """Wait until everything buffered so far is written (called before each checkpoint)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            with self._lock:
                empty = not (self._points or self._events or self._artifacts)
            if empty and self._idle.is_set():
                return True
            self._idle.clear()
            self._wake.set()
            self._idle.wait(min(0.2, max(0.0, deadline - time.monotonic())))
        return False

    def close(self, timeout: float = 90.0) -> None:
        if self.uploader is not None:
            self.uploader.close()  # every file in the store (and handed back for registration) first
        self.flush(timeout)
        self._stop.set()
        self._wake.set()
        self._thread.join(timeout=5)

    def _loop(self) -> None:
        backoff = 0.0
        while True:
            if backoff:
                time.sleep(backoff)  # honour the backoff even while points keep arriving
            else:
                self._wake.wait(self.s.flush_s)
            self._wake.clear()
            try:
                self._drain()
                self._beat()
                backoff = 0.0
            except Exception as e:  # noqa: BLE001 - the database may be briefly unreachable: keep, retry
                self.failures += 1
                backoff = min(5.0, max(0.25, backoff * 2))
                log.warning("database write failed (%s); retrying in %.1fs", e.__class__.__name__, backoff)
                continue
            with self._lock:
                empty = not (self._points or self._events or self._artifacts)
            if empty:
                self._idle.set()
            if self._stop.is_set() and empty:
                return

    def _drain(self) -> None:
        with self._lock:
            points, self._points = self._points, []
            events, self._events = self._events, []
            artifacts, self._artifacts = self._artifacts, []
        try:
            for i in range(0, len(points), 5000):
                self.written += append_metrics(self.engine, self.run_id, points[i : i + 5000])
            if events:
                append_events(self.engine, self.run_id, events)
                events = []
            while artifacts:
                kind, path, meta, obj = artifacts[0]
                if obj is not None:
                    add_artifact(self.engine, self.run_id, kind, obj.uri, size=obj.size, sha256=obj.sha256, meta=meta)
                else:
                    p = Path(path)
                    size, digest = file_sha256(p) if p.is_file() else (None, None)
                    add_artifact(self.engine, self.run_id, kind, p.resolve().as_uri(), size=size, sha256=digest,
                                 meta=meta)
                artifacts.pop(0)
        except Exception:
            # Put back what was not written, in order, ahead of anything newer. Re-appending points
            # that did get written is harmless: (run, key, step) duplicates are ignored.
            with self._lock:
                self._points[:0] = points
                self._events[:0] = events
                self._artifacts[:0] = artifacts
            raise

    def _beat(self) -> None:
        now = time.monotonic()
        if now - self._last_beat < self.s.heartbeat_s:
            return
        reply = heartbeat(self.engine, self.run_id, worker_id=self.worker_id, progress=self._progress)
        self._cancel, self._owned = reply.cancel_requested, reply.owned
        self._last_beat = now


def _json_safe(v: Any) -> Any:
    if isinstance(v, float) and not math.isfinite(v):
        return str(v)
    if isinstance(v, dict):
        return {str(k): _json_safe(x) for k, x in v.items()}
    if isinstance(v, (list, tuple)):
        return [_json_safe(x) for x in v]
    if isinstance(v, (str, int, float, bool)) or v is None:
        return v
    return str(v)
