"""Alerts: rules that watch runs, workers and sweeps (alert_rule), and each time one fired (alert_firing). The
workers' reaper evaluates the rules (worker/alerts.py); the dashboard and the CLI manage them (app/services/alerts.py).

A firing is keyed by (rule, subject, episode): a subject is `run:<id>`, `worker:<id>` or `sweep:<id>`, an episode
counts the times the condition began. Every evaluator computes the same next episode, and the INSERT that does not
win the unique key inserts nothing, so workers evaluating at once fire a condition once. A condition that cleared
may fire again, as the next episode, once the rule's cooldown has passed since it cleared."""

from __future__ import annotations

import secrets
from dataclasses import dataclass
from datetime import datetime, timedelta

from sqlalchemy import (
    BigInteger,
    CheckConstraint,
    Double,
    Engine,
    ForeignKey,
    Index,
    Integer,
    String,
    Text,
    delete,
    func,
    select,
    update,
)
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.orm import Mapped, mapped_column

from db.engine import connection_scope
from db.errors import RunNotFound
from db.models import Base, Run, UTCDateTime
from db.types import ID_LEN, KEY_LEN, OWNER_LEN, PROJECT_LEN, utcnow

ALERT_KINDS = ("metric", "stalled", "diverged", "data_wait", "worker_silent", "queued", "sweep_finished")
SCOPES = ("global", "project", "run")
OPS = ("above", "below")
SUBJECT_LEN = 220  # "worker:" + a worker id (200)
MAX_LISTED = 500  # firings listed per request


class AlertRule(Base):
    """A rule: what to watch (kind, and its key, op, threshold, epochs or minutes) and where (scope: every run, the
    runs of the project `project`, or the run run_id). Deleting the run (or the project) deletes its rules; deleting
    a rule deletes its firings."""

    __tablename__ = "alert_rule"
    __table_args__ = (
        CheckConstraint("scope IN ('global', 'project', 'run')", name="scope"),
        CheckConstraint("(scope = 'run') = (run_id IS NOT NULL)", name="run_scope"),
        CheckConstraint("(scope = 'project') = (project IS NOT NULL)", name="project_scope"),
    )

    id: Mapped[str] = mapped_column(String(ID_LEN), primary_key=True)
    scope: Mapped[str] = mapped_column(String(16))
    run_id: Mapped[str | None] = mapped_column(String(ID_LEN), ForeignKey("run.id", ondelete="CASCADE"), index=True)
    kind: Mapped[str] = mapped_column(String(16))
    key: Mapped[str | None] = mapped_column(String(KEY_LEN))  # the metric of a `metric` rule
    op: Mapped[str | None] = mapped_column(String(8))  # above | below (metric)
    threshold: Mapped[float | None] = mapped_column(Double)  # the value (metric) or the fraction F (data_wait)
    epochs: Mapped[int | None] = mapped_column(Integer)  # stalled: no improvement for this many epochs
    minutes: Mapped[float | None] = mapped_column(Double)  # stalled, data_wait, worker_silent, queued
    cooldown_min: Mapped[float] = mapped_column(Double)  # after the condition cleared, before it may fire again
    created_by: Mapped[str] = mapped_column(String(OWNER_LEN))
    created_at: Mapped[datetime] = mapped_column(UTCDateTime)
    project: Mapped[str | None] = mapped_column(  # migration 0014
        String(PROJECT_LEN), ForeignKey("project.name", ondelete="CASCADE"), index=True
    )


class AlertFiring(Base):
    """One time a rule's condition began for a subject: when, why, and when it cleared (NULL while it holds)."""

    __tablename__ = "alert_firing"
    __table_args__ = (
        Index("uq_alert_firing_rule_id_subject_episode", "rule_id", "subject", "episode", unique=True),
        Index("ix_alert_firing_fired_at", "fired_at"),
    )

    id: Mapped[int] = mapped_column(BigInteger().with_variant(Integer, "sqlite"), primary_key=True, autoincrement=True)
    rule_id: Mapped[str] = mapped_column(String(ID_LEN), ForeignKey("alert_rule.id", ondelete="CASCADE"))
    subject: Mapped[str] = mapped_column(String(SUBJECT_LEN))
    episode: Mapped[int] = mapped_column(Integer)
    run_id: Mapped[str | None] = mapped_column(String(ID_LEN), ForeignKey("run.id", ondelete="CASCADE"), index=True)
    reason: Mapped[str] = mapped_column(Text)
    fired_at: Mapped[datetime] = mapped_column(UTCDateTime)
    cleared_at: Mapped[datetime | None] = mapped_column(UTCDateTime)


@dataclass(frozen=True)
class RuleRecord:
    id: str
    scope: str
    run_id: str | None
    kind: str
    key: str | None
    op: str | None
    threshold: float | None
    epochs: int | None
    minutes: float | None
    cooldown_min: float
    created_by: str
    created_at: datetime
    project: str | None = None  # a project's rule: it watches that project's runs and sweeps


@dataclass(frozen=True)
class FiringRecord:
    id: int
    rule_id: str
    kind: str
    subject: str
    run_id: str | None
    reason: str
    fired_at: datetime
    cleared_at: datetime | None


_RULE_COLUMNS = [getattr(AlertRule, f) for f in RuleRecord.__dataclass_fields__]


