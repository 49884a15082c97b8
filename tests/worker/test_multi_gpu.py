"""Runs of several GPUs on the worker side, without the training core: the worker that owns several GPUs, the
broker scan that covers the gpu-xN queues, and a lost rank turning a run `lost` and re-queued (never `failed`),
against a real SQLite database and a real Redis, in this process."""

from __future__ import annotations

import multiprocessing as mp
import os
import time

import pytest
import redis
import typer

from app.cli.processes import worker_commands
from app.cli.start import _up_workers, _worker_commands
from core.names import RUN_TASK
from db.engine import make_engine
from db.migrate import upgrade
from db.repo import claim_run, create_run, get_run, list_events, request_cancel
from worker import child, reaper, tasks
from worker.broker import run_ids_in_broker
from worker.celery_app import make_app
from worker.settings import WorkerSettings
from worker.sink import DbSink

FOUR_GPUS = {"device": "cuda", "resources": {"gpus": 4}, "train": {"batch_size": 128}}
TWO_GPUS = {"device": "cuda", "resources": {"gpus": 2}}


class RankLost(RuntimeError):
    """Stands for core.distributed.RankLost: the worker tells it by name, so it needs no training core."""

    def __init__(self, message: str, rank: int, world_size: int, exitcode: int) -> None:
        super().__init__(message)
        self.rank, self.world_size, self.exitcode = rank, world_size, exitcode


def _node(cmd: list[str]) -> str:
    return cmd[cmd.index("-n") + 1]


def _queues(cmd: list[str]) -> list[str]:
    return cmd[cmd.index("-Q") + 1].split(",")


# --- the launcher -------------------------------------------------------------------------------------------


def test_multi_gpu_starts_one_worker_owning_all_its_gpus_for_runs_of_two_to_n():
    ((cmd, env),) = worker_commands([0, 1, 2, 3], None, multi_gpu=True)
    assert env["CUDA_VISIBLE_DEVICES"] == "0,1,2,3" and _node(cmd) == "gpu0-3@%h"
    assert _queues(cmd) == ["gpu-x2", "gpu-x3", "gpu-x4"]  # not `gpu`: single-GPU runs stay one per GPU
    assert cmd[cmd.index("-P") + 1] == "solo"
    ((cmd, env),) = worker_commands([4, 6], None, multi_gpu=True)
    assert env["CUDA_VISIBLE_DEVICES"] == "4,6" and _node(cmd) == "gpu4_6@%h" and _queues(cmd) == ["gpu-x2"]
    default = worker_commands([0, 1, 2, 3], None)  # the default is unchanged: one worker per GPU
    assert [_node(c) for c, _ in default] == ["gpu0@%h", "gpu1@%h", "gpu2@%h", "gpu3@%h"]
    assert {tuple(_queues(c)) for c, _ in default} == {("gpu",)}


def test_multi_gpu_refuses_what_it_cannot_serve():
    with pytest.raises(ValueError, match="at least 2 GPUs .*torchdeck worker --gpus 0"):
        worker_commands([0], None, multi_gpu=True)
    with pytest.raises(ValueError, match="names a GPU twice"):
        worker_commands([1, 1], None, multi_gpu=True)
    with pytest.raises(ValueError, match="one worker per GPU"):
        worker_commands([0, 1], None, cpu_workers=2, multi_gpu=True)


def test_the_cli_passes_multi_gpu_and_up_lets_its_one_worker_take_multi_gpu_runs(monkeypatch):
    from app.cli import processes

    ((cmd, env),) = _worker_commands("0,1,2,3", None, None, True)
    assert _node(cmd) == "gpu0-3@%h" and env["CUDA_VISIBLE_DEVICES"] == "0,1,2,3"
    monkeypatch.setattr(processes, "gpu_count", lambda: 1)
    with pytest.raises(typer.Exit):  # one GPU found: said, and nothing starts
        _worker_commands(None, None, None, True)
    monkeypatch.setattr(processes, "gpu_count", lambda: 4)
    ((cmd, _),) = _up_workers(1)[0]
    assert _queues(cmd) == ["gpu", "cpu", "gpu-x2", "gpu-x3", "gpu-x4"]


# --- the broker and the reaper ------------------------------------------------------------------------------


@pytest.fixture
def stack(tmp_path, redis_server, monkeypatch):
    url = f"sqlite:///{tmp_path / 'db.sqlite'}"
    upgrade(url)
    engine = make_engine(url)
    broker = redis_server.url(0)  # as the reaper's tests: the stacks use 1-14, the jobs tests 15
    redis.Redis.from_url(broker).flushdb()
    app = make_app(WorkerSettings(broker_url=broker))
    monkeypatch.setattr(tasks, "_engine", engine)
    monkeypatch.setattr(reaper, "app", app)
    monkeypatch.setenv("TORCHDECK_HOME", str(tmp_path))
    monkeypatch.delenv("TORCHDECK_ARTIFACTS", raising=False)
    yield engine, app, redis.Redis.from_url(broker)
    engine.dispose()


def _age(engine, run_id: str, seconds: float) -> None:
    from datetime import timedelta

    from sqlalchemy import update

    from db.models import Run
    from db.types import utcnow

    old = utcnow() - timedelta(seconds=seconds)
    with engine.begin() as c:
        c.execute(update(Run).where(Run.id == run_id).values(created_at=old, heartbeat_at=old))


