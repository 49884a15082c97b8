"""The dashboard's torch jobs on the `jobs` queue (worker/jobs.py), as team mode runs them: the app asks by task
name (app/services/jobs.py), `torchdeck worker --queues cpu`
(a run worker plus its host's jobs worker) against a real Redis, the app and the workers with their own
TORCHDECK_HOME and one shared artifact folder (the compose file's `artifacts` volume), SQLite shared."""

from __future__ import annotations

import hashlib
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from app.auth import local_user
from app.services import jobs
from app.services.artifacts import artifact_store, latest_by_kind, read_artifact
from app.services.runs import submit
from core.config import RunSpec
from db.engine import make_engine
from db.migrate import upgrade
from db.repo import create_run, get_artifact, get_run, list_artifacts, list_workers
from tests.worker.conftest import FINAL, ROOT

TORCHDECK = str(Path(sys.executable).parent / "torchdeck")
TINY = {  # real digits at 8×8, the reference CNN, one epoch
    "name": "jobs-test",
    "data": {"name": "digits", "image_size": 8},
    "model": {"name": "simple_cnn", "hidden": 16},
    "train": {"epochs": 1, "batch_size": 64},
    "export": {"formats": []},
    "device": "cpu",
    "seed": 0,
}
PNG = b"\x89PNG\r\n\x1a\n"


