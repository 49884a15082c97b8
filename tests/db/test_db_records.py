"""Events, artifacts, workers and uploaded datasets."""

from __future__ import annotations

import math
import re

import pytest
from sqlalchemy import Engine

from db import repo
from db.types import EventInput


def test_events_are_polled_incrementally(engine: Engine) -> None:
    run = repo.create_run(engine, {})
    repo.append_events(
        engine,
        run.id,
        [
            EventInput("lifecycle", "info", "claimed by w1"),
            EventInput("diagnosis", "warning", "loss is flat", code="flat_loss", data={"slope": math.nan}),
        ],
    )
    first = repo.list_events(engine, run.id)
    assert [e.message for e in first] == ["claimed by w1", "loss is flat"]
    assert first[1].code == "flat_loss" and first[1].data == {"slope": "nan"}
    repo.append_events(engine, run.id, [EventInput("log", "error", "CUDA out of memory")])
    newer = repo.list_events(engine, run.id, after_id=first[-1].id)
    assert [e.message for e in newer] == ["CUDA out of memory"]
    assert [e.message for e in repo.list_events(engine, run.id, level="warning")] == ["loss is flat"]


def test_bad_events_are_refused(engine: Engine) -> None:
    run = repo.create_run(engine, {})
    with pytest.raises(ValueError, match="event level 'fatal'"):
        repo.append_events(engine, run.id, [EventInput("log", "fatal", "x")])
    assert repo.list_events(engine, run.id) == []


def test_artifacts_have_opaque_ids_and_keep_their_details(engine: Engine) -> None:
    run = repo.create_run(engine, {})
    onnx = repo.add_artifact(
        engine,
        run.id,
        "onnx",
        "file:///data/runs/x/model.onnx",
        size=1234,
        sha256="ab" * 32,
        meta={"opset": 17, "max_abs_diff": 1e-6},
    )
    ckpt = repo.add_artifact(engine, run.id, "checkpoint", "file:///data/runs/x/last.pt")
    assert re.fullmatch(r"[0-9a-f]{32}", onnx.id) and onnx.id != ckpt.id
    assert "/" not in onnx.id and "model" not in onnx.id
    fetched = repo.get_artifact(engine, onnx.id)
    assert fetched == onnx and fetched.meta["opset"] == 17 and fetched.size == 1234
    assert [a.kind for a in repo.list_artifacts(engine, run.id)] == ["onnx", "checkpoint"]
    assert [a.id for a in repo.list_artifacts(engine, run.id, kind="checkpoint")] == [ckpt.id]
    with pytest.raises(repo.ArtifactNotFound, match="'nope'"):
        repo.get_artifact(engine, "nope")
    with pytest.raises(ValueError, match="sha256"):
        repo.add_artifact(engine, run.id, "onnx", "file:///x", sha256="short")


def test_workers_register_and_refresh(engine: Engine) -> None:
    first = repo.upsert_worker(
        engine, "gpu0@host", hostname="host", queues=["gpu"], devices=[{"name": "NVIDIA H100", "memory_gb": 80}]
    )
    run = repo.create_run(engine, {})
    again = repo.upsert_worker(engine, "gpu0@host", hostname="host", queues=["gpu"], current_run_id=run.id)
    assert again.started_at == first.started_at and again.heartbeat_at >= first.heartbeat_at
    assert again.current_run_id == run.id
    repo.upsert_worker(engine, "cpu@host", hostname="host", queues=["cpu"])
    workers = repo.list_workers(engine)
    assert [w.id for w in workers] == ["cpu@host", "gpu0@host"]
    assert workers[1].queues == ("gpu",)
    assert repo.remove_worker(engine, "cpu@host") and not repo.remove_worker(engine, "cpu@host")


def test_datasets_crud(engine: Engine) -> None:
    made = repo.create_dataset(engine, "flowers", "file:///data/uploads/flowers.zip")
    assert made.status == "pending" and made.classes == ()
    with pytest.raises(ValueError, match="already exists"):
        repo.create_dataset(engine, "flowers", "file:///elsewhere")
    ready = repo.update_dataset(
        engine, made.id, status="ready", classes=["daisy", "rose"], counts={"train": 80, "val": 20}
    )
    assert ready.status == "ready" and ready.classes == ("daisy", "rose") and ready.counts["val"] == 20
    broken = repo.create_dataset(engine, "broken", "file:///data/uploads/broken.zip")
    repo.update_dataset(engine, broken.id, status="failed", error="no class folders in the zip")
    assert repo.get_dataset(engine, broken.id).error == "no class folders in the zip"
    assert [d.name for d in repo.list_datasets(engine)] == ["broken", "flowers"]
    assert [d.name for d in repo.list_datasets(engine, status="ready")] == ["flowers"]
    assert repo.delete_dataset(engine, broken.id) == "file:///data/uploads/broken.zip"
    with pytest.raises(repo.DatasetNotFound):
        repo.get_dataset(engine, broken.id)
    with pytest.raises(ValueError, match="dataset status 'done'"):
        repo.update_dataset(engine, made.id, status="done")
