"""Alerts as the reaper evaluates them, on a real SQLite file and a real Postgres server: each kind fires once for a
planted condition and not again the next round, racing evaluators fire once, a cleared condition waits out its
cooldown, and the webhook gets an escaped Slack-compatible line. Every round is evaluated at an explicit `now`."""

from __future__ import annotations

import logging
import threading
import uuid
from collections.abc import Callable, Iterator
from datetime import datetime, timedelta

import pytest
from sqlalchemy import Engine

from db import alerts as store
from db import repo
from db.engine import make_engine
from db.migrate import upgrade
from db.types import MetricPoint, utcnow
from tests.app.seeding import seed_run
from tests.worker.test_notify import Hook
from worker.alerts import check_alerts, evaluate
from worker.settings import WorkerSettings

MIN = timedelta(minutes=1)


@pytest.fixture(autouse=True)
def _rules_evaluated(caplog: pytest.LogCaptureFixture) -> Iterator[None]:
    """A rule that raised is only logged (one broken rule never stops the others): "nothing fired" must not pass on
    a crash, so every test here fails on such a warning."""
    caplog.set_level(logging.WARNING, logger="torchdeck.worker.alerts")
    yield
    broken = [
        r.getMessage() for r in caplog.records if r.name == "torchdeck.worker.alerts" and r.levelno >= logging.WARNING
    ]
    assert not broken, broken


@pytest.fixture(params=("sqlite", "postgres"))
def engine(request: pytest.FixtureRequest, tmp_path) -> Iterator[Engine]:
    if request.param == "sqlite":
        url, drop = f"sqlite:///{tmp_path / 'alerts.db'}", None
    else:
        server, name = request.getfixturevalue("postgres"), f"test_{uuid.uuid4().hex[:12]}"
        url, drop = server.create_database(name), lambda: server.drop_database(name)
    upgrade(url)
    e = make_engine(url)
    yield e
    e.dispose()
    if drop:
        drop()


def _points(engine: Engine, run_id: str, key: str, values: list[float], wall0: float, every_s: float = 60) -> None:
    pts = [MetricPoint(key, 100 + i, v, i + 1, wall0 + i * every_s) for i, v in enumerate(values)]
    repo.append_metrics(engine, run_id, pts)


# Each planter seeds one subject whose condition holds (and one whose does not) and returns the rule, the subject
# that must fire, and when to evaluate.
Planted = tuple[store.RuleRecord, str, datetime]


def plant_metric(engine: Engine) -> Planted:
    hot, cool = seed_run(engine, "hot", status="running"), seed_run(engine, "cool", status="running")
    t0 = utcnow()
    _points(engine, hot.id, "train/loss", [0.5, 3.5], t0.timestamp())
    _points(engine, cool.id, "train/loss", [3.5, 0.5], t0.timestamp())
    rule = store.add_rule(engine, "metric", created_by="a", key="train/loss", op="above", threshold=3.0)
    return rule, f"run:{hot.id}", t0 + MIN


def plant_stalled(engine: Engine) -> Planted:
    stuck, better = seed_run(engine, "stuck", status="running"), seed_run(engine, "better", status="running")
    t0 = utcnow()
    _points(engine, stuck.id, "val/loss", [0.9, 0.5, 0.6, 0.7, 0.5], t0.timestamp())  # a tie is no improvement
    _points(engine, better.id, "val/loss", [0.9, 0.8, 0.7, 0.6, 0.5], t0.timestamp())
    rule = store.add_rule(engine, "stalled", created_by="a", epochs=3)
    return rule, f"run:{stuck.id}", t0 + 5 * MIN


def plant_diverged(engine: Engine) -> Planted:
    rule = store.add_rule(engine, "diverged", created_by="a")
    bad = seed_run(engine, "bad", status="running")
    repo.finish_run(engine, bad.id, "diverged", error="loss is NaN")
    seed_run(engine, "fine", status="completed")
    return rule, f"run:{bad.id}", utcnow()


def plant_data_wait(engine: Engine) -> Planted:
    starved, fed = seed_run(engine, "starved", status="running"), seed_run(engine, "fed", status="running")
    t0 = utcnow()
    _points(engine, starved.id, "data_wait", [0.2, 0.7, 0.8, 0.9, 0.75, 0.8], t0.timestamp(), every_s=60)
    _points(engine, fed.id, "data_wait", [0.9, 0.9, 0.1, 0.9, 0.9, 0.9], t0.timestamp(), every_s=60)
    rule = store.add_rule(engine, "data_wait", created_by="a", threshold=0.5, minutes=4)
    return rule, f"run:{starved.id}", t0 + 5 * MIN


