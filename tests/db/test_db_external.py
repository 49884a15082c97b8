"""Runs of people's own scripts in the database (db/external.py, migration 0015), on SQLite and Postgres: what a
script logs is stored once (a retried batch changes nothing), params are written once, a run whose script fell
silent is lost and running again when the script writes again, and such a run is never taken for one of the queue's
(not re-queued, not counted as waiting or as GPU time, not claimed)."""

from __future__ import annotations

import math
from datetime import timedelta

import pytest
from sqlalchemy import Engine, update

from db import external, repo
from db.migrate import downgrade, upgrade
from db.models import Run
from db.queue_order import recent_usage, waiting
from db.types import MetricPoint, utcnow


def points(key: str, n: int, start: int = 0) -> list[MetricPoint]:
    return [MetricPoint(key, step, 1.0 / (step + 1)) for step in range(start, start + n)]


def silent_for(engine: Engine, run_id: str, seconds: float) -> None:
    with engine.begin() as c:
        c.execute(update(Run).where(Run.id == run_id).values(heartbeat_at=utcnow() - timedelta(seconds=seconds)))


def test_a_scripts_run_keeps_what_it_logged_once_however_often_it_is_sent(engine: Engine) -> None:
    run = external.create_run(engine, owner="ada", name="train.py", tags={"mlflow.source.name": "train.py"})
    assert (run.status, run.source, run.external, run.spec["tags"]) == (
        "running",
        "mlflow",
        True,
        {"mlflow.source.name": "train.py"},
    )
    batch = points("loss", 1000)
    assert external.log(engine, run.id, points=batch, params={"lr": "0.01"}, tags={"team": "vision"}) == 1000
    # the client retries a batch whose answer it lost: nothing is added, nothing changes
    assert external.log(engine, run.id, points=batch, params={"lr": "0.01"}, tags={"team": "vision"}) == 0
    again = [MetricPoint("loss", p.step, 99.0) for p in batch[:10]]
    assert external.log(engine, run.id, points=again) == 0
    stored = external.history(engine, run.id, "loss")
    assert [p.step for p in stored] == list(range(1000))
    assert [p.value for p in stored] == [p.value for p in batch]
    got = repo.get_run(engine, run.id)
    assert got.spec["params"] == {"lr": "0.01"} and got.spec["tags"]["team"] == "vision"
    assert got.metrics["loss"].count == 1000


def test_a_param_is_written_once_and_a_tag_may_change_or_go(engine: Engine) -> None:
    run = external.create_run(engine, owner="ada")
    external.log(engine, run.id, params={"lr": "0.1"}, tags={"stage": "warmup"})
    with pytest.raises(external.ParamChanged, match="already '0.1'"):
        external.log(engine, run.id, params={"lr": "0.2"}, points=points("loss", 5))
    assert external.history(engine, run.id, "loss") == []  # the refused request wrote nothing
    external.log(engine, run.id, tags={"stage": "main"})
    external.log(engine, run.id, deleted_tags=["stage"], name="renamed")
    got = repo.get_run(engine, run.id)
    assert got.spec == {"params": {"lr": "0.1"}, "tags": {}} and got.name == "renamed"


def test_nan_and_infinite_values_come_back_as_they_were_logged(engine: Engine) -> None:
    run = external.create_run(engine, owner="ada")
    external.log(
        engine,
        run.id,
        points=[MetricPoint("x", 0, math.nan), MetricPoint("x", 1, math.inf), MetricPoint("x", 2, -math.inf)],
    )
    values = [p.value for p in external.history(engine, run.id, "x")]
    assert math.isnan(values[0]) and values[1:] == [math.inf, -math.inf]


def test_a_silent_script_loses_its_run_and_gets_it_back_by_writing(engine: Engine) -> None:
    quiet = external.create_run(engine, owner="ada")
    talking = external.create_run(engine, owner="ada")
    ended = external.create_run(engine, owner="ada")
    external.end(engine, ended.id, "FINISHED")
    for run in (quiet, ended):
        silent_for(engine, run.id, 120)
    assert external.mark_silent(engine, 60) == [quiet.id]
    assert repo.get_run(engine, quiet.id).status == "lost"
    assert repo.get_run(engine, talking.id).status == "running"
    assert repo.get_run(engine, ended.id).status == "completed"
    external.log(engine, quiet.id, points=points("loss", 1))
    assert repo.get_run(engine, quiet.id).status == "running"


def test_a_script_ends_its_run_and_may_start_it_again(engine: Engine) -> None:
    run = external.create_run(engine, owner="ada")
    assert external.end(engine, run.id, "FAILED").status == "failed"
    again = external.end(engine, run.id, "RUNNING")
    assert (again.status, again.finished_at) == ("running", None)
    assert external.end(engine, run.id, "KILLED").status == "cancelled"
    with pytest.raises(ValueError, match="RUNNING, FINISHED, FAILED or KILLED"):
        external.end(engine, run.id, "PAUSED")


def test_nothing_logs_into_a_torchdeck_run_through_the_scripts_path(engine: Engine) -> None:
    ours = repo.create_run(engine, {"data": {"name": "digits"}}, owner="ada")
    with pytest.raises(external.NotExternal):
        external.log(engine, ours.id, points=points("loss", 1))
    with pytest.raises(external.NotExternal):
        external.end(engine, ours.id, "FINISHED")
    with pytest.raises(external.RunNotFound):
        external.log(engine, "nope", points=points("loss", 1))


def test_a_scripts_run_is_never_taken_for_one_of_the_queues(engine: Engine) -> None:
    lost = external.create_run(engine, owner="ada")
    silent_for(engine, lost.id, 3600)
    external.mark_silent(engine, 60)
    running = external.create_run(engine, owner="ada")
    silent_for(engine, running.id, 3600)
    # the workers' reaper: a stale heartbeat of a script's run is not a dead worker's run to re-queue
    assert repo.mark_lost(engine, 60) == []
    assert repo.get_run(engine, running.id).status == "running"
    assert repo.unclaimed_runs(engine, 0) == []
    listed = waiting(engine, limit=10)
    assert (listed.runs, listed.total) == ([], 0)
    assert recent_usage(engine, ["ada"], now=utcnow(), half_life_s=3600) == {"ada": 0.0}
    assert repo.list_runs(engine, status=["queued", "lost"], source="torchdeck").total == 0
    assert repo.list_runs(engine, source="mlflow").total == 2


def test_0015_adds_the_source_and_goes_down_and_up_again(database_url: str) -> None:
    from db.engine import make_engine

    upgrade(database_url)
    engine = make_engine(database_url)
    try:
        ours = repo.create_run(engine, {"data": {"name": "digits"}}, owner="ada")
        downgrade(database_url, "0014")
        upgrade(database_url)
        assert repo.get_run(engine, ours.id).source == "torchdeck"
    finally:
        engine.dispose()


def test_a_persons_scripts_run_at_most_so_many_runs_at_once(engine: Engine) -> None:
    first = external.create_run(engine, owner="ada", max_running=2)
    external.create_run(engine, owner="ada", max_running=2)
    external.create_run(engine, owner="bob", max_running=2)  # another person's count is their own
    with pytest.raises(external.TooManyRunning, match="the most one person may \\(2\\)"):
        external.create_run(engine, owner="ada", max_running=2)
    external.end(engine, first.id, "FINISHED")
    external.create_run(engine, owner="ada", max_running=2)  # an ended one frees its place