@pytest.fixture(scope="module")
def team(tmp_path_factory, redis_server):
    import redis

    root = tmp_path_factory.mktemp("jobs")
    url = f"sqlite:///{root / 'torchdeck.db'}"
    upgrade(url)
    redis.Redis(port=redis_server.port, db=15).flushdb()
    shared = {
        "TORCHDECK_DATABASE_URL": url,
        "TORCHDECK_BROKER_URL": redis_server.url(15),
        "TORCHDECK_ARTIFACTS": str(root / "artifacts"),
    }
    env = {
        **os.environ,
        **shared,
        "TORCHDECK_HOME": str(root / "worker-home"),
        "TORCHDECK_HEARTBEAT_S": "1",
        "OMP_NUM_THREADS": "1",
        "CUDA_VISIBLE_DEVICES": "",
    }
    log = open(root / "worker.log", "ab")  # noqa: SIM115 - kept open for the worker's life
    proc = subprocess.Popen(
        [TORCHDECK, "worker", "--queues", "cpu"],
        cwd=ROOT,
        env=env,
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    with pytest.MonkeyPatch.context() as mp:
        for k, v in {**shared, "TORCHDECK_HOME": str(root / "app-home")}.items():
            mp.setenv(k, v)
        engine = make_engine(url)
        try:
            deadline = time.monotonic() + 60
            while {q for w in list_workers(engine) for q in w.queues} < {"cpu", "jobs"}:
                assert proc.poll() is None and time.monotonic() < deadline, (root / "worker.log").read_text()[-3000:]
                time.sleep(0.3)
            # Trains while the pre-flight test runs: the jobs worker does not wait behind the run worker.
            run_id = submit(RunSpec.model_validate(TINY), engine=engine).id
            yield {"engine": engine, "run_id": run_id, "root": root}
        finally:
            proc.send_signal(signal.SIGTERM)  # `torchdeck worker` stops its whole group
            try:
                proc.wait(30)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
            log.close()


def _logs(root: Path) -> str:
    return (root / "worker.log").read_text()[-4000:]


def test_worker_command_starts_the_hosts_jobs_worker(team):
    ids = {w.id.split("@")[0]: w.queues for w in list_workers(team["engine"])}
    assert ids["jobs-cpu"] == ("jobs",) and "cpu" in ids["cpu"]


def test_preflight_on_the_jobs_worker_returns_shapes_and_the_grid(team):
    spec = RunSpec.model_validate({**TINY, "device": "auto"})
    result = jobs.preflight(spec, timeout_s=120)
    assert result["ok"], (result, _logs(team["root"]))
    assert result["shapes"] and "[10]" in str(result["shapes"])
    assert result["data"]["name"] == "digits" and result["model"]["parameters"] > 0
    assert result["grid"] and result["grid"].startswith(PNG)
    assert not artifact_store().list("jobs")  # the answer is removed once read


def _completed(team) -> str:
    """The module's run, once it has finished (it trains while the first tests run)."""
    engine, run_id = team["engine"], team["run_id"]
    deadline = time.monotonic() + 120
    while (run := get_run(engine, run_id)).status not in FINAL:
        assert time.monotonic() < deadline, _logs(team["root"])
        time.sleep(0.3)
    assert run.status == "completed", run.error
    return run_id


def test_export_now_on_the_jobs_worker_registers_a_verified_onnx(team):
    engine, run_id = team["engine"], _completed(team)
    assert not [a for a in list_artifacts(engine, run_id) if a.kind == "onnx"]
    ok, output = jobs.export_now(run_id, ["onnx"], by=local_user())
    assert ok and "onnx verified" in output, (output, _logs(team["root"]))
    onnx = latest_by_kind(list_artifacts(engine, run_id))["onnx"]
    assert onnx.meta.get("ok") is True and onnx.meta.get("parity")
    data = read_artifact(onnx.id, engine)  # by its opaque id, as the download button does
    assert len(data) == onnx.size and hashlib.sha256(data).hexdigest() == onnx.sha256
    import onnx as onnx_lib

    assert onnx_lib.load_model_from_string(data).graph.input
    assert "export_report" in {a.kind for a in list_artifacts(engine, run_id)}


def test_exporting_again_never_changes_an_earlier_exports_files(team):
    """Two more exports through the jobs worker: each adds its own files; every artifact of the earlier one
    keeps its row and the very bytes it was registered with, and stays downloadable by its id."""
    engine, run_id = team["engine"], _completed(team)
    ok, output = jobs.export_now(run_id, ["onnx", "torchscript"], by=local_user())
    assert ok and "exports/" in output, (output, _logs(team["root"]))
    first = latest_by_kind(list_artifacts(engine, run_id))
    first = {k: first[k] for k in ("onnx", "torchscript", "export_report", "bundle")}
    before = {k: read_artifact(a.id, engine) for k, a in first.items()}
    ok, output = jobs.export_now(run_id, ["onnx"], "last", by=local_user())
    assert ok, (output, _logs(team["root"]))
    latest = latest_by_kind(list_artifacts(engine, run_id))
    for kind, a in first.items():
        assert get_artifact(engine, a.id) == a
        data = read_artifact(a.id, engine)
        assert data == before[kind] and hashlib.sha256(data).hexdigest() == a.sha256
    assert {latest[k].id for k in ("onnx", "export_report", "bundle")}.isdisjoint(a.id for a in first.values())
    assert latest["onnx"].uri != first["onnx"].uri and latest["torchscript"] == first["torchscript"]


def test_no_jobs_worker_gives_a_clear_error(tmp_path, redis_server, monkeypatch):
    import redis

    url = f"sqlite:///{tmp_path / 'alone.db'}"
    upgrade(url)
    redis.Redis(port=redis_server.port, db=0).flushdb()
    for k, v in {
        "TORCHDECK_DATABASE_URL": url,
        "TORCHDECK_BROKER_URL": redis_server.url(0),
        "TORCHDECK_HOME": str(tmp_path / "home"),
        jobs.PICKUP_ENV: "1.5",
    }.items():
        monkeypatch.setenv(k, v)
    t0 = time.monotonic()
    result = jobs.preflight(RunSpec.model_validate(TINY), timeout_s=30)
    assert not result["ok"] and "no worker is serving the jobs queue" in result["error"]
    assert "torchdeck worker" in result["error"]
    run = create_run(make_engine(url), RunSpec.model_validate(TINY).model_dump(mode="json"))
    ok, output = jobs.export_now(run.id, ["onnx"], by=local_user())
    assert not ok and "no worker is serving the jobs queue" in output
    assert time.monotonic() - t0 < 30  # the pickup limit ended the wait, not the 30 s job timeout
    redis.Redis(port=redis_server.port, db=0).flushdb()


def test_old_unread_answers_are_swept(tmp_path):
    from db.artifacts import open_store
    from worker.jobs import sweep

    store = open_store(str(tmp_path / "store"))
    old, fresh = (
        store.put_bytes(b"{}", "jobs/aaaaaaaa/result.json"),
        store.put_bytes(b"{}", "jobs/bbbbbbbb/result.json"),
    )
    os.utime(store.local_path(old.key), (time.time() - 7200, time.time() - 7200))
    assert sweep(store) == 1
    assert store.list("jobs") == [fresh.key]
