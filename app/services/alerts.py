"""Alert rules and their firings for the Workers page, the Run page, the sidebar and `torchdeck alerts`: plain
functions that check a rule's fields and who may manage it before anything is stored. The workers evaluate the rules
(worker/alerts.py).

Who may: a global rule (every run, every worker, every sweep) is an admin's (in local mode the person at the machine
is one); a rule on one run is its owner's or an admin's, as cancelling it is (app/auth.check_can_modify)."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime

from sqlalchemy import Engine

from app.auth import PermissionDenied, User, check_can_modify
from app.services.broker import get_engine
from db import alerts as store
from db.alerts import ALERT_KINDS, OPS, FiringRecord, RuleRecord
from db.follows import followed
from db.repo import get_run

# What each kind needs, in words for the form, the CLI's help and the errors.
NEEDS = {
    "metric": "a metric key, above or below, and a value: checked on the run's latest value",
    "stalled": "epochs or minutes without improvement of the run's early-stopping monitor",
    "diverged": "nothing: fires when a run ends diverged",
    "data_wait": "a fraction (0-1) of step time waiting for data, and minutes it lasts",
    "worker_silent": "minutes without a heartbeat from a worker (global only)",
    "queued": "minutes a run waits in the queue",
    "sweep_finished": "nothing: fires when a sweep ends (global only)",
}
GLOBAL_ONLY = ("worker_silent", "sweep_finished")
MAX_MINUTES = 60 * 24 * 30  # a month: a longer wait is a typo


@dataclass(frozen=True)
class RuleInput:
    """A rule as a form or the CLI gives it; run_id None for a global rule."""

    kind: str
    run_id: str | None = None
    key: str | None = None
    op: str | None = None
    threshold: float | None = None
    epochs: int | None = None
    minutes: float | None = None
    cooldown_min: float = 60.0


def _positive(value: float | None, what: str, upper: float = MAX_MINUTES) -> None:
    if value is not None and not (math.isfinite(value) and 0 < value <= upper):
        raise ValueError(f"{what}: more than 0 and at most {upper:g}")


def check_rule(r: RuleInput) -> None:
    """ValueError naming what is missing or wrong for the rule's kind."""
    if r.kind not in ALERT_KINDS:
        raise ValueError(f"alert kind {r.kind!r}: one of {', '.join(ALERT_KINDS)}")
    if r.kind in GLOBAL_ONLY and r.run_id:
        raise ValueError(f"a {r.kind} rule is global: it watches no single run")
    _positive(r.minutes, "minutes")
    _positive(r.epochs, "epochs", 10_000)
    if not (math.isfinite(r.cooldown_min) and 0 <= r.cooldown_min <= MAX_MINUTES):
        raise ValueError(f"cooldown: 0 to {MAX_MINUTES} minutes")
    missing = {
        "metric": not r.key or r.op not in OPS or r.threshold is None or not math.isfinite(r.threshold),
        "stalled": not (r.epochs or r.minutes),
        "data_wait": r.threshold is None or not 0 <= r.threshold < 1 or not r.minutes,
        "worker_silent": not r.minutes,
        "queued": not r.minutes,
    }.get(r.kind, False)
    if missing:
        raise ValueError(f"a {r.kind} rule needs {NEEDS[r.kind]}")


def _check_may_manage(user: User | None, run_id: str | None, engine: Engine, action: str) -> None:
    if run_id is None:
        if user is None or not user.is_admin:
            who = user.describe() if user else "an anonymous user"
            raise PermissionDenied(f"{who} may not {action} global alert rules: only an admin may")
        return
    check_can_modify(user, get_run(engine, run_id), f"{action} alert rules of")


def add_rule(user: User | None, rule: RuleInput, engine: Engine | None = None) -> RuleRecord:
    """Store a checked rule for `user`; PermissionDenied, ValueError or RunNotFound otherwise."""
    engine = engine or get_engine()
    check_rule(rule)
    _check_may_manage(user, rule.run_id, engine, "add")
    assert user is not None  # _check_may_manage refused anonymous users
    fields = {k: v for k, v in rule.__dict__.items() if k != "kind"}
    return store.add_rule(engine, rule.kind, created_by=user.id, **fields)


def remove_rule(user: User | None, rule_id: str, engine: Engine | None = None) -> bool:
    """Delete a rule (and its firings) when `user` may; False when there is no such rule."""
    engine = engine or get_engine()
    rule = store.get_rule(engine, rule_id)
    if rule is None:
        return False
    _check_may_manage(user, rule.run_id, engine, "remove")
    return store.remove_rule(engine, rule_id)


def list_rules(run_id: str | None = None, engine: Engine | None = None) -> list[RuleRecord]:
    return store.list_rules(engine or get_engine(), run_id=run_id)


def run_firings(run_id: str, engine: Engine | None = None) -> list[FiringRecord]:
    """The run's firings, newest first (the Run page's Alerts)."""
    return store.list_firings(engine or get_engine(), run_ids=[run_id])


def notices(user: User | None, since: datetime, engine: Engine | None = None) -> list[FiringRecord]:
    """Firings since `since` for the sidebar: every one for an admin, those of the runs `user` follows otherwise."""
    engine = engine or get_engine()
    if user is None:
        return []
    if user.is_admin:
        return store.list_firings(engine, since=since, limit=20)
    runs: Sequence[str] = [f.run_id for f in followed(engine, user.id)]
    return store.list_firings(engine, run_ids=list(runs), since=since, limit=20) if runs else []


def describe(rule: RuleRecord) -> str:
    """A rule in words, for tables and the CLI."""
    words = {
        "metric": f"{rule.key} {rule.op} {rule.threshold:g}" if rule.threshold is not None else "",
        "stalled": " or ".join(
            w for w in (rule.epochs and f"{rule.epochs} epochs", rule.minutes and f"{rule.minutes:g} min") if w
        )
        + " without improvement",
        "diverged": "the run diverged",
        "data_wait": f"data wait above {rule.threshold or 0:.0%} for {rule.minutes or 0:g} min",
        "worker_silent": f"a worker silent for {rule.minutes or 0:g} min",
        "queued": f"queued for {rule.minutes or 0:g} min",
        "sweep_finished": "a sweep finished",
    }[rule.kind]
    where = f"run {rule.run_id}" if rule.run_id else "global"
    return f"{where}: {words} (cooldown {rule.cooldown_min:g} min)"
