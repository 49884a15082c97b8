"""Where a queued run stands in its queue, why, and about when it starts: the Run and Overview pages' words for
db/queue_order.py's order."""

from __future__ import annotations

from dataclasses import dataclass

from sqlalchemy import Engine

from app.services.broker import queue_status
from core.names import PRIORITIES, queue_of
from db import repo
from db.queue_order import configured_half_life_s
from db.types import RunRecord

PRIORITY_NAMES = {value: name for name, value in PRIORITIES.items()}


def start_eta_s(position: int, workers: int, typical_s: float | None) -> float | None:
    """About how long until the run at `position` (1: next) starts: `workers` take one run each at a time, the runs
    on them now are on average half done, and each run lasts `typical_s` (the median of the queue's recent completed
    runs). None with no worker to take it or no completed run to go by."""
    if workers < 1 or typical_s is None:
        return None
    return ((position - 1) // workers + 0.5) * typical_s


def why(q: repo.QueuedRun, owner: str) -> str:
    """Why a queued run is where it is: its priority, then its owner's recent GPU time (then its age)."""
    used = f"{_hours(q.owner_usage_s)} of recent GPU time" if q.owner_usage_s else "no recent GPU time"
    return f"{PRIORITY_NAMES.get(q.priority, q.priority)} priority; {owner} has {used}"


def _hours(s: float) -> str:
    return f"{s / 3600:.1f} h" if s >= 3600 else f"{s / 60:.0f} min" if s >= 60 else f"{s:.0f} s"


@dataclass(frozen=True)
class Place:
    queue: str
    entry: repo.QueuedRun
    queued: int  # runs waiting in the queue, this one included
    workers: int  # live workers that take runs from it
    typical_s: float | None

    @property
    def eta_s(self) -> float | None:
        return start_eta_s(self.entry.position, self.workers, self.typical_s)


def place(run: RunRecord, engine: Engine) -> Place | None:
    """A queued run's place in its queue (None once it has left the queue)."""
    queue = queue_of(run.spec)
    line = repo.queue_order(engine, queue, half_life_s=configured_half_life_s())
    entry = next((q for q in line if q.id == run.id), None)
    if entry is None:
        return None
    workers = len(queue_status(queue, engine=engine).workers)
    return Place(queue, entry, len(line), workers, repo.typical_run_s(engine, [queue]).get(queue))
