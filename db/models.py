"""The schema: SQLAlchemy 2.0 typed models. Alembic migrations (db/migrations) own
the database; a drift test keeps these classes and the migrations identical.

Times are UTC. Metric values that are NaN are stored as NULL with `nonfinite`
set, because SQLite has no NaN (it silently turns NaN into NULL); ±inf are
stored as such on both backends and flagged the same way.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from sqlalchemy import (
    JSON,
    BigInteger,
    Boolean,
    CheckConstraint,
    DateTime,
    Double,
    ForeignKey,
    Index,
    Integer,
    MetaData,
    SmallInteger,
    String,
    Text,
    TypeDecorator,
)
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column

from db.types import (
    DATASET_STATUSES,
    DEFAULT_PROJECT,
    EMAIL_LEN,
    EVENT_KEY_LEN,
    ID_LEN,
    KEY_LEN,
    NAME_LEN,
    OWNER_LEN,
    PROJECT_LEN,
    RUN_STATUSES,
    SWEEP_STATUSES,
    TAG_LEN,
    WORKER_ID_LEN,
)

# Named constraints let Alembic's SQLite batch mode find and alter them later.
NAMING_CONVENTION = {
    "ix": "ix_%(table_name)s_%(column_0_N_name)s",
    "uq": "uq_%(table_name)s_%(column_0_N_name)s",
    "ck": "ck_%(table_name)s_%(constraint_name)s",
    "fk": "fk_%(table_name)s_%(column_0_name)s_%(referred_table_name)s",
    "pk": "pk_%(table_name)s",
}


class UTCDateTime(TypeDecorator[datetime]):
    """Aware UTC datetimes on both backends (SQLite would hand back naive ones)."""

    impl = DateTime(timezone=True)
    cache_ok = True

    def process_bind_param(self, value: datetime | None, dialect: Any) -> datetime | None:
        if value is None:
            return None
        if value.tzinfo is None:
            raise ValueError(f"naive datetime {value!r}: pass an aware (UTC) datetime")
        # SQLite stores the text without an offset, so everything must be in UTC.
        return value.astimezone(UTC)

    def process_result_value(self, value: datetime | None, dialect: Any) -> datetime | None:
        if value is None:
            return None
        if value.tzinfo is None:
            return value.replace(tzinfo=UTC)
        return value.astimezone(UTC)


def _in(values: tuple[str, ...]) -> str:
    return ", ".join(f"'{v}'" for v in values)


class Base(DeclarativeBase):
    metadata = MetaData(naming_convention=NAMING_CONVENTION)


def _project_column() -> Mapped[str]:
    """The project a row belongs to (migration 0014: existing rows are the default project's)."""
    return mapped_column(
        String(PROJECT_LEN),
        ForeignKey("project.name"),
        default=DEFAULT_PROJECT,
        server_default=DEFAULT_PROJECT,
        index=True,
    )


class Run(Base):
    __tablename__ = "run"
    __table_args__ = (
        CheckConstraint(f"status IN ({_in(RUN_STATUSES)})", name="status"),
        CheckConstraint("attempt >= 0", name="attempt"),
        # The Runs page's default order (newest first, ties by id): its first page is read from this index
        # however many runs there are, filtered or not.
        Index("ix_run_created_at_id", "created_at", "id"),
        Index("ix_run_queue_order", "status", "queue", "priority", "owner", "created_at"),  # db/queue_order.py
        Index("ix_run_finished_at", "finished_at"),  # and its owners' recent GPU time
        Index("ix_run_source_status", "source", "status"),  # the reaper's silent scripts
    )

    id: Mapped[str] = mapped_column(String(ID_LEN), primary_key=True)
    name: Mapped[str] = mapped_column(String(NAME_LEN))
    owner: Mapped[str] = mapped_column(String(OWNER_LEN), index=True)
    status: Mapped[str] = mapped_column(String(16), index=True)
    spec: Mapped[dict[str, Any]] = mapped_column(JSON)
    spec_hash: Mapped[str] = mapped_column(String(64), index=True)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime)
    started_at: Mapped[datetime | None] = mapped_column(UTCDateTime)
    finished_at: Mapped[datetime | None] = mapped_column(UTCDateTime)
    heartbeat_at: Mapped[datetime | None] = mapped_column(UTCDateTime)
    worker_id: Mapped[str | None] = mapped_column(String(WORKER_ID_LEN))
    device: Mapped[str | None] = mapped_column(String(64))
    attempt: Mapped[int] = mapped_column(Integer, default=0)
    progress: Mapped[float | None] = mapped_column(Double)
    summary: Mapped[dict[str, Any]] = mapped_column(JSON)
    error: Mapped[str | None] = mapped_column(Text)
    parent_id: Mapped[str | None] = mapped_column(String(ID_LEN), ForeignKey("run.id", ondelete="SET NULL"), index=True)
    cancel_requested: Mapped[bool] = mapped_column(Boolean, default=False)
    # Why the run's stored record may be incomplete (e.g. metrics not stored before a checkpoint); NULL when whole.
    degraded: Mapped[str | None] = mapped_column(Text)
    # A sweep's trial: the sweep, the trial's number in it, and its seed group (runs that differ only by seed;
    # a run repeated with k seeds forms one too, outside any sweep).
    sweep_id: Mapped[str | None] = mapped_column(String(ID_LEN), ForeignKey("sweep.id"), index=True)
    trial: Mapped[int | None] = mapped_column(Integer)
    group_id: Mapped[str | None] = mapped_column(String(ID_LEN), index=True)
    # Plain text about the run, written after launch by its owner or an admin; NULL for none.
    notes: Mapped[str | None] = mapped_column(Text)
    # Its queue (core.names.queue_of its spec) and priority (-1 low, 0 normal, 1 high): the fair queue's order.
    queue: Mapped[str | None] = mapped_column(String(16))
    priority: Mapped[int] = mapped_column(Integer, default=0, server_default="0")
    project: Mapped[str] = _project_column()
    # Who writes it: `torchdeck` (its worker runs its spec) or `mlflow` (a person's own script, through the tracking
    # endpoint of app/tracking/: no spec, queue or worker; its spec holds the script's params and tags).
    source: Mapped[str] = mapped_column(String(16), default="torchdeck", server_default="torchdeck")


