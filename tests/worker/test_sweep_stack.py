"""Sweeps executed by real Celery workers against a real Redis, on SQLite and on Postgres: the trials go
through the normal queue, a trial is pruned with its reason, a worker killed mid-sweep leaves the same
number of trials, and a cancelled sweep cancels its queued and running trials."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from sqlalchemy import func, select

from core.config import RunSpec
from db import repo
from db.models import Metric
from sweep import study
from sweep.spec import SweepSpec
from tests.worker.conftest import ROOT, RUN, wait_for

TORCHDECK = str(Path(sys.executable).parent / "torchdeck")
SPACE = {
    "space": {"optim.lr": {"choice": [0.01, 0.003]}, "optim.weight_decay": {"choice": [0.0, 0.0001]}},
    "method": "grid",
    "objective": {"metric": "val/acc"},
    "budget": {"parallel": 2},
}


def cli(stack, *args: str, check: bool = True) -> subprocess.CompletedProcess:
    r = subprocess.run([TORCHDECK, *args], cwd=ROOT, env=stack.env, capture_output=True, text=True, timeout=180)
    if check:
        assert r.returncode == 0, r.stdout + r.stderr
    return r


def launch(stack, tmp_path, space: dict, *sets: str) -> str:
    (tmp_path / "spec.yaml").write_text(yaml.safe_dump(RUN))
    (tmp_path / "space.yaml").write_text(yaml.safe_dump(space))
    args = [a for s in sets for a in ("--set", s)]
    out = cli(stack, "sweep", str(tmp_path / "spec.yaml"), "--space", str(tmp_path / "space.yaml"), *args)
    assert "trials" in out.stdout
    return out.stdout.strip().splitlines()[-1]


def wait_sweep(stack, sweep_id: str, timeout: float = 600) -> repo.SweepRecord:
    return wait_for(
        lambda: (s := repo.get_sweep(stack.engine, sweep_id)).finished and s,
        timeout,
        f"sweep {sweep_id} did not end\n{stack.logs()}",
        every=0.5,
    )


def points_per_epoch(stack, run_id: str) -> list[tuple[int, int]]:
    with stack.engine.connect() as c:
        q = (
            select(Metric.epoch, func.count())
            .where(Metric.run_id == run_id, Metric.key == "val/acc")
            .group_by(Metric.epoch)
            .order_by(Metric.epoch)
        )
        return [tuple(row) for row in c.execute(q)]


def test_a_small_grid_completes_with_every_trial_stored_once(stack, tmp_path):
    stack.start_worker("a")
    stack.start_worker("b")
    sweep_id = launch(stack, tmp_path, SPACE, "train.epochs=2")
    assert wait_sweep(stack, sweep_id).status == "completed"
    runs = repo.sweep_runs(stack.engine, sweep_id)
    assert sorted(r.trial for r in runs) == [0, 1, 2, 3]
    assert len({(r.spec["optim"]["lr"], r.spec["optim"]["weight_decay"]) for r in runs}) == 4
    assert {r.status for r in runs} == {"completed"}
    for r in runs:
        assert points_per_epoch(stack, r.id) == [(1, 1), (2, 1)]
    status = json.loads(cli(stack, "sweep", "status", sweep_id, "--json").stdout)
    assert status["status"] == "completed" and status["trials"]["completed"] == 4 and status["epochs_used"] == 8
    best = cli(stack, "sweep", "best", sweep_id).stdout
    assert f"trial {status['best']['trial']}: val/acc" in best and "optim.lr=" in best


def _seed_with_good_first(space: dict) -> int:
    """A sampler seed whose grid starts with the learning rate that learns: the pruner then has a reference."""
    for seed in range(50):
        spec = SweepSpec.model_validate({**space, "seed": seed, "base": RunSpec.from_dict(RUN).model_dump(mode="json")})
        params, _ = study.ask(study.SweepState(spec, [], [], [], {}))
        if params["optim.lr"] == 0.01:
            return seed
    raise AssertionError("no seed puts lr 0.01 first")


@pytest.mark.parametrize("stack", ["sqlite"], indirect=True)
def test_a_trailing_trial_ends_pruned_with_its_reason(stack, tmp_path):
    space = {
        "space": {"optim.lr": {"choice": [0.01, 1e-7]}},
        "method": "grid",
        "objective": {"metric": "val/acc"},
        "pruner": {"kind": "median", "startup_trials": 1, "warmup_epochs": 0},
    }
    space["seed"] = _seed_with_good_first(space)
    stack.start_worker("a")
    sweep_id = launch(stack, tmp_path, space, "train.epochs=3")
    assert wait_sweep(stack, sweep_id).status == "completed"
    good, bad = sorted(repo.sweep_runs(stack.engine, sweep_id), key=lambda r: r.trial)
    assert good.status == "completed" and good.spec["optim"]["lr"] == 0.01
    assert bad.status == "pruned", bad.error
    assert bad.summary["epochs_run"] == 1  # stopped at the first epoch's end, not after all three
    verdicts = [
        e for e in repo.list_events(stack.engine, bad.id) if e.code == "pruned" and (e.data or {}).get("reason")
    ]
    assert len(verdicts) == 1 and "below the median" in verdicts[0].message and "at epoch 1" in verdicts[0].message
    decisions = repo.decisions(stack.engine, sweep_id, bad.trial)
    assert [(d.epoch, d.pruned) for d in decisions] == [(1, True)]


@pytest.mark.parametrize("stack", ["postgres"], indirect=True)
def test_a_worker_killed_mid_sweep_and_the_sweep_still_completes_with_the_same_trials(stack, tmp_path):
    stack.start_worker("a")
    stack.start_worker("b")
    sweep_id = launch(stack, tmp_path, SPACE, "train.epochs=3")

    def training_on_a():
        for r in repo.sweep_runs(stack.engine, sweep_id):
            if r.status == "running" and r.worker_id and r.worker_id.startswith("a@") and points_per_epoch(stack, r.id):
                return r
        return None

    victim = wait_for(training_on_a, 300, f"no trial stored an epoch on worker a\n{stack.logs()}", every=0.3)
    stack.kill_worker("a")
    stack.start_worker("c")
    assert wait_sweep(stack, sweep_id, timeout=900).status == "completed"
    runs = repo.sweep_runs(stack.engine, sweep_id)
    assert sorted(r.trial for r in runs) == [0, 1, 2, 3] and {r.status for r in runs} == {"completed"}
    assert repo.get_run(stack.engine, victim.id).attempt >= 2
    for r in runs:
        assert points_per_epoch(stack, r.id) == [(1, 1), (2, 1), (3, 1)]


@pytest.mark.parametrize("stack", ["sqlite"], indirect=True)
def test_cancelling_a_sweep_cancels_its_queued_and_running_trials(stack, tmp_path):
    stack.start_worker("a")
    sweep_id = launch(stack, tmp_path, SPACE, "train.epochs=200")
    running = wait_for(
        lambda: [r for r in repo.sweep_runs(stack.engine, sweep_id) if r.status == "running"],
        300,
        f"no trial started\n{stack.logs()}",
    )
    assert len(repo.sweep_runs(stack.engine, sweep_id)) == 2  # parallel 2: the second waits in the queue
    out = cli(stack, "sweep", "cancel", sweep_id).stdout
    assert "cancelled" in out
    wait_for(
        lambda: all(r.finished for r in repo.sweep_runs(stack.engine, sweep_id)),
        300,
        f"the sweep's runs did not stop\n{stack.logs()}",
    )
    runs = repo.sweep_runs(stack.engine, sweep_id)
    assert {r.status for r in runs} == {"cancelled"} and len(runs) == 2
    assert repo.get_sweep(stack.engine, sweep_id).status == "cancelled"
    assert running[0].id in {r.id for r in runs}
    # The worker is free and the sweep ended: no new trial appears.
    wait_for(
        lambda: (
            repo.list_workers(stack.engine) and all(w.current_run_id is None for w in repo.list_workers(stack.engine))
        ),
        120,
        "the worker still holds a run",
    )
    assert len(repo.trials(stack.engine, sweep_id)) == 2


@pytest.mark.parametrize("stack", ["sqlite"], indirect=True)  # refused before any database is read: one backend says it
def test_bad_sweep_specs_are_refused_with_the_field(stack, tmp_path):
    (tmp_path / "spec.yaml").write_text(yaml.safe_dump(RUN))
    cases = {
        "optim.lrr": ({"space": {"optim.lrr": {"choice": [0.1]}}}, "space.optim.lrr: unknown field; known fields:"),
        "grid": (
            {"space": {"optim.lr": {"loguniform": [1e-4, 1e-1], "num": 5}}, "method": "grid", "budget": {"trials": 3}},
            "budget.trials: the grid has 5 configurations",
        ),
        "value": ({"space": {"optim.lr": {"choice": [0.1, -1]}}}, "optim.lr: Input should be greater than 0"),
    }
    for name, (space, message) in cases.items():
        (tmp_path / f"{name}.yaml").write_text(yaml.safe_dump(space))
        r = cli(stack, "sweep", str(tmp_path / "spec.yaml"), "--space", str(tmp_path / f"{name}.yaml"), check=False)
        assert r.returncode == 2 and message in r.stderr, r.stderr
    assert repo.list_sweeps(stack.engine) == []
