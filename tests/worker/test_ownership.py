"""One process per run, always, with real Celery workers on a real Redis, SQLite and Postgres: worker ids
are unique per process, a hung run process loses its run to another worker (and is killed), a deleted
run's process stops, and a queued run whose broker message was lost is sent again by the reaper."""

from __future__ import annotations

import os
import signal

import psutil
import pytest
import redis
from sqlalchemy import func, select

from app.auth import local_user
from app.services.runs import remove
from db.models import Metric
from db.repo import RunNotFound, RunStillActive, delete_run, get_run, list_events, list_workers
from tests.worker.conftest import wait_for


def _gone(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


def _metric_rows(stack, run_id: str) -> int:
    with stack.engine.connect() as c:
        return c.execute(select(func.count()).select_from(Metric).where(Metric.run_id == run_id)).scalar()


def _owned_by(worker) -> str:
    return f"/{worker.pid}-"  # worker ids are `<node>@<host>/<pid>-<token>`


def test_a_hung_run_process_loses_its_run_to_a_twin_worker_and_the_run_runs_once(stack):
    a = stack.start_worker("a", node="twin")
    hung = stack.run_process(a)  # a's spare, ready for the next run: stopped before it gets one
    os.kill(hung.pid, signal.SIGSTOP)
    run_id = stack.submit("train.epochs=2")
    first = stack.wait(run_id, until=("running", "lost"))
    assert _owned_by(a) in first.worker_id
    b = stack.start_worker("b", node="twin")  # same node name, same host: a different worker all the same
    ids = wait_for(
        lambda: (
            [w.id for w in list_workers(stack.engine) if w.id.startswith("twin@")]
            if len(list_workers(stack.engine)) >= 2
            else None
        ),
        120,
        "the second worker did not register",
    )
    assert len(set(ids)) == 2, ids
    run = stack.wait(run_id, timeout=300)
    assert run.status == "completed", run.error
    assert run.attempt == 2 and _owned_by(b) in run.worker_id, run.worker_id
    assert "lost" in {e.code for e in list_events(stack.engine, run_id)}
    evaluations = [e.data["epoch"] for e in list_events(stack.engine, run_id) if e.code == "evaluation"]
    assert evaluations == [1, 2]
    with stack.engine.connect() as c:
        steps = list(
            c.execute(
                select(Metric.step).where(Metric.run_id == run_id, Metric.key == "train/loss").order_by(Metric.step)
            ).scalars()
        )
    assert steps == list(range(1, run.summary["global_step"] + 1))
    wait_for(lambda: _gone(hung.pid), 120, "worker a kept the hung process of a run that b owns")
    stack.kill_worker("b")  # a is free again: it runs the next run itself
    again = stack.submit("train.epochs=1", "data.num_samples=600")
    done = stack.wait(again, timeout=180)
    assert done.status == "completed" and _owned_by(a) in done.worker_id


def test_deleting_a_lost_or_running_run_stops_its_process(stack):
    a = stack.start_worker("a")
    hung = stack.run_process(a)
    os.kill(hung.pid, signal.SIGSTOP)
    lost = stack.submit("train.epochs=2")
    stack.wait(lost, until=("lost",), timeout=120)
    remove(lost, engine=stack.engine, by=local_user())  # a lost run may be deleted
    wait_for(lambda: _gone(hung.pid), 120, "the process of a deleted run kept running")
    with pytest.raises(RunNotFound):
        get_run(stack.engine, lost)
    running = stack.submit("train.epochs=200")
    stack.wait(running, until=("running",), timeout=120)
    child = stack.run_process(a)
    wait_for(lambda: _metric_rows(stack, running), 120, "the run stored no metric")
    with pytest.raises(RunStillActive, match="cancel it"):
        remove(running, engine=stack.engine, by=local_user())  # refused, with the reason
    delete_run(stack.engine, running, force=True)
    wait_for(lambda: _gone(child.pid), 60, "the process of a force-deleted run kept running")
    assert _metric_rows(stack, running) == 0, "the process wrote into its run after the delete"
    after = stack.submit("train.epochs=1", "data.num_samples=600")  # the worker is free for the next run
    assert stack.wait(after, timeout=180).status == "completed"


def test_a_queued_run_whose_message_was_lost_is_sent_again_by_any_worker(stack):
    run_id = stack.submit("train.epochs=1", "data.num_samples=600")
    broker = redis.Redis.from_url(stack.env["TORCHDECK_BROKER_URL"])
    assert broker.llen("cpu") == 1
    broker.flushdb()  # a Redis restarted without persistence: the message is gone, the run still queued
    stack.start_worker("w1", TORCHDECK_REQUEUE_AFTER_S="2")  # `torchdeck worker`, not `torchdeck up`
    run = stack.wait(run_id, timeout=180)
    assert run.status == "completed", run.error
    assert "resent" in {e.code for e in list_events(stack.engine, run_id)}