class Sweep(Base):
    """Many runs as one experiment: a base spec, a search space, a method, an objective, a budget, a pruner.
    Its trials are ordinary runs (run.sweep_id); the Optuna samplers and pruners work on a study rebuilt from
    these tables each time they decide, so the runs, their metrics and the decisions below are the one record."""

    __tablename__ = "sweep"
    __table_args__ = (CheckConstraint(f"status IN ({_in(SWEEP_STATUSES)})", name="status"),)

    id: Mapped[str] = mapped_column(String(ID_LEN), primary_key=True)
    name: Mapped[str] = mapped_column(String(NAME_LEN))
    owner: Mapped[str] = mapped_column(String(OWNER_LEN), index=True)
    status: Mapped[str] = mapped_column(String(16), index=True)
    spec: Mapped[dict[str, Any]] = mapped_column(JSON)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime, index=True)
    finished_at: Mapped[datetime | None] = mapped_column(UTCDateTime)
    error: Mapped[str | None] = mapped_column(Text)
    # The owner's queued-runs limit at launch (NULL: none), kept as the trials are created (migration 0008).
    max_queued: Mapped[int | None] = mapped_column(Integer)
    priority: Mapped[int] = mapped_column(Integer, default=0, server_default="0")  # its trials' (migration 0013)
    project: Mapped[str] = _project_column()


class SweepTrial(Base):
    """One configuration of a sweep (an Optuna trial): its parameters and the sampler's own attributes.
    The primary key makes a trial number taken once, however many processes advance the sweep."""

    __tablename__ = "sweep_trial"

    sweep_id: Mapped[str] = mapped_column(String(ID_LEN), ForeignKey("sweep.id", ondelete="CASCADE"), primary_key=True)
    number: Mapped[int] = mapped_column(Integer, primary_key=True)
    params: Mapped[dict[str, Any]] = mapped_column(JSON)
    attrs: Mapped[dict[str, Any]] = mapped_column(JSON)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime)


class SweepDecision(Base):
    """The pruner's verdict on a trial at an epoch end, taken once: a trial killed and resumed that reaches
    the same epoch again reads this row instead of being judged a second time."""

    __tablename__ = "sweep_decision"

    sweep_id: Mapped[str] = mapped_column(String(ID_LEN), ForeignKey("sweep.id", ondelete="CASCADE"), primary_key=True)
    number: Mapped[int] = mapped_column(Integer, primary_key=True)
    epoch: Mapped[int] = mapped_column(Integer, primary_key=True)
    pruned: Mapped[bool] = mapped_column(Boolean)
    value: Mapped[float | None] = mapped_column(Double)
    reason: Mapped[str | None] = mapped_column(Text)
    attrs: Mapped[dict[str, Any]] = mapped_column(JSON)
    run_id: Mapped[str | None] = mapped_column(String(ID_LEN))
    created_at: Mapped[datetime] = mapped_column(UTCDateTime)


