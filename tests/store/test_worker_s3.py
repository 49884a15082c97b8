"""Runs executed by the real worker code path (worker.child.run_child in a spawned process, as a worker
runs them) with the artifact store in an S3 bucket (moto's server): a resumed attempt on another host
fetches its checkpoint from the bucket; the exports land in the bucket and download through the app's
service by artifact id; deleting the run empties its prefix."""

from __future__ import annotations

import hashlib
import multiprocessing as mp
import os
import time

import pytest
from sqlalchemy import update

from app.auth import local_user
from app.services.artifacts import read_artifact
from app.services.runs import remove
from core.config import RunSpec
from db.engine import make_engine
from db.migrate import upgrade
from db.models import Run
from db.repo import claim_run, create_run, get_run, list_artifacts, list_events

TINY = {
    "name": "s3-run",
    "data": {"name": "digits", "image_size": 8},
    "model": {"name": "simple_cnn", "hidden": 16},
    "train": {"epochs": 1, "batch_size": 64, "log_every": 5, "early_stopping": {"enabled": False}},
    "export": {"formats": ["onnx"], "parity_samples": 8},
    "device": "cpu",
    "seed": 0,
}


def _two_hosts(run_id: str, url: str, home_a: str, home_b: str, spec_b: dict) -> None:
    """Two attempts of a run the way workers make them (worker.child.run_child), in one spawned process so
    that torch is imported once: host A trains; the run is then given more epochs and lost (as if host A
    died); host B, with its own empty disk, claims and resumes it."""
    from worker.child import run_child

    engine = make_engine(url)
    os.environ["TORCHDECK_HOME"] = home_a
    assert claim_run(engine, run_id, "host-a") is not None
    run_child(run_id, "host-a", url)
    with engine.begin() as c:
        c.execute(update(Run).where(Run.id == run_id).values(status="lost", spec=spec_b))
    os.environ["TORCHDECK_HOME"] = home_b
    assert claim_run(engine, run_id, "host-b") is not None
    run_child(run_id, "host-b", url)


def test_resume_on_another_host_fetches_the_checkpoint_from_the_store(tmp_path, s3_artifacts, monkeypatch):
    url = f"sqlite:///{tmp_path / 'td.db'}"
    upgrade(url)
    engine = make_engine(url)
    monkeypatch.setenv("TORCHDECK_HEARTBEAT_S", "1")
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    spec = RunSpec.from_dict({**TINY, "export": {"formats": []}})
    run_id = create_run(engine, spec.model_dump(mode="json")).id
    more = RunSpec.from_dict({**TINY, "train": {**TINY["train"], "epochs": 2}})  # and an ONNX export at the end
    p = mp.get_context("spawn").Process(
        target=_two_hosts,
        args=(run_id, url, str(tmp_path / "host-a"), str(tmp_path / "host-b"), more.model_dump(mode="json")),
    )
    p.start()
    p.join(150)
    if p.is_alive():
        p.kill()
        pytest.fail("the two attempts did not finish in 150 s")
    assert p.exitcode == 0
    run = get_run(engine, run_id)
    assert run.status == "completed", run.error
    assert run.attempt == 2 and run.summary["epochs_run"] == 2
    events = list_events(engine, run_id)
    fetched = {e.message.split()[1] for e in events if e.code == "checkpoint_fetched"}
    assert fetched == {"last.pt", "best.pt"}
    assert any("training epochs 2..2" in e.message for e in events), [e.message for e in events]
    assert (tmp_path / "host-a" / "artifacts" / "runs" / run_id / "checkpoints" / "last.pt").stat().st_size > 0
    assert (tmp_path / "host-b" / "artifacts" / "runs" / run_id / "checkpoints" / "last.pt").is_file()
    last = [a for a in list_artifacts(engine, run_id) if a.kind == "checkpoint_last"][-1]
    assert last.meta.get("epoch") == 2 and last.uri.startswith(s3_artifacts.url)
    assert hashlib.sha256(read_artifact(last.id, engine=engine)).hexdigest() == last.sha256

    arts = {a.kind: a for a in list_artifacts(engine, run_id)}
    assert {"onnx", "export_report", "bundle", "checkpoint_last", "checkpoint_best", "sample_grid"} <= set(arts)
    for a in arts.values():
        assert a.uri.startswith(f"{s3_artifacts.url}/runs/{run_id}/"), a.uri
        assert a.size and len(a.sha256) == 64
    keys = s3_artifacts.keys(f"runs/{run_id}/")
    assert {
        f"runs/{run_id}/{k}"
        for k in (
            "export/model.onnx",
            "export/export.json",
            "export/bundle.zip",
            "checkpoints/last.pt",
            "checkpoints/best.pt",
            "samples.png",
        )
    } <= set(keys), keys
    # Downloaded through the app's service, by opaque id only: the very bytes that were registered.
    data = read_artifact(arts["onnx"].id, engine=engine)
    assert len(data) == arts["onnx"].size and hashlib.sha256(data).hexdigest() == arts["onnx"].sha256
    import onnx

    model = onnx.load_model_from_string(data)
    assert model.graph.input and model.graph.output
    assert arts["onnx"].meta.get("ok") is True  # the parity report travels with it
    # Deleting the run deletes its files in the bucket.
    remove(run_id, engine=engine, by=local_user())  # the run's owner in local mode
    assert s3_artifacts.keys(f"runs/{run_id}/") == []
    engine.dispose()


def test_fetch_checkpoints_prefers_the_newer_copy(tmp_path, s3_artifacts):
    from db.artifacts import open_store
    from worker.artifacts import fetch_checkpoints

    store = open_store(s3_artifacts.url)
    store.put_bytes(b"from the bucket", "runs/r1/checkpoints/last.pt")
    run_dir = tmp_path / "runs" / "r1"
    assert fetch_checkpoints(store, "r1", run_dir) == [run_dir / "checkpoints" / "last.pt"]
    assert (run_dir / "checkpoints" / "last.pt").read_bytes() == b"from the bucket"
    # This host went further than the bucket (its upload had not happened yet): its copy is kept.
    time.sleep(0.01)
    (run_dir / "checkpoints" / "last.pt").write_bytes(b"newer here")
    assert fetch_checkpoints(store, "r1", run_dir) == []
    assert (run_dir / "checkpoints" / "last.pt").read_bytes() == b"newer here"
