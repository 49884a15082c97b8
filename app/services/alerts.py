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

from app.auth import PermissionDenied, User, check_can_modify, has_role, team_mode
from app.services.broker import get_engine
from db import alerts as store
from db.alerts import ALERT_KINDS, OPS, FiringRecord, RuleRecord
from db.follows import followed
from db.projects import project_of

# What each kind needs, in words for the form, the CLI's help and the errors.
NEEDS = {
    "metric": "a metric key, above or below, and a value: checked on the run's latest value",
    "stalled": "epochs or minutes without improvement of the run's early-stopping monitor",
    "diverged": "nothing: fires when a run ends diverged",
    "data_wait": "a fraction (0-1) of step time waiting for data, and minutes it lasts",
    "worker_silent": "minutes without a heartbeat from a worker (global only)",
    "queued": "minutes a run waits in the queue",
    "sweep_finished": "nothing: fires when a sweep ends (global or a project's)",
}
GLOBAL_ONLY = ("worker_silent",)  # workers serve every project
NO_SINGLE_RUN = ("worker_silent", "sweep_finished")
MAX_MINUTES = 60 * 24 * 30  # a month: a longer wait is a typo


@dataclass(frozen=True)
class RuleInput:
    """A rule as a form or the CLI gives it: of one run (run_id), of a project's runs and sweeps (project), or global
    (neither)."""

    kind: str
    run_id: str | None = None
    key: str | None = None
    op: str | None = None
    threshold: float | None = None
    epochs: int | None = None
    minutes: float | None = None
    cooldown_min: float = 60.0
    project: str | None = None


def _positive(value: float | None, what: str, upper: float = MAX_MINUTES) -> None:
    if value is not None and not (math.isfinite(value) and 0 < value <= upper):
        raise ValueError(f"{what}: more than 0 and at most {upper:g}")


def check_rule(r: RuleInput) -> None:
    """ValueError naming what is missing or wrong for the rule's kind."""
    if r.kind not in ALERT_KINDS:
        raise ValueError(f"alert kind {r.kind!r}: one of {', '.join(ALERT_KINDS)}")
    if r.run_id and r.project:
        raise ValueError("a rule watches one run or one project, not both")
    if r.kind in NO_SINGLE_RUN and r.run_id:
        where = "global" if r.kind in GLOBAL_ONLY else "global or a project's"
        raise ValueError(f"a {r.kind} rule is {where}: it watches no single run")
    if r.kind in GLOBAL_ONLY and r.project:
        raise ValueError(f"a {r.kind} rule is global: workers serve every project")
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


def _check_may_manage(
    user: User | None, run_id: str | None, engine: Engine, action: str, project: str | None = None
) -> None:
    """A global rule: an admin's. A project's: its maintainers' or an admin's (ProjectHidden, a "not found", for
    someone who may not see the project). A run's: as cancelling it (its owner, a maintainer, an admin)."""
    from app.services.projects import check_read, with_roles
    from app.services.runs import readable_run
    from db.projects import get_project

    who = user.describe() if user else "an anonymous user"
    if project is not None:
        get_project(engine, project)
        user = with_roles(user, engine)
        check_read(user, project, f"project {project!r}")
        if not has_role(user, project, "maintainer"):
            raise PermissionDenied(
                f"{who} may not {action} alert rules of project {project}: only its maintainers or an admin may"
            )
        return
    if run_id is None:
        if user is None or not user.is_admin:
            raise PermissionDenied(f"{who} may not {action} global alert rules: only an admin may")
        return

    run = readable_run(run_id, by=user, engine=engine)
    check_can_modify(with_roles(user, engine), run, f"{action} alert rules of")


def add_rule(user: User | None, rule: RuleInput, engine: Engine | None = None) -> RuleRecord:
    """Store a checked rule for `user`; PermissionDenied, ValueError or RunNotFound otherwise."""
    engine = engine or get_engine()
    check_rule(rule)
    _check_may_manage(user, rule.run_id, engine, "add", rule.project)
    assert user is not None  # _check_may_manage refused anonymous users
    fields = {k: v for k, v in rule.__dict__.items() if k != "kind"}
    return store.add_rule(engine, rule.kind, created_by=user.id, **fields)


def remove_rule(user: User | None, rule_id: str, engine: Engine | None = None) -> bool:
    """Delete a rule (and its firings) when `user` may; False when there is no such rule."""
    engine = engine or get_engine()
    rule = store.get_rule(engine, rule_id)
    if rule is None:
        return False
    _check_may_manage(user, rule.run_id, engine, "remove", rule.project)
    return store.remove_rule(engine, rule_id)


def list_rules(run_id: str | None = None, engine: Engine | None = None, project: str | None = None) -> list[RuleRecord]:
    """Every rule; of a run: the global ones, its project's and its own; of a project: the global ones and its."""
    return store.list_rules(engine or get_engine(), run_id=run_id, project=project)


def run_firings(run_id: str, engine: Engine | None = None) -> list[FiringRecord]:
    """The run's firings, newest first (the Run page's Alerts)."""
    return store.list_firings(engine or get_engine(), run_ids=[run_id])


def notices(user: User | None, since: datetime, engine: Engine | None = None) -> list[FiringRecord]:
    """Firings since `since` for the sidebar: every one for an admin; otherwise those of the runs `user` follows and
    those of the rules they made (a project's maintainer hears of their project's rules), of the projects they may
    still see (team mode)."""
    engine = engine or get_engine()
    if user is None:
        return []
    if user.is_admin:
        return store.list_firings(engine, since=since, limit=20)
    runs: Sequence[str] = [f.run_id for f in followed(engine, user.id)]
    mine = store.list_firings(engine, created_by=user.id, since=since, limit=20)  # of the rules they made
    if team_mode():
        from app.services.projects import readable

        seen = {p.name for p in readable(user, engine)}
        runs = [r for r in runs if project_of(engine, "run", r) in seen]
        mine = [f for f in mine if f.run_id is None or project_of(engine, "run", f.run_id) in seen]
    followed_firings = store.list_firings(engine, run_ids=list(runs), since=since, limit=20) if runs else []
    both = {f.id: f for f in [*followed_firings, *mine]}
    return sorted(both.values(), key=lambda f: (f.fired_at, f.id), reverse=True)[:20]


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
    where = f"run {rule.run_id}" if rule.run_id else f"project {rule.project}" if rule.project else "global"
    return f"{where}: {words} (cooldown {rule.cooldown_min:g} min)"