class RunTag(Base):
    """Tags live in their own table so that filtering by tag is an indexed lookup on both backends."""

    __tablename__ = "run_tag"

    run_id: Mapped[str] = mapped_column(String(ID_LEN), ForeignKey("run.id", ondelete="CASCADE"), primary_key=True)
    tag: Mapped[str] = mapped_column(String(TAG_LEN), primary_key=True, index=True)


class Metric(Base):
    """One point of one series. WITHOUT ROWID on SQLite: the primary key is the
    only b-tree, which halves the work per inserted point.

    No foreign key to `run`, deliberately, here and in `metric_rollup`: the
    check costs half of Postgres' insert time (a trigger per row). The
    repository keeps the reference instead: appends check the run under the
    run's append lock, and delete_run takes that lock and deletes the points.
    """

    __tablename__ = "metric"
    __table_args__ = {"sqlite_with_rowid": False}

    run_id: Mapped[str] = mapped_column(String(ID_LEN), primary_key=True)
    key: Mapped[str] = mapped_column(String(KEY_LEN), primary_key=True)
    step: Mapped[int] = mapped_column(BigInteger, primary_key=True)
    epoch: Mapped[int | None] = mapped_column(Integer)
    value: Mapped[float | None] = mapped_column(Double)  # NULL = NaN
    nonfinite: Mapped[bool] = mapped_column(Boolean, default=False)
    wall_time: Mapped[float] = mapped_column(Double)  # seconds since the epoch


class MetricRollup(Base):
    """Per series, per power-of-two step bucket (`bucket = step >> level`): the
    bucket's extremes and ends, kept up to date as points are appended, so a
    chart of a million points reads about a thousand of these rows.

    min/max consider finite values only; first/last consider every point
    (their value is NULL when that point is NaN). Level `WHOLE_SERIES_LEVEL`
    holds one row per series: its count, ends and extremes.
    """

    __tablename__ = "metric_rollup"
    __table_args__ = {"sqlite_with_rowid": False}

    run_id: Mapped[str] = mapped_column(String(ID_LEN), primary_key=True)  # no FK: see Metric
    # Level before key: a run's whole-series rows (metric keys, summaries)
    # are then one contiguous range of the primary key.
    level: Mapped[int] = mapped_column(SmallInteger, primary_key=True)
    key: Mapped[str] = mapped_column(String(KEY_LEN), primary_key=True)
    bucket: Mapped[int] = mapped_column(BigInteger, primary_key=True)
    count: Mapped[int] = mapped_column(BigInteger)
    nonfinite: Mapped[int] = mapped_column(BigInteger)
    min_step: Mapped[int | None] = mapped_column(BigInteger)
    min_value: Mapped[float | None] = mapped_column(Double)
    max_step: Mapped[int | None] = mapped_column(BigInteger)
    max_value: Mapped[float | None] = mapped_column(Double)
    first_step: Mapped[int] = mapped_column(BigInteger)
    first_value: Mapped[float | None] = mapped_column(Double)
    last_step: Mapped[int] = mapped_column(BigInteger)
    last_value: Mapped[float | None] = mapped_column(Double)


class Event(Base):
    __tablename__ = "event"
    __table_args__ = (
        Index("ix_event_run_id_id", "run_id", "id"),
        # An event's key makes it idempotent: a resumed attempt replaying a step stores its events once.
        # Events without a key (a reaper's note, a supervisor's exit reason) are stored as they come.
        Index("uq_event_run_id_key", "run_id", "key", unique=True),
    )

    # BIGINT on Postgres; SQLite only auto-increments a column declared INTEGER.
    id: Mapped[int] = mapped_column(BigInteger().with_variant(Integer, "sqlite"), primary_key=True, autoincrement=True)
    run_id: Mapped[str] = mapped_column(String(ID_LEN), ForeignKey("run.id", ondelete="CASCADE"))
    time: Mapped[datetime] = mapped_column(UTCDateTime)
    kind: Mapped[str] = mapped_column(String(32))
    level: Mapped[str] = mapped_column(String(16))
    code: Mapped[str | None] = mapped_column(String(64))
    message: Mapped[str] = mapped_column(Text)
    data: Mapped[dict[str, Any] | None] = mapped_column(JSON)
    key: Mapped[str | None] = mapped_column(String(EVENT_KEY_LEN))


