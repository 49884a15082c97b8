"""The fair queue: the order in which a queue's runs are taken, and the claim that follows it.

The ordering lives here, in the database, not in the broker. Redis hands a queue's messages out first in, first
out and cannot reorder them: a 40-trial sweep queued at 9:00 would hold every GPU until it is done, and a
colleague's run queued at 9:05 would wait behind all of it. So a run's message is only a token for its queue:
the worker that receives one takes the best queued run of that queue (worker/tasks.py), trying the runs in
queue_order with claim_run's conditional UPDATE, so racing workers never take one run twice (the loser moves on
to the next). The order: highest priority first; within a priority, the owner with the least recent GPU time
(device-seconds, each run's weighted by 0.5 ** (hours since it ended / half-life); a running run counts up to
now); then the oldest run. The dashboard shows the same order (queue_order is the one source of it).
"""

from __future__ import annotations

import os
import statistics
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import Connection, Engine, Float, case, func, literal, select, text, union_all, update
from sqlalchemy.ext.compiler import compiles
from sqlalchemy.sql.functions import FunctionElement

from core.names import PRIORITIES, queue_gpus
from db.engine import connection_scope, session_scope
from db.errors import RunNotFound
from db.models import Run
from db.run_records import get_run, records, require_run
from db.runs import claim_run
from db.types import RunRecord, utcnow

# How fast a person's GPU time is forgotten: after 4 h it counts half, so yesterday's sweep is mostly forgiven by
# morning while this morning's still weighs. The workers read it as WorkerSettings.fair_half_life_s (this variable);
# the dashboard shows the queue with the same value.
DEFAULT_HALF_LIFE_S = 4 * 3600.0
HALF_LIFE_ENV = "TORCHDECK_FAIR_HALF_LIFE_S"
_FORGOTTEN = 10  # half-lives after which a run's GPU time weighs under a thousandth: not read at all


def configured_half_life_s() -> float:
    """HALF_LIFE_ENV's value, else DEFAULT_HALF_LIFE_S (for the dashboard: the workers read it through their
    settings, which refuse a bad value at start)."""
    try:
        value = float(os.environ.get(HALF_LIFE_ENV, DEFAULT_HALF_LIFE_S))
    except ValueError:
        return DEFAULT_HALF_LIFE_S
    return value if value > 0 else DEFAULT_HALF_LIFE_S


@dataclass(frozen=True)
class QueuedRun:
    """One queued run in its queue's order, with why it is there."""

    id: str
    name: str
    owner: str
    priority: int
    created_at: datetime
    position: int  # 1: the next run a worker of this queue takes
    owner_usage_s: float  # its owner's recent device-seconds, decayed (the fair-share key within a priority)


class epoch_s(FunctionElement[float]):  # noqa: N801 (an SQL function's name)
    """A timestamp column as seconds since 1970 (UTC), a float on both backends."""

    type = Float()
    inherit_cache = True


@compiles(epoch_s, "sqlite")
def _epoch_sqlite(element: epoch_s, compiler: Any, **kw: Any) -> str:
    # (julianday keeps the fraction of a second that strftime('%s') drops)
    return f"((julianday({compiler.process(element.clauses, **kw)}) - 2440587.5) * 86400.0)"


@compiles(epoch_s)
def _epoch(element: epoch_s, compiler: Any, **kw: Any) -> str:
    # (date_part is EXTRACT's double precision form: EXTRACT's numeric arithmetic costs more than the read)
    return f"date_part('epoch', {compiler.process(element.clauses, **kw)})"


# A queue's distinct (priority, owner) among its queued runs, by a walk of ix_run_queue_order (a "loose index scan":
# for each priority, each step seeks the next owner after the last), so a claim's cost grows with the number of
# groups, not with the 10,000 runs that may wait in them. Plain SQL that SQLite and Postgres both run.
_OWNER_AFTER = """(SELECT r.owner FROM run r WHERE r.status = 'queued' AND r.queue = :queue AND r.priority = {p}{after}
    ORDER BY r.owner LIMIT 1)"""
_GROUPS = text(
    f"""WITH RECURSIVE g(priority, owner) AS (
    SELECT p.priority, {_OWNER_AFTER.format(p="p.priority", after="")}
    FROM ({" UNION ALL ".join(f"SELECT {v} AS priority" for v in sorted(PRIORITIES.values()))}) AS p
    UNION ALL
    SELECT g.priority, {_OWNER_AFTER.format(p="g.priority", after=" AND r.owner > g.owner")}
    FROM g WHERE g.owner IS NOT NULL
)
SELECT priority, owner FROM g WHERE owner IS NOT NULL"""
)


def recent_usage(engine: Engine, owners: Iterable[str], *, now: datetime, half_life_s: float) -> dict[str, float]:
    """Each owner's decayed device-seconds: over their runs that have started, (end - start) × the run's devices
    (its queue's GPUs; a CPU run counts one), weighted by 0.5 ** ((now - end) / half_life_s). The end: finished_at;
    a running run's is now; a lost one's its last heartbeat. Every run of the owner counts, in any queue."""
    with connection_scope(engine) as conn:
        return _usage(conn, owners, now=now, half_life_s=half_life_s)


