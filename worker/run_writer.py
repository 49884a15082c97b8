"""What stores one run's buffered items in the database, for the sink's writer thread (worker/sink.py): events and
metric points in batches, an item the store refuses dropped on its own and reported once as a warning event
(worker/refused.py) while the rest of its batch is stored; artifact rows; and the spill files an outage left.

Each method takes the list it is given and removes what it stored, in order: when the database fails half-way,
the caller puts back what the list still holds."""

from __future__ import annotations

import hashlib
import logging
from collections.abc import Callable, Sequence
from pathlib import Path

from sqlalchemy import Engine

from db.artifacts import StoredObject, file_sha256
from db.repo import (
    EventInput,
    MetricPoint,
    add_artifact,
    append_events,
    append_metrics,
    event_problem,
    point_problem,
)
from worker import spill
from worker.refused import REFUSED, store_each

log = logging.getLogger("torchdeck.sink")

BATCH_POINTS = 5000  # points per append_metrics call
BATCH_EVENTS = 1000
Artifact = tuple[str, str, dict, StoredObject | None]  # kind, path, meta, the stored object (None: a local file)
Report = Callable[..., None]  # the sink's event(kind, level, message, data)


class RunWriter:
    """The writes of one run, guarded by `worker_id` (None: a job on a run nobody executes, unguarded). `report`
    sends a refusal as the run's warning event; `on_artifact(kind)` is told of each artifact row stored."""

    def __init__(
        self,
        engine: Engine,
        run_id: str,
        worker_id: str | None,
        report: Report,
        on_artifact: Callable[[str], None] | None = None,
    ) -> None:
        self.engine, self.run_id, self.worker_id = engine, run_id, worker_id
        self.report, self.on_artifact = report, on_artifact
        self._refused: set[str] = set()  # what was reported already: a metric key, or "event"
        self.dropped = self.written = 0

    def events(self, events: list[EventInput]) -> None:
        while events:
            store_each(events[:BATCH_EVENTS], self._write_events, event_problem, self._refused_event)
            del events[:BATCH_EVENTS]

    def points(self, points: list[MetricPoint]) -> None:
        while points:
            store_each(points[:BATCH_POINTS], self._write_points, point_problem, self._refused_point)
            del points[:BATCH_POINTS]

    def artifacts(self, artifacts: list[Artifact]) -> None:
        while artifacts:
            self._write_artifact(artifacts[0])
            artifacts.pop(0)

    def replay(self, spilled: spill.SpillDir) -> None:
        """Store the spill files, oldest first, each deleted once stored (storing one twice keeps it once)."""
        for path in spilled.files():
            points, events = spill.read(path)
            counts = len(points), len(events)
            self.events(events)
            self.points(points)
            path.unlink()
            log.info("stored %d spilled points and %d events of run %s from %s", *counts, self.run_id, path.name)

    def _write_points(self, points: Sequence[MetricPoint]) -> None:
        self.written += append_metrics(self.engine, self.run_id, points, worker_id=self.worker_id)

    def _write_events(self, events: Sequence[EventInput]) -> None:
        append_events(self.engine, self.run_id, events, worker_id=self.worker_id)

    def _refused_point(self, point: MetricPoint, why: str) -> None:
        self.dropped += 1
        if point.key in self._refused:
            return
        self._refused.add(point.key)
        digest = hashlib.sha256(str(point.key).encode()).hexdigest()[:16]
        self.report(
            "metrics",
            "warning",
            f"metric {str(point.key)[:80]!r} is not recorded: the store refused it ({why})",
            {"code": "metric_refused", "key": str(point.key)[:1000], "reason": why, "id": digest},
        )

    def _refused_event(self, event: EventInput, why: str) -> None:
        self.dropped += 1
        log.warning("event %r of run %s refused by the store: %s", event.message[:80], self.run_id, why)
        if "event" not in self._refused:
            self._refused.add("event")
            self.report(
                "lifecycle",
                "warning",
                f"an event was refused by the store and is not recorded: {why}",
                {"code": "event_refused", "reason": why, "kind": str(event.kind)[:32]},
            )

    def _write_artifact(self, item: Artifact) -> None:
        kind, path, meta, obj = item
        try:
            if obj is not None:
                add_artifact(self.engine, self.run_id, kind, obj.uri, size=obj.size, sha256=obj.sha256, meta=meta)
            else:
                p = Path(path)
                size, digest = file_sha256(p) if p.is_file() else (None, None)
                add_artifact(self.engine, self.run_id, kind, p.resolve().as_uri(), size=size, sha256=digest, meta=meta)
            if self.on_artifact is not None:
                self.on_artifact(kind)
        except REFUSED as e:
            self.report(
                "artifacts",
                "warning",
                f"artifact {kind!r} ({Path(path).name}) is not recorded: the store refused it ({e})",
                {"code": "artifact_refused", "kind": str(kind)[:32]},
            )