def plant_worker_silent(engine: Engine) -> Planted:
    repo.upsert_worker(engine, "gpu0@old", hostname="old")
    t0 = utcnow()
    rule = store.add_rule(engine, "worker_silent", created_by="a", minutes=5)
    return rule, "worker:gpu0@old", t0 + 6 * MIN


def plant_queued(engine: Engine) -> Planted:
    waiting = seed_run(engine, "waiting", status="queued")
    rule = store.add_rule(engine, "queued", created_by="a", minutes=30)
    return rule, f"run:{waiting.id}", waiting.created_at + 31 * MIN


def plant_sweep_finished(engine: Engine) -> Planted:
    rule = store.add_rule(engine, "sweep_finished", created_by="a")
    sweep = repo.create_sweep(engine, {"trials": 2}, name="lr search", owner="a")
    repo.finish_sweep(engine, sweep.id, "completed")
    return rule, f"sweep:{sweep.id}", utcnow()


PLANTERS: dict[str, Callable[[Engine], Planted]] = {
    "metric": plant_metric,
    "stalled": plant_stalled,
    "diverged": plant_diverged,
    "data_wait": plant_data_wait,
    "worker_silent": plant_worker_silent,
    "queued": plant_queued,
    "sweep_finished": plant_sweep_finished,
}


@pytest.mark.parametrize("kind", PLANTERS)
def test_each_kind_fires_once_for_its_condition_and_not_on_the_next_round(engine: Engine, kind: str) -> None:
    rule, subject, at = PLANTERS[kind](engine)
    (fired,) = evaluate(engine, at)
    assert (fired.rule.id, fired.condition.subject) == (rule.id, subject)
    assert evaluate(engine, at + MIN) == []  # the condition still holds: no second alert
    assert [f.subject for f in store.list_firings(engine)] == [subject]


