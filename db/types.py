"""What the repository functions take and return: plain frozen dataclasses, never
live ORM objects, so callers can cache them, pickle them and use them after the
session is gone.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from core.names import (  # noqa: F401 - the statuses and json_safe are re-exported for db's modules
    CLAIMABLE_STATUSES,
    FINISHED_STATUSES,
    MAX_METRIC_KEY,
    RUN_STATUSES,
    SWEEP_FINISHED,
    SWEEP_STATUSES,
    json_safe,
)

EVENT_LEVELS = ("debug", "info", "warning", "error")
DATASET_STATUSES = ("pending", "ready", "failed")

# Column lengths, checked before writing so that the error names the field.
ID_LEN = 32
NAME_LEN = 200
OWNER_LEN = 400  # a team identity is <issuer>#<subject>
EMAIL_LEN = 320
TAG_LEN = 64
NOTES_LEN = 10_000  # a run's notes, in characters
KEY_LEN = MAX_METRIC_KEY  # metric keys (core.names builds the ones made from user input)
EVENT_KEY_LEN = 160
WORKER_ID_LEN = 200
ALIAS_LEN = 64  # a registered model's alias (`production`)
PROJECT_LEN = 40  # a project's name: lower-case letters, digits and dashes (it is part of URLs)
DEFAULT_PROJECT = "default"  # every row made before projects, and everything in local mode unless told otherwise
PROJECT_ROLES = ("viewer", "member", "maintainer")  # in increasing rights (app/projects.py)


@dataclass(frozen=True, slots=True)
class MetricPoint:
    """One value of one metric at one step. NaN and ±inf are accepted (flagged)."""

    key: str
    step: int
    value: float
    epoch: int | None = None
    wall_time: float | None = None  # seconds since the epoch; default: when appended


@dataclass(frozen=True, slots=True)
class SeriesPoint:
    step: int
    value: float  # NaN when the stored point was NaN


@dataclass(frozen=True, slots=True)
class MetricSummary:
    """A series at a glance: its extremes over finite values and its last point."""

    key: str
    count: int
    nonfinite: int
    last_step: int
    last_value: float
    min_value: float | None
    min_step: int | None
    max_value: float | None
    max_step: int | None


@dataclass(frozen=True)
class RunRecord:
    id: str
    name: str
    owner: str
    status: str
    spec: Mapping[str, Any]
    spec_hash: str
    created_at: datetime
    started_at: datetime | None
    finished_at: datetime | None
    heartbeat_at: datetime | None
    worker_id: str | None
    device: str | None
    attempt: int
    progress: float | None
    summary: Mapping[str, Any]
    error: str | None
    tags: tuple[str, ...]
    parent_id: str | None
    cancel_requested: bool
    # Why the stored record may be incomplete (see db.runs.mark_degraded); None when whole.
    degraded: str | None = None
    sweep_id: str | None = None
    trial: int | None = None
    group_id: str | None = None
    # Per metric key; filled by get_run and list_runs.
    metrics: Mapping[str, MetricSummary] = field(default_factory=dict)
    # Plain text about the run (db.run_labels.set_notes); "" for none.
    notes: str = ""
    # Its place in its queue while queued: core.names.PRIORITIES' values (db/queue_order.py).
    priority: int = 0
    project: str = DEFAULT_PROJECT
    # Who writes it: "torchdeck" (a worker runs its spec) or "mlflow" (a person's script, app/tracking/).
    source: str = "torchdeck"

    @property
    def finished(self) -> bool:
        return self.status in FINISHED_STATUSES

    @property
    def external(self) -> bool:
        """Logged by a person's own script (no spec, no worker): resume, clone, exports and tests do not apply."""
        return self.source != "torchdeck"


@dataclass(frozen=True)
class RunPage:
    """One page of `list_runs`: the runs and how many match in total."""

    runs: tuple[RunRecord, ...]
    total: int
    limit: int
    offset: int


@dataclass(frozen=True, slots=True)
class HeartbeatReply:
    cancel_requested: bool
    owned: bool  # False once the run is finished or another worker claimed it

    @property
    def should_stop(self) -> bool:
        return self.cancel_requested or not self.owned


