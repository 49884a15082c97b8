"""A run of two processes (resources.gpus: 2, gloo on CPU) executed by a real Celery worker against a real
Redis and database: rank 1 or rank 0 killed with SIGKILL makes the run lost (no rank outlives rank 0), it
resumes from its last checkpoint and completes with every metric point stored once; a cancel stops every
rank."""

from __future__ import annotations

import psutil
import pytest

from app.auth import local_user
from app.services.runs import cancel
from db.repo import list_events
from tests.worker.conftest import _live_spawned, wait_for
from tests.worker.test_stack import _steps

pytestmark = pytest.mark.parametrize("stack", ["sqlite"], indirect=True)


def _rank_1(stack, worker):
    """The run's second rank: the spawned child of the worker's run process (rank 0)."""
    rank_0 = stack.run_process(worker)
    return wait_for(
        lambda: next((k for k in rank_0.children() if _live_spawned(k)), None),
        180,
        f"run process {rank_0.pid} has no rank 1\n{stack.logs()}",
    )


def test_a_killed_rank_makes_the_run_lost_and_it_resumes_with_every_point_once(stack):
    worker = stack.start_worker("a")
    run_id = stack.submit("train.epochs=4", "resources.gpus=2")
    wait_for(
        lambda: (stack.run_dir(run_id) / "checkpoints" / "last.pt").is_file(),
        300,
        f"no checkpoint of {run_id}\n{stack.logs()}",
    )
    _rank_1(stack, worker).kill()
    r = stack.wait(run_id, timeout=600)
    assert r.status == "completed", (r.error, stack.logs())
    assert r.attempt == 2, "the kill did not interrupt the run: the test proved nothing"
    codes = [e.code for e in list_events(stack.engine, run_id)]
    assert "rank_lost" in codes and "resumed" in codes, codes
    assert codes.count("distributed") == 2  # each attempt ran as two processes
    total = r.summary["global_step"]
    assert _steps(stack, run_id, "train/loss") == list(range(1, total + 1))  # every step once, none lost
    assert len(_steps(stack, run_id, "val/acc")) == 4


def test_a_killed_rank_0_leaves_no_orphan_rank_and_the_run_resumes(stack):
    worker = stack.start_worker("a")
    run_id = stack.submit("train.epochs=4", "resources.gpus=2")
    wait_for(
        lambda: (stack.run_dir(run_id) / "checkpoints" / "last.pt").is_file(),
        300,
        f"no checkpoint of {run_id}\n{stack.logs()}",
    )
    rank_1 = _rank_1(stack, worker)
    stack.run_process(worker).kill()  # rank 0: the run's own process, which owns the sink
    wait_for(lambda: not rank_1.is_running() or rank_1.status() == psutil.STATUS_ZOMBIE, 120, "rank 1 outlived rank 0")
    r = stack.wait(run_id, timeout=600)
    assert r.status == "completed" and r.attempt == 2, (r.status, r.attempt, r.error)
    total = r.summary["global_step"]
    assert _steps(stack, run_id, "train/loss") == list(range(1, total + 1))
    assert len(_steps(stack, run_id, "val/acc")) == 4


def test_cancel_stops_every_rank(stack):
    worker = stack.start_worker("a", TORCHDECK_CANCEL_GRACE_S="300")  # a stop between steps, never SIGTERM
    run_id = stack.submit("train.epochs=50", "resources.gpus=2")
    rank_1 = _rank_1(stack, worker)
    stack.wait(run_id, until=("running",))
    wait_for(lambda: _steps(stack, run_id, "train/loss"), 180, "no step stored")
    assert cancel(run_id, engine=stack.engine, by=local_user()).cancel_requested
    assert stack.wait(run_id, timeout=180).status == "cancelled"
    codes = [e.code for e in list_events(stack.engine, run_id)]
    assert "cancelled" in codes and "process_exit" not in codes, "the run did not stop cleanly between steps"
    wait_for(lambda: not rank_1.is_running() or rank_1.status() == psutil.STATUS_ZOMBIE, 120, "rank 1 still runs")
