"""Worker pieces without a broker: exit reasons, the reaper's attempt cap, worker commands, the DB sink."""

from __future__ import annotations

import signal
import time

import pytest

from app.cli.processes import worker_commands
from db.engine import make_engine
from db.migrate import upgrade
from db.repo import claim_run, create_run, get_run, list_events
from worker.settings import WorkerSettings
from worker.sink import DbSink
from worker.tasks import describe_exit


def test_exit_codes_become_reasons():
    assert "out of memory" in describe_exit(-signal.SIGKILL)
    assert "SIGTERM" in describe_exit(-signal.SIGTERM)
    assert "code 3" in describe_exit(3)


def test_one_solo_worker_per_gpu_with_pinned_device():
    cmds = worker_commands([0, 1], ["gpu"])
    assert [env["CUDA_VISIBLE_DEVICES"] for _, env in cmds] == ["0", "1"]
    for cmd, _ in cmds:
        assert cmd[cmd.index("-P") + 1] == "solo" and cmd[cmd.index("-Q") + 1] == "gpu"
    ((cpu_cmd, cpu_env),) = worker_commands(None, None)
    assert cpu_cmd[cpu_cmd.index("-Q") + 1] == "cpu" and cpu_env["CUDA_VISIBLE_DEVICES"] == ""


@pytest.fixture
def engine(tmp_path):
    url = f"sqlite:///{tmp_path / 'db.sqlite'}"
    upgrade(url)
    return make_engine(url)


def test_reaper_fails_a_run_lost_too_often(engine):
    from worker import reaper

    run = create_run(engine, {"device": "cpu"}, name="lost")
    claim_run(engine, run.id, "w1")
    time.sleep(0.05)
    assert reaper.reap(engine, WorkerSettings(stale_after_s=0.01, max_attempts=1)) == []
    r = get_run(engine, run.id)
    assert r.status == "failed" and "lost 1 times" in r.error


def test_db_sink_buffers_flushes_and_learns_cancel(engine):
    run = create_run(engine, {"device": "cpu"}, name="s")
    claim_run(engine, run.id, "w1")
    sink = DbSink(engine, run.id, "w1", WorkerSettings(flush_s=0.05, heartbeat_s=0.05))
    for step in range(1, 2001):
        sink.metrics(step, 1, {"train/loss": 1.0 / step, "lr": 0.1})
    sink.event("diagnosis", "warning", "x", {"code": "overfitting", "advice": "a"})
    assert sink.flush(30)
    from sqlalchemy import text

    with engine.connect() as c:
        assert c.execute(text("select count(*) from metric where run_id=:r"), {"r": run.id}).scalar() == 4000
    assert [e.code for e in list_events(engine, run.id)] == ["overfitting"]
    from db.repo import request_cancel

    request_cancel(engine, run.id)
    deadline = time.monotonic() + 60
    while not sink.should_stop() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert sink.should_stop()
    sink.close()