def _usage(conn: Connection, owners: Iterable[str], *, now: datetime, half_life_s: float) -> dict[str, float]:
    usage = dict.fromkeys(owners, 0.0)
    if not usage:
        return usage
    since = now - timedelta(seconds=_FORGOTTEN * half_life_s)
    # Two index range reads (status; finished_at), owners picked after: a filter on owner would make the database
    # visit every run of those owners, their whole queued backlog included (measured: 4x slower at 10,000 queued).
    # The weighing is summed by the database, per owner and queue: a day of runs read into Python cost most of a
    # claim's time (benchmarks/bench_queue.py).
    at = literal(now.timestamp(), Float)
    ended = case((Run.status == "running", at), else_=epoch_s(func.coalesce(Run.finished_at, Run.heartbeat_at)))
    columns = (Run.owner, Run.queue, epoch_s(Run.started_at).label("start"), ended.label("end"))
    started = (Run.started_at.is_not(None), Run.source == "torchdeck")  # a script's run uses no GPU of the queue
    runs = union_all(
        select(*columns).where(Run.status.in_(("running", "lost")), *started),
        select(*columns).where(Run.finished_at >= since, Run.status.not_in(("running", "lost")), *started),
    ).subquery()
    end = case((runs.c.end > at, at), else_=func.coalesce(runs.c.end, runs.c.start))
    seconds = case((end > runs.c.start, end - runs.c.start), else_=0.0)
    weighed = func.sum(seconds * func.power(0.5, (at - end) / literal(float(half_life_s), Float)))
    query = select(runs.c.owner, runs.c.queue, weighed).where(runs.c.start <= at).group_by(runs.c.owner, runs.c.queue)
    for owner, queue, total in conn.execute(query):
        if owner in usage and total:
            usage[owner] += float(total) * max(queue_gpus(queue or "") or 1, 1)
    return usage


def queue_order(
    engine: Engine,
    queue: str,
    *,
    now: datetime | None = None,
    half_life_s: float = DEFAULT_HALF_LIFE_S,
    limit: int | None = None,
) -> list[QueuedRun]:
    """The queued runs of `queue` in the order workers take them (the first `limit`): priority, highest first;
    then the owner's recent_usage, least first (ties by owner name, so the order is total); then oldest first."""
    return _ordered(engine, [queue], now or utcnow(), half_life_s, limit).get(queue, [])


def queue_orders(
    engine: Engine,
    queues: Iterable[str] | None = None,
    *,
    now: datetime | None = None,
    half_life_s: float = DEFAULT_HALF_LIFE_S,
) -> dict[str, list[QueuedRun]]:
    """queue_order of each of `queues` (None: every queue; a queue with no queued run is left out), in three queries
    however many queues: the dashboard shows every queue at once."""
    return _ordered(engine, None if queues is None else list(queues), now or utcnow(), half_life_s, None)


@dataclass(frozen=True)
class Waiting:
    """The runs waiting for a worker, as the dashboard lists them."""

    runs: list[RunRecord]  # lost runs first (their own message resumes them), then queued runs by place
    places: dict[str, QueuedRun]  # every queued run's place, by id (not only those in `runs`)
    total: int  # how many wait in all, lost runs included


def waiting(
    engine: Engine, *, limit: int, now: datetime | None = None, half_life_s: float = DEFAULT_HALF_LIFE_S
) -> Waiting:
    """At most `limit` waiting runs: the lost ones (oldest first), then the queued ones by their place, each queue's
    first places before any queue's later ones, so a run that goes next is listed however many wait behind it."""
    lines = _ordered(engine, None, now or utcnow(), half_life_s, None)
    places = {q.id: q for line in lines.values() for q in line}
    with connection_scope(engine) as conn:
        lost = (Run.status == "lost") & (Run.source == "torchdeck")  # a script's lost run waits for nothing
        lost_total = conn.execute(select(func.count()).select_from(Run).where(lost)).scalar_one()
        rows = conn.execute(select(Run.__table__).where(lost).order_by(Run.created_at, Run.id).limit(limit)).all()
        heads = sorted(places.values(), key=lambda q: (q.position, q.created_at, q.id))[: limit - len(rows)]
        if heads:
            queued = conn.execute(select(Run.__table__).where(Run.id.in_([q.id for q in heads]))).all()
            rows += sorted(queued, key=lambda r: (r.queue, places[r.id].position))
        found = records(conn, rows)
    return Waiting([found[r.id] for r in rows], places, lost_total + len(places))