def test_two_evaluators_racing_fire_once(engine: Engine) -> None:
    rule, subject, at = plant_metric(engine)
    start, results = threading.Barrier(4), []

    def evaluator() -> None:
        start.wait()
        results.extend(evaluate(engine, at))

    threads = [threading.Thread(target=evaluator) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert [f.condition.subject for f in results] == [subject]
    assert store.count_firings(engine) == 1


def test_a_cleared_condition_fires_again_only_after_the_cooldown(engine: Engine) -> None:
    run = seed_run(engine, "flapping", status="running")
    t0 = utcnow()
    rule = store.add_rule(engine, "metric", created_by="a", key="grad_norm", op="above", threshold=10, cooldown_min=30)

    def log(step: int, value: float) -> None:
        repo.append_metrics(engine, run.id, [MetricPoint("grad_norm", step, value, 1, t0.timestamp() + step)])

    log(1, 50.0)
    assert len(evaluate(engine, t0 + MIN)) == 1
    log(2, 1.0)  # cleared at t0 + 2 min: the cooldown runs to t0 + 32 min
    assert evaluate(engine, t0 + 2 * MIN) == []
    log(3, 60.0)
    assert evaluate(engine, t0 + 3 * MIN) == []
    assert evaluate(engine, t0 + 31 * MIN) == []
    (again,) = evaluate(engine, t0 + 32 * MIN)
    assert again.rule.id == rule.id and "60" in again.condition.reason
    firings = store.list_firings(engine, run_ids=[run.id])
    assert len(firings) == 2 and firings[1].cleared_at == t0 + 2 * MIN and firings[0].cleared_at is None


def test_a_global_rule_ignores_runs_that_diverged_before_it_existed(engine: Engine) -> None:
    old = seed_run(engine, "old", status="running")
    repo.finish_run(engine, old.id, "diverged")
    store.add_rule(engine, "diverged", created_by="a", now=utcnow() + MIN)
    assert evaluate(engine, utcnow() + 2 * MIN) == []


def test_a_run_rule_watches_its_run_only(engine: Engine) -> None:
    mine, other = seed_run(engine, "mine", status="queued"), seed_run(engine, "other", status="queued")
    store.add_rule(engine, "queued", created_by="a", run_id=mine.id, minutes=1)
    (fired,) = evaluate(engine, other.created_at + 2 * MIN)
    assert fired.condition.run_id == mine.id


def test_a_project_rule_watches_its_projects_runs_and_sweeps_only(engine: Engine) -> None:
    from db import projects

    projects.create_project(engine, "vision", by="maya")
    ours = repo.create_run(engine, {"data": {"name": "digits"}, "model": {"name": "mlp"}}, owner="a", project="vision")
    theirs = seed_run(engine, "theirs", status="queued")
    rule = store.add_rule(engine, "queued", created_by="maya", project="vision", minutes=1)
    assert rule.scope == "project" and store.list_rules(engine, run_id=ours.id) == [rule]
    assert store.list_rules(engine, run_id=theirs.id) == [] and store.list_rules(engine, project="vision") == [rule]
    (fired,) = evaluate(engine, theirs.created_at + 2 * MIN)
    assert fired.condition.run_id == ours.id and fired.rule.project == "vision"
    done = store.add_rule(engine, "sweep_finished", created_by="maya", project="vision")
    for name, project in (("ours", "vision"), ("theirs", "default")):
        sweep = repo.create_sweep(engine, {}, name=name, owner="a", project=project)
        repo.finish_sweep(engine, sweep.id, "completed")
    (fired,) = [f for f in evaluate(engine, utcnow() + MIN) if f.rule.id == done.id]
    assert fired.condition.reason == 'sweep "ours" completed'
    with pytest.raises(ValueError, match="one run or one project"):
        store.add_rule(engine, "queued", created_by="a", run_id=ours.id, project="vision", minutes=1)


@pytest.mark.parametrize("engine", ["sqlite"], indirect=True)  # the database plays no part in the sending
def test_the_webhook_gets_an_escaped_slack_line_and_the_alert(engine: Engine) -> None:
    hook = Hook()
    try:
        run = seed_run(engine, "<!channel> & <https://evil|click>", status="running")
        t0 = utcnow()
        _points(engine, run.id, "val/acc", [0.2], t0.timestamp())
        store.add_rule(engine, "metric", created_by="a", key="val/acc", op="below", threshold=0.5)
        s = WorkerSettings(webhook_url=hook.url, public_url="https://deck.example.com")
        sending = check_alerts(engine, s, t0 + MIN)
        assert sending is not None
        sending.join(60)
        (sent,) = hook.payloads()
    finally:
        hook.close()
    text = sent["text"]
    assert "<!channel>" not in text and "&lt;!channel&gt; &amp; &lt;https://evil|click&gt;" in text
    assert text.startswith("torchdeck alert (metric)") and "val/acc is 0.2, below 0.5" in text
    assert f"https://deck.example.com/run?id={run.id}" in text
    assert sent["alert"]["run_id"] == run.id and sent["alert"]["kind"] == "metric"
    assert check_alerts(engine, s, t0 + 2 * MIN) is None  # nothing new: nothing sent


def test_the_reapers_round_evaluates_the_rules(engine: Engine) -> None:
    from worker.reaper import reap

    store.add_rule(engine, "diverged", created_by="a", now=utcnow() - MIN)
    bad = seed_run(engine, "bad", status="running")
    repo.finish_run(engine, bad.id, "diverged")
    reap(engine, WorkerSettings(webhook_url=None))
    reap(engine, WorkerSettings(webhook_url=None))
    (firing,) = store.list_firings(engine)
    assert firing.run_id == bad.id and firing.kind == "diverged" and firing.reason == 'run "bad" diverged'


def test_a_silent_worker_heard_again_clears_and_fires_again_after_the_cooldown(engine: Engine) -> None:
    repo.upsert_worker(engine, "gpu1@box", hostname="box")
    t0 = utcnow()
    store.add_rule(engine, "worker_silent", created_by="a", minutes=5, cooldown_min=10)
    assert len(evaluate(engine, t0 + 6 * MIN)) == 1
    assert evaluate(engine, t0 + 2 * MIN) == []  # heard within 5 minutes of this round: cleared at t0 + 2 min
    assert evaluate(engine, t0 + 7 * MIN) == []  # silent again, within the cooldown
    (again,) = evaluate(engine, t0 + 12 * MIN)
    assert again.condition.subject == "worker:gpu1@box" and "on box silent for 12 min" in again.condition.reason


def test_a_rule_watches_a_scripts_run_as_any_other(engine: Engine) -> None:
    """A run logged by a person's own script (the MLflow endpoint) is watched by a metric rule, and its silence by
    none of the queue's rules: it waits for no worker."""
    from db import external

    script = external.create_run(engine, owner="a", name="train.py")
    t0 = utcnow()
    points = [MetricPoint("loss", i, v, None, t0.timestamp() + i) for i, v in enumerate([0.5, 3.5])]
    external.log(engine, script.id, points=points)
    rule = store.add_rule(engine, "metric", created_by="a", key="loss", op="above", threshold=3.0)
    store.add_rule(engine, "queued", created_by="a", minutes=1)
    fired = evaluate(engine, t0 + 60 * MIN)
    assert [(f.rule.id, f.condition.subject) for f in fired] == [(rule.id, f"run:{script.id}")]
