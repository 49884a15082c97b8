"""Metric points and events a run could not store yet, kept on disk in the run's folder.

The database sink spills what it holds when the database has been away longer than its memory
window, and when a checkpoint flush cannot finish: a checkpoint is then never ahead of what is kept
somewhere durable. Each spill is one JSON-lines file written to a temporary name, fsynced and renamed,
so a file is either whole or absent. Replaying is idempotent (points by (key, step), events by their
key), so a file is deleted only after it was stored, and a crash in between stores nothing twice.
A resumed attempt on the same host replays the files an earlier attempt left.
"""

from __future__ import annotations

import json
import os
import threading
import time
from collections.abc import Iterator
from datetime import datetime
from pathlib import Path
from typing import Any

from db.repo import EventInput, MetricPoint


class SpillDir:
    """`<run dir>/spill/*.jsonl`, oldest first."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self._lock = threading.Lock()  # the writer thread and the training thread may both spill
        self._n = 0

    def write(self, points: list[MetricPoint], events: list[EventInput]) -> Path | None:
        """Keep points and events in a new file; None when there was nothing to keep."""
        if not points and not events:
            return None
        with self._lock:
            self.root.mkdir(parents=True, exist_ok=True)
            self._n += 1
            final = self.root / f"{time.time_ns():020d}-{os.getpid()}-{self._n:06d}.jsonl"
            tmp = final.with_suffix(".tmp")
            with open(tmp, "w", encoding="utf-8") as f:
                for e in events:
                    f.write(json.dumps({"e": _event_row(e)}) + "\n")
                for p in points:
                    f.write(json.dumps({"m": [p.key, p.step, p.value, p.epoch, p.wall_time]}) + "\n")
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, final)
            return final

    def files(self) -> list[Path]:
        if not self.root.is_dir():
            return []
        return sorted(self.root.glob("*.jsonl"))

    def count(self) -> int:
        return len(self.files())


def read(path: Path) -> tuple[list[MetricPoint], list[EventInput]]:
    points, events = [], []
    for row in _rows(path):
        if "m" in row:
            key, step, value, epoch, wall = row["m"]
            points.append(MetricPoint(key, step, value, epoch, wall))
        elif "e" in row:
            fields = dict(row["e"])
            fields["time"] = datetime.fromisoformat(fields["time"]) if fields.get("time") else None
            events.append(EventInput(**fields))
    return points, events


def _rows(path: Path) -> Iterator[dict[str, Any]]:
    with open(path, encoding="utf-8") as f:
        for line in f:
            if line.strip():
                yield json.loads(line)


def _event_row(e: EventInput) -> dict[str, Any]:
    return {
        "kind": e.kind,
        "level": e.level,
        "message": e.message,
        "code": e.code,
        "data": e.data,
        "key": e.key,
        "time": e.time.isoformat() if e.time else None,
    }
