"""What the alert rules look at (worker/alerts.py decides whether a condition holds): the runs a rule watches, their
metrics, the workers' heartbeats, the sweeps that finished. Plain rows, a few queries per evaluation round."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from typing import Any, NamedTuple

from sqlalchemy import Engine, func, select

from db.engine import connection_scope
from db.models import Metric, MetricRollup, Run, Sweep, Worker
from db.rollup import WHOLE_SERIES_LEVEL

IN_CHUNK = 500  # run ids per IN (...): well under every backend's bind limit


class WatchedRun(NamedTuple):
    id: str
    name: str
    status: str
    spec: dict[str, Any]
    created_at: datetime
    started_at: datetime | None
    finished_at: datetime | None


_RUN = (Run.id, Run.name, Run.status, Run.spec, Run.created_at, Run.started_at, Run.finished_at)


def runs_in(
    engine: Engine,
    statuses: Sequence[str],
    *,
    run_id: str | None = None,
    finished_after: datetime | None = None,
    project: str | None = None,
) -> list[WatchedRun]:
    """Runs in one of `statuses` (only `run_id` when given, only `project`'s when given; only those finished after
    `finished_after`)."""
    query = select(*_RUN).where(Run.status.in_(list(statuses))).order_by(Run.created_at, Run.id)
    if run_id is not None:
        query = query.where(Run.id == run_id)
    if project is not None:
        query = query.where(Run.project == project)
    if finished_after is not None:
        query = query.where(Run.finished_at > finished_after)
    with connection_scope(engine) as conn:
        return [WatchedRun(*row) for row in conn.execute(query)]


def latest_values(engine: Engine, run_ids: Sequence[str], key: str) -> dict[str, float | None]:
    """Per run, the last stored value of `key` (None when it was NaN); runs without the key are left out."""
    out: dict[str, float | None] = {}
    ids = list(run_ids)
    with connection_scope(engine) as conn:
        for start in range(0, len(ids), IN_CHUNK):
            query = select(MetricRollup.run_id, MetricRollup.last_value).where(
                MetricRollup.run_id.in_(ids[start : start + IN_CHUNK]),
                MetricRollup.level == WHOLE_SERIES_LEVEL,
                MetricRollup.key == key,
            )
            out.update({run_id: value for run_id, value in conn.execute(query)})
    return out


def epoch_points(engine: Engine, run_id: str, key: str) -> list[tuple[int, float | None, float]]:
    """The run's per-epoch points of `key`, in step order: (epoch, value or None for NaN, wall time)."""
    query = (
        select(Metric.epoch, Metric.value, Metric.wall_time)
        .where(Metric.run_id == run_id, Metric.key == key, Metric.epoch.is_not(None))
        .order_by(Metric.step)
    )
    with connection_scope(engine) as conn:
        return [(int(e), v, float(w)) for e, v, w in conn.execute(query)]


def window_minimum(engine: Engine, run_ids: Sequence[str], key: str, since: float) -> dict[str, float]:
    """Per run, the smallest finite value of `key` logged at or after `since` (seconds since the epoch)."""
    out: dict[str, float] = {}
    ids = list(run_ids)
    with connection_scope(engine) as conn:
        for start in range(0, len(ids), IN_CHUNK):
            query = (
                select(Metric.run_id, func.min(Metric.value))
                .where(
                    Metric.run_id.in_(ids[start : start + IN_CHUNK]),
                    Metric.key == key,
                    Metric.wall_time >= since,
                    Metric.value.is_not(None),
                )
                .group_by(Metric.run_id)
            )
            out.update({run_id: float(low) for run_id, low in conn.execute(query) if low is not None})
    return out


def silent_workers(engine: Engine, before: datetime) -> list[tuple[str, str, datetime]]:
    """Workers whose last heartbeat is older than `before`: (id, hostname, heartbeat_at)."""
    query = select(Worker.id, Worker.hostname, Worker.heartbeat_at).where(Worker.heartbeat_at < before)
    with connection_scope(engine) as conn:
        return [tuple(row) for row in conn.execute(query.order_by(Worker.id))]


def worker_ids(engine: Engine) -> list[str]:
    with connection_scope(engine) as conn:
        return [row[0] for row in conn.execute(select(Worker.id))]


def sweeps_finished_after(
    engine: Engine, after: datetime, project: str | None = None
) -> list[tuple[str, str, str, datetime]]:
    """Sweeps (of `project`, when given) that finished after `after`: (id, name, status, finished_at)."""
    query = select(Sweep.id, Sweep.name, Sweep.status, Sweep.finished_at).where(Sweep.finished_at > after)
    if project is not None:
        query = query.where(Sweep.project == project)
    with connection_scope(engine) as conn:
        return [tuple(row) for row in conn.execute(query.order_by(Sweep.finished_at))]
