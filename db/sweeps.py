"""Sweeps, their trials and the pruner's decisions; seed groups.

A trial number is taken once (the primary key of `sweep_trial`): a trial and its runs are inserted in one
transaction, so two processes advancing one sweep never create the same trial twice, and a crash never leaves
a trial without its runs. A decision is stored once per (trial, epoch): the first verdict stays.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from sqlalchemy import Engine, select, update
from sqlalchemy.exc import IntegrityError

from core.names import PRIORITIES
from db.engine import connection_scope, session_scope
from db.errors import RunNotFound, SweepNotFound
from db.metrics import IN_CHUNK
from db.models import Metric, Run, RunTag, Sweep, SweepDecision, SweepTrial
from db.quota import check_queued
from db.run_labels import check_tags
from db.run_records import get_run, load_runs
from db.runs import new_id, queued_row
from db.types import (
    DEFAULT_PROJECT,
    NAME_LEN,
    OWNER_LEN,
    SWEEP_FINISHED,
    DecisionRecord,
    RunRecord,
    SweepRecord,
    TrialRecord,
    check_text,
    json_safe,
    utcnow,
)

RunToCreate = tuple[Mapping[str, Any], str]  # (validated run spec as JSON data, name)


def create_sweep(
    engine: Engine,
    spec: Mapping[str, Any],
    *,
    name: str,
    owner: str,
    max_queued: int | None = None,
    priority: int = 0,
    project: str = DEFAULT_PROJECT,
) -> SweepRecord:
    """Store a new `running` sweep (its trials are created as it advances, each while its owner's queued runs
    stay within `max_queued`, at `priority`: core.names.PRIORITIES' values)."""
    if priority not in PRIORITIES.values():
        raise ValueError(f"priority {priority!r}: one of {sorted(PRIORITIES.values())} ({', '.join(PRIORITIES)})")
    name = name.strip()
    check_text("name", name, NAME_LEN)
    check_text("owner", owner, OWNER_LEN)
    sweep_id = new_id()
    with session_scope(engine) as session:
        session.add(
            Sweep(
                id=sweep_id,
                name=name,
                owner=owner,
                status="running",
                spec=json_safe(dict(spec)),
                created_at=utcnow(),
                max_queued=max_queued,
                priority=priority,
                project=project,
            )
        )
    return get_sweep(engine, sweep_id)


def set_sweep_priority(engine: Engine, sweep_id: str, priority: int) -> int:
    """The priority of a sweep's trials to come and of its queued ones (one of PRIORITIES' values), in one
    transaction; how many queued runs moved. SweepNotFound."""
    if priority not in PRIORITIES.values():
        raise ValueError(f"priority {priority!r}: one of {sorted(PRIORITIES.values())} ({', '.join(PRIORITIES)})")
    with session_scope(engine) as session:
        found = session.execute(update(Sweep).where(Sweep.id == sweep_id).values(priority=priority)).rowcount
        if found != 1:
            raise SweepNotFound(sweep_id)
        stmt = update(Run).where(Run.sweep_id == sweep_id, Run.status == "queued").values(priority=priority)
        return session.execute(stmt.execution_options(synchronize_session=False)).rowcount


def get_sweep(engine: Engine, sweep_id: str) -> SweepRecord:
    with connection_scope(engine) as conn:
        row = conn.execute(select(Sweep.__table__).where(Sweep.id == sweep_id)).first()
    if row is None:
        raise SweepNotFound(sweep_id)
    return _sweep(row)


def list_sweeps(
    engine: Engine, *, status: Sequence[str] = (), limit: int = 500, project: str | None = None
) -> list[SweepRecord]:
    """Newest first (of one project, or of all)."""
    query = select(Sweep.__table__).order_by(Sweep.created_at.desc()).limit(limit)
    if project is not None:
        query = query.where(Sweep.project == project)
    if status:
        query = query.where(Sweep.status.in_(tuple(status)))
    with connection_scope(engine) as conn:
        return [_sweep(row) for row in conn.execute(query)]


def _sweep(row: Any) -> SweepRecord:
    return SweepRecord(
        id=row.id,
        name=row.name,
        owner=row.owner,
        status=row.status,
        spec=row.spec,
        created_at=row.created_at,
        finished_at=row.finished_at,
        error=row.error,
        max_queued=row.max_queued,
        priority=row.priority or 0,
        project=row.project,
    )


def finish_sweep(engine: Engine, sweep_id: str, status: str, error: str | None = None) -> bool:
    """End a running sweep (completed, cancelled, failed); False when it had already ended."""
    if status not in SWEEP_FINISHED:
        raise ValueError(f"status {status!r} does not end a sweep; use one of {SWEEP_FINISHED}")
    with session_scope(engine) as session:
        stmt = (
            update(Sweep)
            .where(Sweep.id == sweep_id, Sweep.status == "running")
            .values(status=status, finished_at=utcnow(), error=error)
            .execution_options(synchronize_session=False)
        )
        changed = session.execute(stmt).rowcount == 1
    if not changed:
        get_sweep(engine, sweep_id)  # SweepNotFound for an unknown one
    return changed


def add_trial(
    engine: Engine,
    sweep: SweepRecord,
    number: int,
    params: Mapping[str, Any],
    attrs: Mapping[str, Any],
    runs: Sequence[RunToCreate],
    *,
    tags: Sequence[str] = (),
) -> list[RunRecord] | None:
    """Trial `number` of a running sweep with its runs (one per seed, one group), all `queued`, in one
    transaction. None when that number is taken (another process advanced the sweep) or the sweep has ended;
    QueueLimitReached, storing nothing, when the owner's queued runs and these would be over the sweep's
    `max_queued` (counted in this transaction: the trial waits for a later advance)."""
    group_id = new_id()
    tag_list = check_tags(tags)
    ids = []
    try:
        with session_scope(engine) as session:
            alive, limit, priority, project = session.execute(
                select(Sweep.status, Sweep.max_queued, Sweep.priority, Sweep.project)
                .where(Sweep.id == sweep.id)
                .with_for_update()
            ).one()
            if alive != "running":
                return None
            if limit is not None:  # the stored limit, whatever record the caller holds
                check_queued(session, sweep.owner, limit, adding=len(runs))
            session.add(
                SweepTrial(
                    sweep_id=sweep.id,
                    number=number,
                    params=json_safe(dict(params)),
                    attrs=json_safe(dict(attrs)),
                    created_at=utcnow(),
                )
            )
            session.flush()  # the primary key decides here who has this number
            for spec, name in runs:
                group = group_id if len(runs) > 1 else None
                row = queued_row(
                    spec,
                    name,
                    sweep.owner,
                    sweep_id=sweep.id,
                    trial=number,
                    group_id=group,
                    priority=priority or 0,
                    project=project,
                )
                session.add(row)
                ids.append(row.id)
            session.flush()
            session.add_all(RunTag(run_id=i, tag=t) for i in ids for t in tag_list)
    except IntegrityError:
        return None
    with connection_scope(engine) as conn:
        found = load_runs(conn, ids)
    return [found[i] for i in ids]


def trials(engine: Engine, sweep_id: str) -> list[TrialRecord]:
    with connection_scope(engine) as conn:
        rows = conn.execute(
            select(SweepTrial.__table__).where(SweepTrial.sweep_id == sweep_id).order_by(SweepTrial.number)
        ).all()
    return [
        TrialRecord(sweep_id=r.sweep_id, number=r.number, params=r.params, attrs=r.attrs, created_at=r.created_at)
        for r in rows
    ]


def sweep_runs(engine: Engine, sweep_id: str) -> list[RunRecord]:
    """The sweep's runs with tags and summaries, by trial then creation."""
    with connection_scope(engine) as conn:
        ids = list(
            conn.execute(
                select(Run.id).where(Run.sweep_id == sweep_id).order_by(Run.trial, Run.created_at, Run.id)
            ).scalars()
        )
        found = load_runs(conn, ids)
    return [found[i] for i in ids if i in found]


def group_runs(engine: Engine, group_id: str) -> list[RunRecord]:
    with connection_scope(engine) as conn:
        ids = list(
            conn.execute(select(Run.id).where(Run.group_id == group_id).order_by(Run.created_at, Run.id)).scalars()
        )
        found = load_runs(conn, ids)
    return [found[i] for i in ids if i in found]


def set_group(engine: Engine, run_id: str, group_id: str) -> RunRecord:
    """Put a run in a seed group (a run repeated with k seeds joins the group of its repeats)."""
    with session_scope(engine) as session:
        changed = session.execute(
            update(Run).where(Run.id == run_id).values(group_id=group_id).execution_options(synchronize_session=False)
        ).rowcount
    if changed != 1:
        raise RunNotFound(run_id)
    return get_run(engine, run_id)


def epoch_values(engine: Engine, run_ids: Sequence[str], key: str) -> dict[str, dict[int, float]]:
    """Per run, the stored per-epoch value of `key` (an epoch-level metric such as val/acc); NaN kept as NaN."""
    out: dict[str, dict[int, float]] = {run_id: {} for run_id in run_ids}
    ids = list(run_ids)
    with connection_scope(engine) as conn:
        for start in range(0, len(ids), IN_CHUNK):
            query = select(Metric.run_id, Metric.epoch, Metric.value).where(
                Metric.run_id.in_(ids[start : start + IN_CHUNK]), Metric.key == key, Metric.epoch.is_not(None)
            )
            for run_id, epoch, value in conn.execute(query):
                out[run_id][int(epoch)] = float("nan") if value is None else float(value)
    return out


def record_decision(
    engine: Engine,
    sweep_id: str,
    number: int,
    epoch: int,
    *,
    pruned: bool,
    value: float | None,
    reason: str | None,
    attrs: Mapping[str, Any],
    run_id: str | None,
) -> DecisionRecord:
    """Store the verdict on trial `number` at `epoch` unless one is stored already; the stored one is returned."""
    try:
        with session_scope(engine) as session:
            session.add(
                SweepDecision(
                    sweep_id=sweep_id,
                    number=number,
                    epoch=epoch,
                    pruned=pruned,
                    value=value if value is None or value == value else None,
                    reason=reason,
                    attrs=json_safe(dict(attrs)),
                    run_id=run_id,
                    created_at=utcnow(),
                )
            )
    except IntegrityError:
        pass
    return next(d for d in decisions(engine, sweep_id, number) if d.epoch == epoch)


def decisions(engine: Engine, sweep_id: str, number: int | None = None) -> list[DecisionRecord]:
    query = select(SweepDecision.__table__).where(SweepDecision.sweep_id == sweep_id)
    if number is not None:
        query = query.where(SweepDecision.number == number)
    with connection_scope(engine) as conn:
        rows = conn.execute(query.order_by(SweepDecision.number, SweepDecision.epoch)).all()
    return [
        DecisionRecord(
            sweep_id=r.sweep_id,
            number=r.number,
            epoch=r.epoch,
            pruned=bool(r.pruned),
            value=r.value,
            reason=r.reason,
            attrs=r.attrs or {},
            run_id=r.run_id,
        )
        for r in rows
    ]