@dataclass(frozen=True)
class Series:
    """A chart-ready series: `steps` and `values` in step order.

    Downsampled series hold, per step bucket of `bucket_width` steps, the
    points with the bucket's smallest and largest finite value, plus the
    series' first and last points; raw series (`bucket_width == 1`) hold every
    point, NaN and ±inf included.
    """

    run_id: str
    key: str
    steps: tuple[int, ...]
    values: tuple[float, ...]
    downsampled: bool
    bucket_width: int
    total_points: int  # in the whole series, not only in this answer
    nonfinite_points: int
    first: SeriesPoint | None
    last: SeriesPoint | None
    min: SeriesPoint | None  # finite values only
    max: SeriesPoint | None

    @property
    def last_step(self) -> int | None:
        """Pass this back as `since_step` to get only newer points."""
        return self.steps[-1] if self.steps else None

    def __len__(self) -> int:
        return len(self.steps)


@dataclass(frozen=True)
class Comparison:
    runs: tuple[RunRecord, ...]
    series: Mapping[str, Mapping[str, Series]]  # run id -> key -> series


@dataclass(frozen=True, slots=True)
class EventInput:
    kind: str  # e.g. "lifecycle", "diagnosis", "log"
    level: str  # one of EVENT_LEVELS
    message: str
    code: str | None = None
    data: Mapping[str, Any] | None = None
    time: datetime | None = None  # default: when appended
    # Idempotency key within the run: a second event with the same key is ignored. None: always stored.
    key: str | None = None


@dataclass(frozen=True)
class EventRecord:
    id: int  # increasing: poll with `after_id` for new events
    run_id: str
    time: datetime
    kind: str
    level: str
    code: str | None
    message: str
    data: Mapping[str, Any] | None


@dataclass(frozen=True)
class ArtifactRecord:
    id: str
    run_id: str
    kind: str
    uri: str
    size: int | None
    sha256: str | None
    meta: Mapping[str, Any]
    created_at: datetime


@dataclass(frozen=True)
class WorkerRecord:
    id: str
    hostname: str
    queues: tuple[str, ...]
    devices: tuple[Mapping[str, Any], ...]
    started_at: datetime
    heartbeat_at: datetime
    current_run_id: str | None


@dataclass(frozen=True)
class DatasetRecord:
    id: str
    name: str
    uri: str
    classes: tuple[str, ...]
    counts: Mapping[str, int]
    status: str
    error: str | None
    created_at: datetime
    owner: str | None = None  # None: uploaded before datasets had owners (only an admin may delete it)
    project: str = DEFAULT_PROJECT


@dataclass(frozen=True)
class AccountRecord:
    """An identity seen signing in: its key (what owner columns hold), the name to show, and the
    e-mail only when the identity provider verified it."""

    key: str
    name: str
    email: str | None
    seen_at: datetime


def stored_float(value: float | None) -> float:
    """A value read back from the metric tables: NULL stands for NaN."""
    return math.nan if value is None else value


def utcnow() -> datetime:
    return datetime.now(UTC)


def check_text(field: str, value: str, limit: int) -> None:
    """A text column's value (a name, an owner, a tag, a worker id): non-empty, and within its column length
    (the *_LEN above), refused with the field's name before the database would refuse it without one."""
    if not isinstance(value, str) or not value.strip():
        raise ValueError(f"{field} must be a non-empty string, got {value!r}")
    if len(value) > limit:
        raise ValueError(f"{field} is {len(value)} characters long; the limit is {limit}")


@dataclass(frozen=True)
class SweepRecord:
    id: str
    name: str
    owner: str
    status: str
    spec: Mapping[str, Any]  # the sweep spec as validated (sweep.spec.SweepSpec), the base run spec inside
    created_at: datetime
    finished_at: datetime | None
    error: str | None
    max_queued: int | None = None  # the owner's queued-runs limit its trials are created under (None: none)
    priority: int = 0  # its trials' place in their queue (core.names.PRIORITIES' values)
    project: str = DEFAULT_PROJECT

    @property
    def finished(self) -> bool:
        return self.status in SWEEP_FINISHED


@dataclass(frozen=True)
class TrialRecord:
    sweep_id: str
    number: int
    params: Mapping[str, Any]  # dotted field -> value
    attrs: Mapping[str, Any]  # the sampler's own attributes (Optuna system attrs)
    created_at: datetime


@dataclass(frozen=True)
class DecisionRecord:
    sweep_id: str
    number: int
    epoch: int
    pruned: bool
    value: float | None
    reason: str | None
    attrs: Mapping[str, Any]  # what the pruner recorded on the trial (e.g. the rungs it completed)
    run_id: str | None
