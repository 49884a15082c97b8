"""Runs executed by real Celery workers against a real Redis, on SQLite and on Postgres."""

from __future__ import annotations

import random
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from app.auth import local_user
from app.services.runs import cancel
from db.repo import get_run, list_artifacts, list_events, list_runs, list_workers, metric_keys
from tests.worker.conftest import FINAL, ROOT, RUN, pg_ctl, wait_for

TORCHDECK = str(Path(sys.executable).parent / "torchdeck")


def _steps(stack, run_id: str, key: str) -> list[int]:
    """Every stored step of a series, straight from the table (duplicates would show here)."""
    from sqlalchemy import select

    from db.models import Metric

    with stack.engine.connect() as c:
        return list(
            c.execute(
                select(Metric.step).where(Metric.run_id == run_id, Metric.key == key).order_by(Metric.step)
            ).scalars()
        )


def test_cli_submit_runs_to_completion_with_everything_stored(stack, tmp_path):
    spec = tmp_path / "spec.yaml"
    spec.write_text(yaml.safe_dump(RUN))
    stack.start_worker("w1")
    r = subprocess.run(
        [
            TORCHDECK,
            "submit",
            str(spec),
            "--name",
            "cli run",
            "--set",
            "train.epochs=2",
            "--set",
            "export.formats=[onnx]",
        ],
        cwd=ROOT,
        env=stack.env,
        capture_output=True,
        text=True,
        timeout=120,
    )
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
    st = subprocess.run(
        [TORCHDECK, "status", run_id], cwd=ROOT, env=stack.env, capture_output=True, text=True, timeout=60
    )
    assert "completed" in st.stdout and "val/loss" in st.stdout


def test_submit_says_which_live_workers_serve_the_runs_queue(stack, tmp_path):
    spec = tmp_path / "spec.yaml"
    spec.write_text(yaml.safe_dump({**RUN, "device": "auto"}))  # auto goes to the gpu queue
    cmd = [TORCHDECK, "submit", str(spec), "--set", "train.epochs=1"]
    alone = subprocess.run(cmd, cwd=ROOT, env=stack.env, capture_output=True, text=True, timeout=120)
    assert alone.returncode == 0, alone.stderr
    assert "no live worker serves the 'gpu' queue" in alone.stderr and "device: cpu" in alone.stderr
    stack.start_worker("w1")
    wait_for(lambda: list_workers(stack.engine), 120, f"the worker did not register\n{stack.logs()}")
    served = subprocess.run(cmd, cwd=ROOT, env=stack.env, capture_output=True, text=True, timeout=120)
    assert "queue 'gpu' is served by 1 live worker(s): w1@" in served.stdout, served.stdout + served.stderr
    assert served.stdout.strip().splitlines()[-1] == served.stdout.strip().split()[-1]  # the run id stays last
    for run_id in (alone.stdout.split()[-1], served.stdout.split()[-1]):
        assert stack.wait(run_id).status == "completed"


def test_kill_9_workers_runs_resume_and_every_point_is_stored_once(stack):
    """kill -9 (worker and its run's child) at random moments; restarted workers finish every run
    from its checkpoint; every (key, step) exactly once, no gap."""
    rng = random.Random(7)
    stack.env["TORCHDECK_MAX_ATTEMPTS"] = "10"  # random kills may hit one run repeatedly; the cap is tested apart
    ids = [stack.submit("train.epochs=4") for _ in range(5)]
    stack.start_worker("a")
    stack.start_worker("b")
    kills, deadline = 0, time.monotonic() + 600
    while kills < 3:
        assert time.monotonic() < deadline, f"only {kills} kill(s) in 600 s\n{stack.logs()}"
        if not list_runs(stack.engine, status=["queued", "running", "lost"]).total:
            ids.append(stack.submit("train.epochs=4"))  # a fast machine finished them all: more work to interrupt
        time.sleep(rng.uniform(0.5, 4))  # a random moment (not a wait for anything)
        busy = [r for r in list_runs(stack.engine, status="running").runs if r.worker_id]
        victims = sorted({r.worker_id.split("@")[0] for r in busy} & set(stack.workers))
        if not victims:
            continue
        victim = rng.choice(victims)  # a worker in the middle of a run, at a random moment of it
        stack.kill_worker(victim)
        kills += 1
        stack.start_worker(f"{victim}{kills}")
    runs = [stack.wait(i, timeout=400) for i in ids]
    assert [r.status for r in runs] == ["completed"] * len(ids), [(r.id, r.status, r.error) for r in runs]
    assert any(r.attempt > 1 for r in runs), "no run was interrupted: the test proved nothing"
    for r in runs:
        total = r.summary["global_step"]
        assert _steps(stack, r.id, "train/loss") == list(range(1, total + 1)), r.id
        assert len(_steps(stack, r.id, "val/acc")) == 4
        events = list_events(stack.engine, r.id)
        assert sorted(e.data["epoch"] for e in events if e.code == "evaluation") == [1, 2, 3, 4], r.id  # once each
        assert [e.code for e in events].count("completed") == 1
        if r.attempt > 1:
            assert "resumed" in {e.code for e in list_events(stack.engine, r.id)} or r.summary["epochs_run"] == 4


