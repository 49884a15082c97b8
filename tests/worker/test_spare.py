"""The worker's run processes (worker.tasks.Spare): forked from the worker's fork server, which imported what a run
needs once and never touches CUDA, or spawned (TORCHDECK_RUN_START=spawn); either way a process is ready (its
imports done) before its run arrives, ticks its pulse, runs exactly one run and exits."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from pydantic import ValidationError

from worker.settings import WorkerSettings
from worker.tasks import start_context

ROOT = Path(__file__).resolve().parents[2]


def _python(code: str, env: dict[str, str] | None = None, timeout: float = 600) -> dict:
    """Run `code` in a fresh interpreter (a fork server of its own, never this test process's); its last
    stdout line, as JSON."""
    out = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=False,
        timeout=timeout,
        env={**os.environ, "CUDA_VISIBLE_DEVICES": "", **(env or {})},
    )
    assert out.returncode == 0, out.stderr[-4000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_the_start_method_is_a_setting_with_forkserver_by_default(monkeypatch):
    monkeypatch.delenv("TORCHDECK_RUN_START", raising=False)
    assert WorkerSettings().run_start == "forkserver"
    assert start_context("forkserver").get_start_method() == "forkserver"
    assert start_context("spawn").get_start_method() == "spawn"
    assert WorkerSettings(run_start="spawn").run_start == "spawn"
    with pytest.raises(ValidationError):
        WorkerSettings(run_start="fork")  # a fork of the worker itself: never


def test_the_fork_servers_imports_never_call_into_cuda():
    """Every run process is forked from the process that ran these imports: had they initialised CUDA, no run
    could use a GPU. Each torch.cuda entry point that could is recorded while they run."""
    got = _python("""
        import json, torch, torch.cuda
        calls = []
        def recorded(owner, name):
            fn = getattr(owner, name)
            def call(*a, **k):
                calls.append(name)
                return fn(*a, **k)
            setattr(owner, name, call)
        for name in ("is_available", "device_count", "init", "_lazy_init", "current_device", "set_device",
                     "get_device_properties", "mem_get_info", "synchronize", "get_device_name"):
            recorded(torch.cuda, name)
        for name in ("_cuda_getDeviceCount", "_cuda_init"):
            if hasattr(torch._C, name):
                recorded(torch._C, name)
        import worker.preload
        print(json.dumps({"calls": calls, "initialized": torch.cuda.is_initialized(),
                          "missing": worker.preload.import_heavy()}))
    """)
    assert got == {"calls": [], "initialized": False, "missing": []}


@pytest.mark.parametrize("method", ["forkserver", "spawn"])
def test_a_run_process_is_ready_before_its_run_and_runs_it_once(method, tmp_path):
    home = tmp_path / "home"
    got = _python(
        f"""
        import json, os, time
        import psutil
        from db.engine import make_engine
        from db.migrate import upgrade
        from db.repo import claim_run, create_run, get_run, series
        from worker.tasks import Spare

        url = "sqlite:///{home}/db.sqlite"
        os.makedirs("{home}", exist_ok=True)
        upgrade(url)
        engine = make_engine(url)
        spec = {{"data": {{"name": "synthetic", "num_classes": 3, "num_samples": 200, "size": 8, "channels": 1}},
                 "model": {{"name": "simple_cnn", "hidden": 8}},
                 "train": {{"epochs": 1, "batch_size": 32, "log_every": 1}},
                 "export": {{"formats": []}}, "device": "cpu", "seed": 0}}
        run = create_run(engine, spec, name="spare")
        claim_run(engine, run.id, "w1", device="cpu")

        def wait(condition, what, timeout=300):
            deadline = time.monotonic() + timeout
            while not condition():
                assert time.monotonic() < deadline, what
                time.sleep(0.05)

        spare = Spare({method!r})
        spare.fill()
        first = spare.pulse.value
        wait(lambda: spare.ready.value > 0, "the process never finished its imports")
        wait(lambda: spare.pulse.value > first, "the process never ticked its pulse")
        parent = psutil.Process(spare.proc.pid).parent()
        proc, pulse = spare.take((run.id, "w1", url))
        proc.join(300)
        done = get_run(engine, run.id)
        print(json.dumps({{"exitcode": proc.exitcode, "status": done.status,
                          "steps": len(series(engine, run.id, "train/loss").steps),
                          "by_this_process": parent.pid == os.getpid(),
                          "by_its_server": parent.ppid() == os.getpid()
                          and "forkserver" in " ".join(parent.cmdline())}}))
    """,
        env={"TORCHDECK_HOME": str(home), "OMP_NUM_THREADS": "1"},
    )
    assert got["exitcode"] == 0 and got["status"] == "completed", got
    assert got["steps"] >= 1, got
    if method == "forkserver":  # forked by the server this process started, not by this process
        assert got["by_its_server"] and not got["by_this_process"], got
    else:
        assert got["by_this_process"] and not got["by_its_server"], got