def add_rule(
    engine: Engine,
    kind: str,
    *,
    created_by: str,
    run_id: str | None = None,
    key: str | None = None,
    op: str | None = None,
    threshold: float | None = None,
    epochs: int | None = None,
    minutes: float | None = None,
    cooldown_min: float = 60.0,
    now: datetime | None = None,
    project: str | None = None,
) -> RuleRecord:
    """Store a rule (a run's with run_id, a project's with project, else global); its fields are checked by the
    caller (app/services/alerts.py)."""
    if kind not in ALERT_KINDS:
        raise ValueError(f"alert kind {kind!r}: one of {', '.join(ALERT_KINDS)}")
    if run_id and project:
        raise ValueError("a rule watches one run or one project, not both")
    values = dict(
        id=secrets.token_hex(8),
        scope="run" if run_id else "project" if project else "global",
        run_id=run_id,
        kind=kind,
        key=key,
        op=op,
        threshold=threshold,
        epochs=epochs,
        minutes=minutes,
        cooldown_min=cooldown_min,
        created_by=created_by,
        created_at=now or utcnow(),
        project=project,
    )
    with connection_scope(engine, write=True) as conn:
        if run_id and conn.execute(select(Run.id).where(Run.id == run_id)).first() is None:
            raise RunNotFound(run_id)
        conn.execute(AlertRule.__table__.insert().values(**values))
    return RuleRecord(**values)


def list_rules(engine: Engine, *, run_id: str | None = None, project: str | None = None) -> list[RuleRecord]:
    """Every rule, oldest first; with run_id, the global ones, those of its project and that run's; with project
    (and no run_id), the global ones and the project's."""
    query = select(*_RULE_COLUMNS).order_by(AlertRule.created_at, AlertRule.id)
    if run_id:
        of_project = select(Run.project).where(Run.id == run_id).scalar_subquery()
        query = query.where(
            (AlertRule.scope == "global") | (AlertRule.run_id == run_id) | (AlertRule.project == of_project)
        )
    elif project:
        query = query.where((AlertRule.scope == "global") | (AlertRule.project == project))
    with connection_scope(engine) as conn:
        return [RuleRecord(*row) for row in conn.execute(query)]


def get_rule(engine: Engine, rule_id: str) -> RuleRecord | None:
    with connection_scope(engine) as conn:
        row = conn.execute(select(*_RULE_COLUMNS).where(AlertRule.id == rule_id)).first()
    return RuleRecord(*row) if row else None


def remove_rule(engine: Engine, rule_id: str) -> bool:
    """Delete the rule and its firings; True when there was one."""
    with connection_scope(engine, write=True) as conn:
        return conn.execute(delete(AlertRule.__table__).where(AlertRule.id == rule_id)).rowcount == 1


def fire(engine: Engine, rule: RuleRecord, subject: str, reason: str, now: datetime, run_id: str | None = None) -> bool:
    """Record that `rule`'s condition holds for `subject`; True only for the evaluator whose INSERT won, which then
    sends it. False while the last firing has not cleared, or cleared less than the rule's cooldown ago."""
    table = AlertFiring.__table__
    last = (
        select(table.c.episode, table.c.cleared_at)
        .where(table.c.rule_id == rule.id, table.c.subject == subject)
        .order_by(table.c.episode.desc())
        .limit(1)
    )
    insert = {"sqlite": sqlite.insert, "postgresql": postgresql.insert}[engine.dialect.name]
    with connection_scope(engine, write=True) as conn:
        prev = conn.execute(last).first()
        cooldown = timedelta(minutes=rule.cooldown_min)
        if prev is not None and (prev.cleared_at is None or now < prev.cleared_at + cooldown):
            return False
        stmt = insert(table).values(
            rule_id=rule.id,
            subject=subject,
            episode=(prev.episode + 1) if prev else 1,
            run_id=run_id,
            reason=reason[:2000],
            fired_at=now,
        )
        stmt = stmt.on_conflict_do_nothing(index_elements=["rule_id", "subject", "episode"]).returning(table.c.id)
        return conn.execute(stmt).first() is not None  # RETURNING: psycopg's rowcount here may be -1


def clear(engine: Engine, rule_id: str, subjects: list[str], now: datetime) -> int:
    """The condition no longer holds for these subjects: their open firings are cleared (the cooldown starts)."""
    if not subjects:
        return 0
    table = AlertFiring.__table__
    with connection_scope(engine, write=True) as conn:
        stmt = (
            update(table)
            .where(table.c.rule_id == rule_id, table.c.subject.in_(subjects), table.c.cleared_at.is_(None))
            .values(cleared_at=now)
        )
        return conn.execute(stmt).rowcount


def open_subjects(engine: Engine, rule_id: str) -> set[str]:
    """The subjects whose last firing of this rule has not cleared."""
    table = AlertFiring.__table__
    query = select(table.c.subject).where(table.c.rule_id == rule_id, table.c.cleared_at.is_(None))
    with connection_scope(engine) as conn:
        return {row[0] for row in conn.execute(query)}


def list_firings(
    engine: Engine,
    *,
    run_ids: list[str] | None = None,
    since: datetime | None = None,
    limit: int = MAX_LISTED,
    created_by: str | None = None,
) -> list[FiringRecord]:
    """Firings, newest first: of these runs (None: of everything), of the rules `created_by` made, fired after
    `since`."""
    f = AlertFiring
    query = (
        select(f.id, f.rule_id, AlertRule.kind, f.subject, f.run_id, f.reason, f.fired_at, f.cleared_at)
        .join(AlertRule, AlertRule.id == f.rule_id)
        .order_by(f.fired_at.desc(), f.id.desc())
        .limit(min(limit, MAX_LISTED))
    )
    if run_ids is not None:
        query = query.where(f.run_id.in_(run_ids))
    if created_by is not None:
        query = query.where(AlertRule.created_by == created_by)
    if since is not None:
        query = query.where(f.fired_at > since)
    with connection_scope(engine) as conn:
        return [FiringRecord(*row) for row in conn.execute(query)]


def count_firings(engine: Engine) -> int:
    with connection_scope(engine) as conn:
        return conn.execute(select(func.count()).select_from(AlertFiring)).scalar_one()
