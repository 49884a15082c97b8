"""Alert evaluation, one of the reaper's duties (worker/reaper.py, every reap_every_s on every worker): each rule's
condition is checked against the database, a condition that began is recorded as a firing (db/alerts.fire: only the
worker whose INSERT won sends it) and posted to TORCHDECK_WEBHOOK_URL like a run's end (worker/notify.py: the same
Slack-compatible `text`, escaped and bounded, the same retries, from a background thread). A condition that no longer
holds is cleared, and may fire again once the rule's cooldown has passed.

Every check takes `now`, so a test plants a condition and evaluates at chosen times instead of waiting."""

from __future__ import annotations

import logging
import math
import threading
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import Engine

from core import catalog
from core.names import DATA_WAIT
from core.redact import redact
from db import alert_subjects as subjects
from db.alerts import RuleRecord, clear, fire, list_rules, open_subjects
from db.types import utcnow
from worker.notify import run_url, send_with_retry, slack_line, where
from worker.settings import WorkerSettings

log = logging.getLogger("torchdeck.worker.alerts")


@dataclass(frozen=True)
class Condition:
    """A rule's condition holding for one subject (`run:<id>`, `worker:<id>`, `sweep:<id>`), and why, in words."""

    subject: str
    reason: str
    run_id: str | None = None


@dataclass(frozen=True)
class Fired:
    rule: RuleRecord
    condition: Condition


Check = Callable[[Engine, RuleRecord, datetime], tuple[list[Condition], set[str]]]


def _shown(value: float | None) -> str:
    return "NaN" if value is None else f"{value:.4g}"


def _running(engine: Engine, rule: RuleRecord) -> list[subjects.WatchedRun]:
    return subjects.runs_in(engine, ("running",), run_id=rule.run_id, project=rule.project)


def check_metric(engine: Engine, rule: RuleRecord, now: datetime) -> tuple[list[Condition], set[str]]:
    """The run's latest value of rule.key above (or below) rule.threshold; a NaN is neither."""
    runs = {r.id: r for r in _running(engine, rule)}
    holding = []
    for run_id, value in subjects.latest_values(engine, list(runs), rule.key or "").items():
        if value is None or rule.threshold is None:
            continue
        if (value > rule.threshold) if rule.op == "above" else (value < rule.threshold):
            why = f'{rule.key} is {_shown(value)}, {rule.op} {rule.threshold:g} in run "{runs[run_id].name}"'
            holding.append(Condition(f"run:{run_id}", why, run_id))
    return holding, {f"run:{r}" for r in runs}


def _since_best(points: list[tuple[int, float | None, float]], mode: str) -> tuple[int, float, float] | None:
    """(epochs since the best value, the best's wall time, the best value) of finite per-epoch points."""
    finite = [(e, v, w) for e, v, w in points if v is not None and math.isfinite(v)]
    if not finite:
        return None
    pick = min if mode == "min" else max
    best = pick(finite, key=lambda p: p[1])  # the first of equal bests: a tie is no improvement
    return points[-1][0] - best[0], best[2], best[1]


def check_stalled(engine: Engine, rule: RuleRecord, now: datetime) -> tuple[list[Condition], set[str]]:
    """No improvement of the run's early-stopping monitor (spec.train.early_stopping: monitor, mode) for
    rule.epochs epochs or rule.minutes minutes."""
    runs = _running(engine, rule)
    holding = []
    for r in runs:
        es = (r.spec.get("train") or {}).get("early_stopping") or {}
        monitor = es.get("monitor") or "val/loss"
        mode = es.get("mode") if es.get("mode") in ("min", "max") else catalog.better(monitor)
        found = _since_best(subjects.epoch_points(engine, r.id, monitor), mode)
        if found is None:
            continue
        epochs, wall, best = found
        minutes = (now.timestamp() - wall) / 60
        if (rule.epochs and epochs >= rule.epochs) or (rule.minutes and minutes >= rule.minutes):
            why = (
                f"{monitor} has not improved on {_shown(best)} ({mode}) for {epochs} epoch(s), "
                f'{minutes:.0f} min in run "{r.name}"'
            )
            holding.append(Condition(f"run:{r.id}", why, r.id))
    return holding, {f"run:{r.id}" for r in runs}


def check_diverged(engine: Engine, rule: RuleRecord, now: datetime) -> tuple[list[Condition], set[str]]:
    """Runs that ended `diverged` after the rule was made (an end never clears)."""
    runs = subjects.runs_in(
        engine, ("diverged",), run_id=rule.run_id, finished_after=rule.created_at, project=rule.project
    )
    return [Condition(f"run:{r.id}", f'run "{r.name}" diverged', r.id) for r in runs], set()


