"""The narrow interface between the training core and whoever watches it.

`core` reports everything through a `Sink` and asks a `Control` whether to stop.
The worker implements both against the database; `torchdeck train` uses the
JSON-lines and console sinks below. No torch import here.
"""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

from core.names import TEST_EVENT, json_safe


@runtime_checkable
class Sink(Protocol):
    """What core reports through. A sink that buffers may also define `flush() -> bool`: core calls
    it before writing each checkpoint, so a resumed run never leaves a gap in stored metrics.

    `event(..., step=N)` says the event belongs to the training at global step N (an evaluation, a
    diagnosis, the end of the run): a resumed attempt that replays step N emits it again, and a sink
    that stores events keeps it once. Events without a step belong to the attempt itself (its
    start-up: data, model, "resumed from"), one set per attempt."""

    def metrics(self, step: int, epoch: int, values: dict[str, float]) -> None: ...
    def event(
        self, kind: str, level: str, message: str, data: dict | None = None, *, step: int | None = None
    ) -> None: ...
    def artifact(self, kind: str, path: str, meta: dict | None = None) -> None: ...
    def progress(self, done: int, total: int) -> None: ...


@runtime_checkable
class Control(Protocol):
    """Whether the loop must stop between steps. A control may also define `judge_epoch(epoch) -> str | None`:
    the loop calls it after each epoch's checkpoint (and, when it resumes, for the epoch it resumes after), and a
    reason returned ends the run as `pruned` (a sweep's trial trailing the others)."""

    def should_stop(self) -> bool: ...


class NeverStop:
    """A Control for runs nobody can cancel (the CLI uses Ctrl-C instead)."""

    def should_stop(self) -> bool:
        return False


class StopFlag:
    """A Control set from another thread or a signal handler."""

    def __init__(self) -> None:
        self._flag = threading.Event()

    def set(self) -> None:
        self._flag.set()

    def should_stop(self) -> bool:
        return self._flag.is_set()


class JsonlSink:
    """metrics.jsonl / events.jsonl / artifacts.jsonl in a run folder.

    One object per line, flushed per write so a crash loses nothing and
    `pandas.read_json(path, lines=True)` reads it while the run goes on.
    """

    def __init__(self, out_dir: str | Path) -> None:
        self.out = Path(out_dir)
        self.out.mkdir(parents=True, exist_ok=True)
        self._metrics = open(self.out / "metrics.jsonl", "a", buffering=1)
        self._events = open(self.out / "events.jsonl", "a", buffering=1)
        self._artifacts = open(self.out / "artifacts.jsonl", "a", buffering=1)
        self.last_progress = (0, 0)

    def metrics(self, step: int, epoch: int, values: dict[str, float]) -> None:
        rec = {"step": step, "epoch": epoch, "time": time.time(), "values": json_safe(values)}
        self._metrics.write(json.dumps(rec) + "\n")

    def event(self, kind: str, level: str, message: str, data: dict | None = None, *, step: int | None = None) -> None:
        rec = {
            "time": time.time(),
            "kind": kind,
            "level": level,
            "message": message,
            "data": json_safe(data or {}),
            "step": step,
        }
        self._events.write(json.dumps(rec) + "\n")

    def artifact(self, kind: str, path: str, meta: dict | None = None) -> None:
        rec = {"time": time.time(), "kind": kind, "path": str(path), "meta": json_safe(meta or {})}
        self._artifacts.write(json.dumps(rec) + "\n")

    def progress(self, done: int, total: int) -> None:
        self.last_progress = (done, total)

    def close(self) -> None:
        for f in (self._metrics, self._events, self._artifacts):
            f.close()


class MultiSink:
    """Fan one stream out to several sinks (e.g. JSON lines + console)."""

    def __init__(self, *sinks: Sink) -> None:
        self.sinks = sinks

    def flush(self) -> bool:
        ok = True
        for s in self.sinks:
            f = getattr(s, "flush", None)
            if f is not None:
                ok = f() is not False and ok
        return ok

    def metrics(self, step: int, epoch: int, values: dict[str, float]) -> None:
        for s in self.sinks:
            s.metrics(step, epoch, values)

    def event(self, kind: str, level: str, message: str, data: dict | None = None, *, step: int | None = None) -> None:
        for s in self.sinks:
            s.event(kind, level, message, data, step=step)

    def artifact(self, kind: str, path: str, meta: dict | None = None) -> None:
        for s in self.sinks:
            s.artifact(kind, path, meta)

    def progress(self, done: int, total: int) -> None:
        for s in self.sinks:
            s.progress(done, total)


class NullSink:
    """Writes nothing: the sink of a run's ranks other than 0, whose figures rank 0 reports for the whole run."""

    def metrics(self, step: int, epoch: int, values: dict[str, float]) -> None:
        pass

    def event(self, kind: str, level: str, message: str, data: dict | None = None, *, step: int | None = None) -> None:
        pass

    def artifact(self, kind: str, path: str, meta: dict | None = None) -> None:
        pass

    def progress(self, done: int, total: int) -> None:
        pass


class MemorySink:
    """Keeps everything in lists; for tests and for callers that post-process."""

    def __init__(self) -> None:
        self.metric_rows: list[tuple[int, int, dict[str, float]]] = []
        self.events: list[dict[str, Any]] = []
        self.artifacts: list[dict[str, Any]] = []
        self.progress_calls: list[tuple[int, int]] = []

    def metrics(self, step: int, epoch: int, values: dict[str, float]) -> None:
        self.metric_rows.append((step, epoch, dict(values)))

    def event(self, kind: str, level: str, message: str, data: dict | None = None, *, step: int | None = None) -> None:
        self.events.append({"kind": kind, "level": level, "message": message, "data": data or {}, "step": step})

    def artifact(self, kind: str, path: str, meta: dict | None = None) -> None:
        self.artifacts.append({"kind": kind, "path": str(path), "meta": meta or {}})

    def progress(self, done: int, total: int) -> None:
        self.progress_calls.append((done, total))

    def series(self, key: str) -> list[tuple[int, float]]:
        return [(s, v[key]) for s, _, v in self.metric_rows if key in v]

    def codes(self) -> list[str]:
        return [e["data"].get("code", "") for e in self.events]


class PrintSink:
    """Plain-text progress for terminals without rich (used by `python -m core`)."""

    def __init__(self) -> None:
        self._last = 0.0

    def metrics(self, step: int, epoch: int, values: dict[str, float]) -> None:
        if "val/acc" in values:
            print(
                f"epoch {epoch:3d}  train/loss {values.get('train/epoch_loss', float('nan')):.4f}  "
                f"val/loss {values['val/loss']:.4f}  val/acc {values['val/acc']:.4f}  "
                f"({values.get('epoch_time_s', 0):.1f}s)",
                flush=True,
            )

    def event(self, kind: str, level: str, message: str, data: dict | None = None, *, step: int | None = None) -> None:
        if level != "info" or kind in ("lifecycle", "preflight", TEST_EVENT):
            print(f"[{level}] {message}", flush=True)
            if data and data.get("advice"):
                print(f"        advice: {data['advice']}", flush=True)

    def artifact(self, kind: str, path: str, meta: dict | None = None) -> None:
        pass

    def progress(self, done: int, total: int) -> None:
        pass