def test_a_multi_gpu_run_waits_in_its_own_queue_and_the_reaper_sees_it_there(stack):
    engine, app, client = stack
    waiting = create_run(engine, FOUR_GPUS, name="waits for a 4-GPU worker")
    orphan = create_run(engine, TWO_GPUS, name="its message was lost")
    reaper.send(waiting)
    assert client.llen("gpu-x4") == 1 and client.llen("gpu") == 0
    assert run_ids_in_broker(app, ["gpu-x4"], RUN_TASK) == {waiting.id}
    for r in (waiting, orphan):
        _age(engine, r.id, 300)
    settings = WorkerSettings(requeue_after_s=60)
    assert reaper.resend_missing(engine, settings) == [orphan.id]  # the 4-GPU run's message was found: not sent twice
    assert client.llen("gpu-x4") == 1 and client.llen("gpu-x2") == 1
    assert reaper.resend_missing(engine, settings) == []
    resent = [e for e in list_events(engine, orphan.id) if e.code == "resent"]
    assert resent and "'gpu-x2'" in resent[0].message


# --- a lost rank --------------------------------------------------------------------------------------------


def _running(engine, spec=FOUR_GPUS, worker="w1"):
    run = create_run(engine, spec, name="ddp")
    claim_run(engine, run.id, worker)
    return run


def _record(engine, run_id: str, exc: BaseException) -> bool:
    """What the run's process does with what training raised: through the real sink, then closed."""
    sink = DbSink(engine, run_id, "w1", WorkerSettings(flush_s=0.05, heartbeat_s=0.05))
    lost = child.record_failure(sink, exc)
    sink.close()
    return lost


def test_a_lost_rank_is_recorded_by_the_run_process_without_failing_the_run(stack):
    engine, _, _ = stack
    run = _running(engine)
    assert _record(engine, run.id, RankLost("rank 2 exited with code -9", rank=2, world_size=4, exitcode=-9))
    (event,) = [e for e in list_events(engine, run.id) if e.code == "rank_lost"]
    assert event.level == "warning" and event.message.startswith("rank 2 of 4 of this run's processes died")
    assert "resumes from its last checkpoint" in event.message
    assert {k: event.data[k] for k in ("rank", "world_size", "exitcode")} == {
        "rank": 2,
        "world_size": 4,
        "exitcode": -9,
    }
    assert get_run(engine, run.id).status == "running"  # the supervisor decides, not the run process
    other = _running(engine)
    assert not _record(engine, other.id, ValueError("bad shape"))  # any other error fails the run as before
    assert [e.code for e in list_events(engine, other.id) if e.level == "error"] == ["failed"]


def test_the_supervisor_marks_the_run_lost_at_once_and_requeues_it_to_resume(stack):
    engine, app, client = stack
    run = _running(engine)
    assert reaper.resume_after_rank_loss(engine, run.id, "w1", WorkerSettings(max_attempts=3)) == "rank lost"
    r = get_run(engine, run.id)
    assert r.status == "lost" and r.error is None and r.finished_at is None
    (event,) = [e for e in list_events(engine, run.id) if e.code == "lost"]
    assert "a rank of this run's processes died; re-queued (attempt 2 of 3) to 'gpu-x4'" in event.message
    assert run_ids_in_broker(app, ["gpu-x4"], RUN_TASK) == {run.id}
    again = claim_run(engine, run.id, "w2")  # another 4-GPU worker takes it, as a resumed attempt
    assert again is not None and again.attempt == 2


def test_a_run_whose_ranks_keep_dying_fails_after_max_attempts_and_a_cancelled_one_is_cancelled(stack):
    engine, _, client = stack
    run = _running(engine)
    assert reaper.resume_after_rank_loss(engine, run.id, "w1", WorkerSettings(max_attempts=1)) == "rank lost"
    r = get_run(engine, run.id)
    assert r.status == "failed" and "lost 1 times: a rank of its processes died each time" in r.error
    assert client.llen("gpu-x4") == 0
    cancelled = _running(engine)
    request_cancel(engine, cancelled.id)
    assert reaper.resume_after_rank_loss(engine, cancelled.id, "w1", WorkerSettings()) == "cancelled"
    assert get_run(engine, cancelled.id).status == "cancelled" and client.llen("gpu-x4") == 0


def test_a_run_no_longer_ours_is_left_alone(stack):
    engine, _, client = stack
    run = _running(engine, worker="w2")  # another worker claimed it meanwhile
    assert reaper.resume_after_rank_loss(engine, run.id, "w1", WorkerSettings()) == "abandoned"
    assert get_run(engine, run.id).status == "running" and get_run(engine, run.id).worker_id == "w2"
    assert client.llen("gpu-x4") == 0


def _pulse():
    pulse = mp.get_context("spawn").Value("d", time.monotonic(), lock=False)
    return pulse


def test_the_supervisor_reads_the_run_process_exit_code_as_a_lost_rank(stack):
    """The whole worker-side path: a run process exits with RANK_LOST_EXIT, and supervising it re-queues the run."""
    engine, app, _ = stack
    run = _running(engine)
    proc = mp.get_context("spawn").Process(target=os._exit, args=(child.RANK_LOST_EXIT,))
    proc.start()
    assert tasks._watch(proc, _pulse(), run.id, "w1", WorkerSettings(heartbeat_s=0.1)) == "rank lost"
    assert get_run(engine, run.id).status == "lost"
    assert run_ids_in_broker(app, ["gpu-x4"], RUN_TASK) == {run.id}