class Artifact(Base):
    __tablename__ = "artifact"

    id: Mapped[str] = mapped_column(String(ID_LEN), primary_key=True)  # opaque, never a path
    run_id: Mapped[str] = mapped_column(String(ID_LEN), ForeignKey("run.id", ondelete="CASCADE"), index=True)
    kind: Mapped[str] = mapped_column(String(32))
    uri: Mapped[str] = mapped_column(Text)
    size: Mapped[int | None] = mapped_column(BigInteger)
    sha256: Mapped[str | None] = mapped_column(String(64))
    meta: Mapped[dict[str, Any]] = mapped_column(JSON)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime)


class Worker(Base):
    __tablename__ = "worker"

    id: Mapped[str] = mapped_column(String(WORKER_ID_LEN), primary_key=True)
    hostname: Mapped[str] = mapped_column(String(NAME_LEN))
    queues: Mapped[list[str]] = mapped_column(JSON)
    devices: Mapped[list[dict[str, Any]]] = mapped_column(JSON)
    started_at: Mapped[datetime] = mapped_column(UTCDateTime)
    heartbeat_at: Mapped[datetime] = mapped_column(UTCDateTime)
    current_run_id: Mapped[str | None] = mapped_column(String(ID_LEN))


class Dataset(Base):
    """A dataset a user uploaded (built-in datasets live in code, not here)."""

    __tablename__ = "dataset"
    __table_args__ = (CheckConstraint(f"status IN ({_in(DATASET_STATUSES)})", name="status"),)

    id: Mapped[str] = mapped_column(String(ID_LEN), primary_key=True)
    name: Mapped[str] = mapped_column(String(NAME_LEN), unique=True)
    uri: Mapped[str] = mapped_column(Text)
    classes: Mapped[list[str]] = mapped_column(JSON)
    counts: Mapped[dict[str, int]] = mapped_column(JSON)
    status: Mapped[str] = mapped_column(String(16))
    error: Mapped[str | None] = mapped_column(Text)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime)
    owner: Mapped[str | None] = mapped_column(String(OWNER_LEN), index=True)
    project: Mapped[str] = _project_column()


class Account(Base):
    """An identity seen signing in (team mode): owner columns hold its key; pages show its name."""

    __tablename__ = "account"

    key: Mapped[str] = mapped_column(String(OWNER_LEN), primary_key=True)
    name: Mapped[str] = mapped_column(String(NAME_LEN))
    email: Mapped[str | None] = mapped_column(String(EMAIL_LEN))  # only when the provider verified it
    seen_at: Mapped[datetime] = mapped_column(UTCDateTime)


class Follow(Base):
    """A person following a run: wherever they are in the dashboard, it tells them when the run ends.
    Deleting the run deletes its follows (ON DELETE CASCADE, enforced on SQLite too: db/engine.py)."""

    __tablename__ = "follow"

    owner: Mapped[str] = mapped_column(String(OWNER_LEN), primary_key=True)
    run_id: Mapped[str] = mapped_column(
        String(ID_LEN), ForeignKey("run.id", ondelete="CASCADE"), primary_key=True, index=True
    )
    created_at: Mapped[datetime] = mapped_column(UTCDateTime)


# Tables declared beside their queries, imported here so that Base.metadata (the migrations, the drift test) has them.
import db.alerts  # noqa: E402, F401 - after Base: that module's tables derive from it
import db.evaluations  # noqa: E402, F401 - after Base: that module's table derives from it
import db.projects  # noqa: E402, F401 - after Base: that module's tables derive from it
import db.registry_tables  # noqa: E402, F401 - after Base: that module's tables derive from it


class ApiToken(Base):
    """A personal API token (team mode): a script sends it as its bearer token (MLFLOW_TRACKING_TOKEN) to log runs
    as this person. Only its SHA-256 is kept; whose it is (key, name, verified e-mail, groups) as they were when it
    was made, so that membership is checked again at every use (app/services/tokens.py)."""

    __tablename__ = "api_token"

    id: Mapped[str] = mapped_column(String(ID_LEN), primary_key=True)
    digest: Mapped[str] = mapped_column(String(64), unique=True)
    person: Mapped[str] = mapped_column(String(OWNER_LEN), index=True)
    person_name: Mapped[str] = mapped_column(String(NAME_LEN))
    email: Mapped[str | None] = mapped_column(String(EMAIL_LEN))
    groups: Mapped[list[str]] = mapped_column(JSON)
    label: Mapped[str] = mapped_column(String(NAME_LEN))
    created_at: Mapped[datetime] = mapped_column(UTCDateTime)
    last_used_at: Mapped[datetime | None] = mapped_column(UTCDateTime)
    revoked_at: Mapped[datetime | None] = mapped_column(UTCDateTime)