def test_cancel_running_and_queued(stack):
    stack.start_worker("w1", TORCHDECK_CANCEL_GRACE_S="300")  # a stop between steps, never the SIGTERM fallback
    first = stack.submit("train.epochs=50")
    second = stack.submit("train.epochs=1")
    stack.wait(first, until=("running",))
    queued = cancel(second, engine=stack.engine, by=local_user())  # the operator (local mode: may do anything)
    assert queued.status == "cancelled"
    deadline = time.monotonic() + 120
    while not (stack.run_dir(first) / "checkpoints" / "last.pt").is_file():
        assert time.monotonic() < deadline, "no checkpoint written"
        time.sleep(0.2)
    r = subprocess.run(
        [TORCHDECK, "cancel", first], cwd=ROOT, env=stack.env, capture_output=True, text=True, timeout=60
    )
    assert r.returncode == 0, r.stderr
    run = stack.wait(first, timeout=120)
    assert run.status == "cancelled", run.error
    codes = [e.code for e in list_events(stack.engine, first)]
    assert "cancelled" in codes and "process_exit" not in codes, "the run did not stop cleanly between steps"
    assert (stack.run_dir(first) / "checkpoints" / "last.pt").is_file()
    # The cancelled queued run's message comes before this one's: once this one is done, it was refused.
    third = stack.submit("train.epochs=1", "data.num_samples=600")
    assert stack.wait(third, timeout=180).status == "completed"
    never = get_run(stack.engine, second)
    assert never.status == "cancelled" and never.attempt == 0 and never.started_at is None


def test_diverging_and_invalid_specs_and_two_workers(stack, tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text(yaml.safe_dump({**RUN, "optim": {"lr": -1}}))
    r = subprocess.run(
        [TORCHDECK, "submit", str(bad)], cwd=ROOT, env=stack.env, capture_output=True, text=True, timeout=60
    )
    assert r.returncode == 2 and "optim.lr" in r.stderr
    assert list_runs(stack.engine).total == 0, "an invalid spec must never be stored or enqueued"
    stack.start_worker("a")
    stack.start_worker("b")
    wait_for(lambda: len(list_workers(stack.engine)) == 2, 120, f"the two workers did not register\n{stack.logs()}")
    # The worker ready first could take every short run before the other is ready (a busy machine starts it later):
    # a run that cannot end by itself keeps it busy until the other worker has taken one.
    busy = stack.submit("train.epochs=500")
    held = stack.wait(busy, until=("running",))
    div = stack.submit("optim.name=sgd", "optim.lr=1000", "train.grad_clip.mode=none")
    ok = [stack.submit("train.epochs=1", "data.num_samples=600") for _ in range(4)]
    taken = stack.wait(div, until=("running", *FINAL))
    assert taken.worker_id != held.worker_id, "a busy worker took another run"
    cancel(busy, engine=stack.engine, by=local_user())  # both workers free: they share the rest
    d = stack.wait(div)
    assert d.status == "diverged"
    advice = [e for e in list_events(stack.engine, div) if e.code == "non_finite_loss"]
    assert advice and "learning rate" in advice[0].data["advice"]
    done = [stack.wait(i) for i in ok]
    assert {r.status for r in done} == {"completed"}, [(r.status, r.error, r.worker_id) for r in done]
    assert stack.wait(busy, timeout=120).status == "cancelled"
    assert len({r.worker_id for r in [held, d, *done]}) == 2, "both workers took runs"


def test_redis_restart_mid_run(stack, redis_server):
    stack.start_worker("w1")
    run_id = stack.submit("train.epochs=500")  # cannot end by itself during the test: it is cancelled below
    stack.wait(run_id, until=("running",))
    redis_server.stop()
    assert get_run(stack.engine, run_id).status == "running"
    redis_server.start()
    seen = len(_steps(stack, run_id, "train/loss"))
    wait_for(lambda: len(_steps(stack, run_id, "train/loss")) > seen + 50, 120, "the run stopped training")
    cancel(run_id, engine=stack.engine, by=local_user())
    run = stack.wait(run_id, timeout=120)
    assert run.status == "cancelled" and _steps(stack, run_id, "train/loss") == list(
        range(1, run.summary["global_step"] + 1)
    )
    again = stack.submit("train.epochs=1", "data.num_samples=600")  # the worker reconnected to the new server
    assert stack.wait(again, timeout=120).status == "completed"


@pytest.mark.parametrize("stack", ["postgres"], indirect=True)  # SQLite is a local file: no server to lose
def test_database_unreachable_for_20s_loses_no_metric(stack, postgres):
    stack.env["TORCHDECK_STALE_AFTER_S"] = "60"  # a 20 s outage is not a dead worker
    stack.env["TORCHDECK_SINK_BUFFER_POINTS"] = "100"  # a memory window far shorter than the outage: points spill
    stack.start_worker("w1")
    run_id = stack.submit("train.epochs=500")  # cannot end by itself during the test: it is cancelled below
    wait_for(lambda: _steps(stack, run_id, "train/loss"), 120, "the run stored no metric")
    pg_ctl(postgres, "stop", "-m", "fast")
    time.sleep(20)  # the outage (its length is the scenario, not a wait for anything)
    pg_ctl(
        postgres,
        "start",
        "-o",
        f"-p {postgres.port} -k {postgres.socket_dir} -c listen_addresses=127.0.0.1 -c fsync=off",
        "-l",
        str(postgres.root / "server.log"),
    )
    epochs = len(_steps(stack, run_id, "val/acc"))
    wait_for(lambda: len(_steps(stack, run_id, "val/acc")) >= epochs + 2, 240, "the run did not go on after the outage")
    cancel(run_id, engine=stack.engine, by=local_user())
    run = stack.wait(run_id, timeout=240)
    assert run.status == "cancelled", run.error
    assert run.attempt == 1 and run.degraded is None
    assert _steps(stack, run_id, "train/loss") == list(range(1, run.summary["global_step"] + 1))
    assert len(_steps(stack, run_id, "val/acc")) == run.summary["epochs_run"]
    assert not list((stack.run_dir(run_id) / "spill").glob("*.jsonl")), "spilled points were left unstored"
    assert "points and" in (stack.home / "w1.log").read_text(), "the outage never filled the memory window"