def check_data_wait(engine: Engine, rule: RuleRecord, now: datetime) -> tuple[list[Condition], set[str]]:
    """Every `data_wait` fraction (of step time spent waiting for the next batch) logged in the last rule.minutes
    above rule.threshold, in a run running for at least that long."""
    span = timedelta(minutes=rule.minutes or 0)
    runs = {r.id: r for r in _running(engine, rule) if r.started_at is not None and r.started_at <= now - span}
    lows = subjects.window_minimum(engine, list(runs), DATA_WAIT, (now - span).timestamp())
    holding = [
        Condition(
            f"run:{run_id}",
            f'run "{runs[run_id].name}" waited for data over {rule.threshold:.0%} of its step time '
            f"for {rule.minutes:g} min (at least {low:.0%})",
            run_id,
        )
        for run_id, low in lows.items()
        if rule.threshold is not None and low > rule.threshold
    ]
    return holding, {f"run:{r}" for r in runs}


def check_worker_silent(engine: Engine, rule: RuleRecord, now: datetime) -> tuple[list[Condition], set[str]]:
    """Workers whose heartbeat is older than rule.minutes (the Workers page's last seen): a global rule only."""
    if rule.run_id is not None or rule.project is not None:
        return [], set()
    silent = subjects.silent_workers(engine, now - timedelta(minutes=rule.minutes or 0))
    holding = [
        Condition(f"worker:{wid}", f"worker {wid} on {host} silent for {(now - seen).total_seconds() / 60:.0f} min")
        for wid, host, seen in silent
    ]
    # A worker heard again clears, and so does one that left (its row deleted): the id may come back and go silent.
    return holding, {f"worker:{wid}" for wid in subjects.worker_ids(engine)} | open_subjects(engine, rule.id)


def check_queued(engine: Engine, rule: RuleRecord, now: datetime) -> tuple[list[Condition], set[str]]:
    """Runs queued for longer than rule.minutes."""
    runs = subjects.runs_in(engine, ("queued",), run_id=rule.run_id, project=rule.project)
    before = now - timedelta(minutes=rule.minutes or 0)
    holding = [
        Condition(f"run:{r.id}", f'run "{r.name}" queued for {(now - r.created_at).total_seconds() / 60:.0f} min', r.id)
        for r in runs
        if r.created_at <= before
    ]
    return holding, {f"run:{r.id}" for r in runs}


def check_sweep_finished(engine: Engine, rule: RuleRecord, now: datetime) -> tuple[list[Condition], set[str]]:
    """Sweeps (of the rule's project, for a project's rule) that finished after the rule was made."""
    if rule.run_id is not None:
        return [], set()
    done = subjects.sweeps_finished_after(engine, rule.created_at, rule.project)
    return [Condition(f"sweep:{sid}", f'sweep "{name}" {status}') for sid, name, status, _ in done], set()


CHECKS: dict[str, Check] = {
    "metric": check_metric,
    "stalled": check_stalled,
    "diverged": check_diverged,
    "data_wait": check_data_wait,
    "worker_silent": check_worker_silent,
    "queued": check_queued,
    "sweep_finished": check_sweep_finished,
}


def evaluate(engine: Engine, now: datetime | None = None) -> list[Fired]:
    """One round: every rule checked at `now`; the conditions this evaluator fired first (the ones to send)."""
    now = now or utcnow()
    fired = []
    for rule in list_rules(engine):
        try:
            holding, checked = CHECKS[rule.kind](engine, rule, now)
            fired += [Fired(rule, c) for c in holding if fire(engine, rule, c.subject, c.reason, now, c.run_id)]
            ended = (open_subjects(engine, rule.id) & checked) - {c.subject for c in holding}
            clear(engine, rule.id, sorted(ended), now)
        except Exception as e:  # noqa: BLE001 - one broken rule never stops the others, nor the reaper
            log.warning("alert rule %s (%s) not evaluated: %s", rule.id, rule.kind, redact(e))
    return fired


def build_payload(f: Fired, public_url: str | None = None) -> dict[str, Any]:
    """What is POSTed for a firing: {"text": <one escaped line>, "alert": {...}}, as a run's end is."""
    url = run_url(public_url, f.condition.run_id) if f.condition.run_id else None
    words = [f"torchdeck alert ({f.rule.kind.replace('_', ' ')})", redact(f.condition.reason)]
    return {
        "text": slack_line([*words, url] if url else words),
        "alert": {
            "rule_id": f.rule.id,
            "kind": f.rule.kind,
            "scope": f.rule.scope,
            "subject": f.condition.subject,
            "run_id": f.condition.run_id,
            "reason": redact(f.condition.reason),
            "url": url,
        },
    }


def check_alerts(engine: Engine, s: WorkerSettings, now: datetime | None = None) -> threading.Thread | None:
    """Evaluate the rules and post what fired from a background daemon thread (returned; None when nothing is
    sent). Never raises: alerts never hold up the reaper."""
    try:
        fired = evaluate(engine, now)
        if not fired or not s.webhook_url:
            return None
        payloads = [build_payload(f, s.public_url) for f in fired]
        t = threading.Thread(target=_send_all, args=(s.webhook_url, payloads), name="alerts", daemon=True)
        t.start()
        return t
    except Exception as e:  # noqa: BLE001 - the database may be away: the reaper goes on
        log.warning("alerts not evaluated (webhook %s): %s", where(s.webhook_url), redact(e))
        return None


def _send_all(url: str, payloads: list[dict[str, Any]]) -> None:
    for payload in payloads:
        send_with_retry(url, payload)