def _ordered(
    engine: Engine, queues: list[str] | None, now: datetime, half_life_s: float, limit: int | None
) -> dict[str, list[QueuedRun]]:
    """The runs in groups of (queue, priority, owner), the groups ranked, each group oldest first. A claim (a
    `limit`) reads only the first groups' first runs, from the index ix_run_queue_order, however long the queue;
    the whole order (the dashboard) is one read, sorted here by the same key."""
    where = (Run.status == "queued", *(() if queues is None else (Run.queue.in_(queues),)))
    with connection_scope(engine) as conn:  # (one connection for the three reads: a claim's time is mostly round trips)
        if (
            queues is not None and len(queues) == 1
        ):  # a claim, or one queue's line: a walk of the index, one step per group
            groups = [(queues[0], p, o) for p, o in conn.execute(_GROUPS, {"queue": queues[0]})]
        else:
            groups = [
                tuple(g) for g in conn.execute(select(Run.queue, Run.priority, Run.owner).where(*where).distinct())
            ]
        if not groups:
            return {}
        usage = _usage(conn, {g[2] for g in groups}, now=now, half_life_s=half_life_s)
        groups.sort(key=lambda g: (g[0], -g[1], usage[g[2]], g[2]))
        rank = {g: i for i, g in enumerate(groups)}
        columns = (Run.id, Run.name, Run.owner, Run.priority, Run.created_at, Run.queue)
        rows = []
        if limit is None:
            rows = conn.execute(select(*columns).where(*where)).all()
        else:
            for queue, priority, owner in groups:
                if len(rows) >= limit:
                    break
                group = (Run.status == "queued", Run.queue == queue, Run.priority == priority, Run.owner == owner)
                query = select(*columns).where(*group).order_by(Run.created_at, Run.id).limit(limit - len(rows))
                rows += conn.execute(query).all()
    # (plain tuples: a Row's attributes by name cost more than the sort of 10,000 runs itself)
    plain = sorted(map(tuple, rows), key=lambda r: (rank.get((r[5], r[3], r[2]), len(rank)), r[4], r[0]))
    out: dict[str, list[QueuedRun]] = {}
    for run_id, name, owner, priority, created_at, queue in plain:
        line = out.setdefault(queue, [])
        line.append(QueuedRun(run_id, name, owner, priority, created_at, len(line) + 1, usage.get(owner, 0.0)))
    return out


def claim_next(
    engine: Engine,
    queue: str,
    worker_id: str,
    device: str | None = None,
    *,
    now: datetime | None = None,
    half_life_s: float = DEFAULT_HALF_LIFE_S,
    batch: int = 16,
) -> RunRecord | None:
    """Claim the best queued run of `queue` (queue_order), trying the candidates in order with claim_run: a run
    another worker took (or deleted) meanwhile is passed over. None when no queued run is left. Every failed try
    means the run left `queued` for good, so the loop ends."""
    while True:
        candidates = queue_order(engine, queue, now=now, half_life_s=half_life_s, limit=batch)
        if not candidates:
            return None
        for c in candidates:
            try:
                run = claim_run(engine, c.id, worker_id, device=device, now=now)
            except RunNotFound:
                continue
            if run is not None:
                return run


def set_priority(engine: Engine, run_id: str, priority: int) -> RunRecord | None:
    """Change a queued run's priority (one of PRIORITIES' values); None, changing nothing, once it has left the
    queue (RunNotFound for an unknown run)."""
    if priority not in PRIORITIES.values():
        raise ValueError(f"priority {priority!r}: one of {sorted(PRIORITIES.values())} ({', '.join(PRIORITIES)})")
    with session_scope(engine) as session:
        stmt = (
            update(Run)
            .where(Run.id == run_id, Run.status == "queued")
            .values(priority=priority)
            .execution_options(synchronize_session=False)
        )
        if session.execute(stmt).rowcount != 1:
            require_run(session, run_id)
            return None
    return get_run(engine, run_id)


def typical_run_s(engine: Engine, queues: Iterable[str], *, last: int = 20) -> dict[str, float]:
    """The median run time (start to end) of each queue's last `last` completed runs: what a queued run's estimated
    start is made of (a queue with none is left out). One query however many queues."""
    queues = list(queues)
    if not queues:
        return {}
    took = (epoch_s(Run.finished_at) - epoch_s(Run.started_at)).label("took")
    done = (Run.status == "completed", Run.started_at.is_not(None))
    # Each queue's newest runs from the index on finished_at, read backwards: however long the history.
    parts = [
        select(Run.queue, took).where(*done, Run.queue == q).order_by(Run.finished_at.desc()).limit(last).subquery()
        for q in queues
    ]
    query = union_all(*(select(p.c.queue, p.c.took) for p in parts))
    times: dict[str, list[float]] = {}
    with connection_scope(engine) as conn:
        for queue, seconds in conn.execute(query):
            if seconds is not None:
                times.setdefault(queue, []).append(max(float(seconds), 0.0))
    # (rounded: julianday keeps about 10 µs)
    return {queue: round(statistics.median(t), 3) for queue, t in times.items()}
