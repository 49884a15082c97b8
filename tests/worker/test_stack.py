"""Runs executed by real Celery workers against a real Redis, on SQLite and on Postgres."""

from __future__ import annotations

import random
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from db.repo import list_artifacts, list_events, list_runs, metric_keys
from tests.worker.conftest import ROOT, RUN

TORCHDECK = str(Path(sys.executable).parent / "torchdeck")


def _steps(stack, run_id: str, key: str) -> list[int]:
    """Every stored step of a series, straight from the table (duplicates would show here)."""
    from sqlalchemy import select

    from db.models import Metric

    with stack.engine.connect() as c:
        return list(c.execute(select(Metric.step).where(Metric.run_id == run_id, Metric.key == key).order_by(Metric.step)).scalars())


def test_cli_submit_runs_to_completion_with_everything_stored(stack, tmp_path):
    spec = tmp_path / "spec.yaml"
    spec.write_text(yaml.safe_dump(RUN))
    stack.start_worker("w1")
    r = subprocess.run([TORCHDECK, "submit", str(spec), "--name", "cli run", "--set", "train.epochs=2",
                        "--set", "export.formats=[onnx]"], cwd=ROOT, env=stack.env, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    run_id = r.stdout.strip().splitlines()[-1]
    run = stack.wait(run_id)
    assert run.status == "completed", run.error
    assert run.name == "cli run" and run.attempt == 1 and run.progress == 1.0
    assert run.summary["best"]["metric"] == "val/loss"
    keys = set(metric_keys(stack.engine, run_id))
    assert {"train/loss", "val/acc", "lr", "grad_norm", "sys/cpu_percent"} <= keys
    assert _steps(stack, run_id, "train/loss") == list(range(1, run.summary["global_step"] + 1))
    kinds = {a.kind for a in list_artifacts(stack.engine, run_id)}
    assert {"checkpoint_last", "checkpoint_best", "sample_grid", "onnx"} <= kinds
    assert (stack.run_dir(run_id) / "export" / "model.onnx").is_file()
    codes = {e.code for e in list_events(stack.engine, run_id)}
    assert {"started", "completed"} <= codes
    st = subprocess.run([TORCHDECK, "status", run_id], cwd=ROOT, env=stack.env, capture_output=True, text=True, timeout=60)
    assert "completed" in st.stdout and "val/loss" in st.stdout


def test_kill_9_workers_runs_resume_and_every_point_is_stored_once(stack):
    """kill -9 (worker and its run's child) at random moments; restarted workers finish every run
    from its checkpoint; every (key, step) exactly once, no gap."""
    rng = random.Random(7)
    stack.env["TORCHDECK_MAX_ATTEMPTS"] = "10"  # random kills may hit one run repeatedly; the cap is tested apart
    ids = [stack.submit("train.epochs=4") for _ in range(5)]
    stack.start_worker("a")
    stack.start_worker("b")
    kills, deadline = 0, time.monotonic() + 300
    while kills < 3 and time.monotonic() < deadline:
        time.sleep(rng.uniform(2, 6))
        busy = [r for r in list_runs(stack.engine, status="running").runs if r.worker_id]
        victims = sorted({r.worker_id.split("@")[0] for r in busy} & set(stack.workers))
        if not victims:
            continue
        victim = rng.choice(victims)  # a worker in the middle of a run, at a random moment of it
        stack.kill_worker(victim)
        kills += 1
        stack.start_worker(f"{victim}{kills}")
    runs = [stack.wait(i, timeout=400) for i in ids]
    assert [r.status for r in runs] == ["completed"] * 5, [(r.id, r.status, r.error) for r in runs]
    assert kills == 3 and any(r.attempt > 1 for r in runs), "no run was interrupted: the test proved nothing"
    for r in runs:
        total = r.summary["global_step"]
        assert _steps(stack, r.id, "train/loss") == list(range(1, total + 1)), r.id
        assert len(_steps(stack, r.id, "val/acc")) == 4
        if r.attempt > 1:
            assert "resumed" in {e.code for e in list_events(stack.engine, r.id)} or r.summary["epochs_run"] == 4


def test_cancel_running_and_queued(stack):
    stack.start_worker("w1")
    first = stack.submit("train.epochs=50")
    second = stack.submit("train.epochs=1")
    stack.wait(first, until=("running",))
    from app.auth import local_user
    from app.services import cancel

    queued = cancel(second, engine=stack.engine, by=local_user())  # the operator (local mode: may do anything)
    assert queued.status == "cancelled"
    deadline = time.monotonic() + 120
    while not (stack.run_dir(first) / "checkpoints" / "last.pt").is_file():
        assert time.monotonic() < deadline, "no checkpoint written"
        time.sleep(0.2)
    r = subprocess.run([TORCHDECK, "cancel", first], cwd=ROOT, env=stack.env, capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    t0 = time.monotonic()
    run = stack.wait(first, timeout=30)
    assert run.status == "cancelled" and time.monotonic() - t0 < 5.0 + 1.0
    assert (stack.run_dir(first) / "checkpoints" / "last.pt").is_file()
    time.sleep(3)  # the worker is free now; a cancelled queued run must never start
    from db.repo import get_run

    never = get_run(stack.engine, second)
    assert never.status == "cancelled" and never.attempt == 0 and never.started_at is None


def test_diverging_and_invalid_specs_and_two_workers(stack, tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text(yaml.safe_dump({**RUN, "optim": {"lr": -1}}))
    r = subprocess.run([TORCHDECK, "submit", str(bad)], cwd=ROOT, env=stack.env, capture_output=True, text=True, timeout=60)
    assert r.returncode == 2 and "optim.lr" in r.stderr
    assert list_runs(stack.engine).total == 0, "an invalid spec must never be stored or enqueued"
    stack.start_worker("a")
    stack.start_worker("b")
    div = stack.submit("optim.name=sgd", "optim.lr=1000", "train.grad_clip.mode=none")
    ok = [stack.submit("train.epochs=1", "data.num_samples=600") for _ in range(4)]
    d = stack.wait(div)
    assert d.status == "diverged"
    advice = [e for e in list_events(stack.engine, div) if e.code == "non_finite_loss"]
    assert advice and "learning rate" in advice[0].data["advice"]
    done = [stack.wait(i) for i in ok]
    assert {r.status for r in done} == {"completed"}, [(r.status, r.error, r.worker_id) for r in done]
    assert len({r.worker_id for r in [d, *done]}) == 2, "both workers took runs"


def test_redis_restart_mid_run(stack, redis_server):
    stack.start_worker("w1")
    run_id = stack.submit("train.epochs=4")
    stack.wait(run_id, until=("running",))
    redis_server.stop()
    time.sleep(2)
    redis_server.start()
    assert stack.wait(run_id).status == "completed"
    again = stack.submit("train.epochs=1", "data.num_samples=600")  # the worker reconnected to the new server
    assert stack.wait(again, timeout=120).status == "completed"


@pytest.mark.parametrize("stack", ["postgres"], indirect=True)  # SQLite is a local file: no server to lose
def test_database_unreachable_for_20s_loses_no_metric(stack, postgres):
    stack.env["TORCHDECK_STALE_AFTER_S"] = "60"  # a 20 s outage is not a dead worker
    stack.start_worker("w1")
    run_id = stack.submit("train.epochs=6")
    stack.wait(run_id, until=("running",))
    time.sleep(3)
    _pg_ctl(postgres, "stop", "-m", "fast")
    time.sleep(20)
    _pg_ctl(postgres, "start", "-o", f"-p {postgres.port} -k {postgres.socket_dir} -c listen_addresses=127.0.0.1 -c fsync=off",
            "-l", str(postgres.root / "server.log"))
    run = stack.wait(run_id, timeout=240)
    assert run.status == "completed", run.error
    assert _steps(stack, run_id, "train/loss") == list(range(1, run.summary["global_step"] + 1))
    assert len(_steps(stack, run_id, "val/acc")) == 6


def _pg_ctl(pg, *args: str) -> None:
    cmd = [*pg._as_user, str(pg.bin_dir / "pg_ctl"), args[0], "-D", str(pg.root / "data"), "-w", *args[1:]]
    subprocess.run(cmd, check=True, capture_output=True, timeout=60)
