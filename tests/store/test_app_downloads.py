"""The app's artifact service: bytes by opaque artifact id only, from the local or S3 store; deleting a
run deletes its prefix in the store; uploaded datasets reach the store for workers on other hosts."""

from __future__ import annotations

import hashlib
import io
import re
import zipfile
from pathlib import Path

import pytest

from app import auth
from app.services.artifacts import (
    DOWNLOAD_PIECE,
    ArtifactChanged,
    ArtifactUnavailable,
    InvalidArtifactId,
    artifact_filename,
    artifact_problem,
    artifact_store,
    latest_by_kind,
    open_artifact,
    read_artifact,
)
from app.services.runs import remove
from core.config import RunSpec
from db.engine import make_engine
from db.migrate import upgrade
from db.repo import (
    ArtifactNotFound,
    add_artifact,
    create_run,
    finish_run,
    get_artifact,
    list_artifacts,
)


@pytest.fixture(params=("local", "s3"))
def env(request, tmp_path, monkeypatch):
    """A migrated SQLite database and TORCHDECK_ARTIFACTS as a local folder or an S3 bucket."""
    monkeypatch.setenv("TORCHDECK_HOME", str(tmp_path / "home"))
    url = f"sqlite:///{tmp_path / 'td.db'}"
    monkeypatch.setenv("TORCHDECK_DATABASE_URL", url)
    if request.param == "local":
        monkeypatch.setenv("TORCHDECK_ARTIFACTS", str(tmp_path / "artifacts"))
    else:
        request.getfixturevalue("s3_artifacts")
    upgrade(url)
    engine = make_engine(url)
    yield engine
    engine.dispose()


def _run_with_onnx(engine, data: bytes = b"\x08onnx-bytes" * 1000):
    run = create_run(engine, RunSpec().model_dump(mode="json"), name="r")
    store = artifact_store()
    obj = store.put_bytes(data, f"runs/{run.id}/export/model.onnx")
    art = add_artifact(engine, run.id, "onnx", obj.uri, size=obj.size, sha256=obj.sha256)
    return run, art, data


def test_download_by_artifact_id(env):
    _, art, data = _run_with_onnx(env)
    assert read_artifact(art.id, engine=env) == data
    record, f = open_artifact(art.id, engine=env)
    with f:
        assert f.read(5) == data[:5]
    assert artifact_filename(record) == "model.onnx"
    assert artifact_problem(record) is None


BAD_IDS = [
    "../model.onnx",
    "runs/x/model.onnx",
    "..",
    "/etc/passwd",
    "file:///etc/passwd",
    "a\\b",
    "%2e%2e%2f",
    "",
    " ",
    "x" * 65,
    "id\x00",
    None,
]


def test_path_like_ids_are_refused(env):
    _, art, _ = _run_with_onnx(env)
    for bad in [*BAD_IDS, f"{art.id}/../{art.id}", f"../{art.id}"]:
        with pytest.raises(InvalidArtifactId, match="not an artifact id"):
            read_artifact(bad, engine=env)


def test_unknown_id_is_refused(env):
    _run_with_onnx(env)
    with pytest.raises(ArtifactNotFound, match="not found"):
        read_artifact("0" * 32, engine=env)


def test_a_uri_outside_the_store_is_never_served(env, tmp_path):
    run, _, _ = _run_with_onnx(env)
    for uri in (
        "file:///etc/passwd",
        (tmp_path / "outside.bin").as_uri(),
        "s3://someone-elses-bucket/x/model.onnx",
        "https://example.com/model.onnx",
    ):
        (tmp_path / "outside.bin").write_bytes(b"secret")
        art = add_artifact(env, run.id, "onnx", uri)
        with pytest.raises(ArtifactUnavailable, match="cannot be downloaded here"):
            read_artifact(art.id, engine=env)
        assert artifact_problem(art) == "not on this machine nor in this installation's artifact store"


def test_a_missing_file_is_a_clear_error(env):
    run = create_run(env, RunSpec().model_dump(mode="json"))
    art = add_artifact(env, run.id, "onnx", artifact_store().uri(f"runs/{run.id}/export/gone.onnx"))
    with pytest.raises(ArtifactUnavailable, match="file is gone"):
        read_artifact(art.id, engine=env)


def test_remove_deletes_the_runs_prefix_in_the_store(env):
    run, _, _ = _run_with_onnx(env)
    other, _, _ = _run_with_onnx(env)
    store = artifact_store()
    store.put_bytes(b"ck", f"runs/{run.id}/checkpoints/last.pt")
    finish_run(env, run.id, "completed")
    remove(run.id, engine=env, by=auth.local_user())  # the run's owner in local mode
    assert store.list(f"runs/{run.id}") == []
    assert store.list(f"runs/{other.id}") == [f"runs/{other.id}/export/model.onnx"]


def _png(color: int) -> bytes:
    from PIL import Image

    buf = io.BytesIO()
    Image.new("L", (8, 8), color).save(buf, "PNG")
    return buf.getvalue()


def _imagefolder_zip() -> io.BytesIO:
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as zf:
        for cls, color in (("cat", 10), ("dog", 240)):
            for i in range(3):
                zf.writestr(f"pets/{cls}/{i}.png", _png(color + i))
    buf.seek(0)
    return buf


def test_uploaded_dataset_reaches_workers_on_other_hosts(env, tmp_path, monkeypatch):
    from app.services import datasets as ds
    from worker.artifacts import dataset_key, localize_dataset

    data = _imagefolder_zip()
    record = ds.store_upload(env, "pets", data, len(data.getvalue()), owner="local")
    store = artifact_store()
    shared = ds.shared_store() is not None  # local store under $TORCHDECK_HOME: workers read the folder itself
    folder = Path(record.uri).name  # pets-<token>: a folder (and a store key) of its own per upload
    assert store.exists(dataset_key(folder)) == shared
    spec = RunSpec.from_dict({"data": {"name": "imagefolder", "path": record.uri}})
    assert localize_dataset(spec, store, env) is spec  # the folder is here: used as is
    if shared:
        # Another host: a different $TORCHDECK_HOME, and the app's folder is not there.
        monkeypatch.setenv("TORCHDECK_HOME", str(tmp_path / "worker-host"))
        moved = tmp_path / "elsewhere"
        Path(record.uri).rename(moved)
        local = localize_dataset(spec, store, env)
        assert local.data.path == str(tmp_path / "worker-host" / "datasets" / ".store" / f"{folder}.zip")
        with zipfile.ZipFile(local.data.path) as zf:
            assert sorted(zf.namelist()) == [f"{c}/{i}.png" for c in ("cat", "dog") for i in range(3)]
        Path(moved).rename(record.uri)
    ds.remove(env, record.id, by=auth.local_user())
    assert not store.exists(dataset_key(folder))


def _trained_run(engine):
    """A finished run with its checkpoints in this host's run folder, trained by the real core (tiny)."""
    from core.events import MemorySink
    from core.train import run_training
    from worker.settings import WorkerSettings

    spec = RunSpec.from_dict(
        {
            "data": {"name": "synthetic", "num_classes": 3, "num_samples": 120, "size": 8, "channels": 1},
            "model": {"name": "simple_cnn", "hidden": 8},
            "train": {"epochs": 1, "batch_size": 32},
            "export": {"formats": []},
            "device": "cpu",
        }
    )
    run = create_run(engine, spec.model_dump(mode="json"))
    assert run_training(spec, WorkerSettings().run_dir(run.id), MemorySink())["status"] == "completed"
    finish_run(engine, run.id, "completed")
    return run


def test_export_now_registers_its_files_through_the_store(env, tmp_path):
    """The jobs worker's export (worker/export_job.py) registers each verified file as the training run does:
    through the sink, into the artifact store (local folder or bucket), downloadable by artifact id."""
    from worker.export_job import export

    run = _trained_run(env)
    result = export(run.id, "best", ["onnx"], "abcdef12")
    assert result["ok"] and result["added"] == ["onnx", "export_report", "bundle"], result
    arts = {a.kind: a for a in list_artifacts(env, run.id)}
    data = read_artifact(arts["onnx"].id, engine=env)
    import hashlib

    import onnx

    assert hashlib.sha256(data).hexdigest() == arts["onnx"].sha256 and onnx.load_model_from_string(data).graph.input
    key = artifact_store().key_of(arts["onnx"].uri)  # a folder of its own: runs/<id>/exports/<token>/
    assert re.fullmatch(rf"runs/{run.id}/{result['folder']}/model\.onnx", key) and result["folder"].startswith(
        "exports/"
    )
    assert arts["onnx"].meta["parity"]["passed"] is True


def test_a_second_export_never_changes_the_files_of_the_first(env):
    """Export again (other formats): new artifacts in a new folder; every artifact of the first export keeps its
    row, its file and its bytes, and is still downloadable by its id; the newest of each kind is the latest."""
    import json

    from worker.export_job import export

    run = _trained_run(env)
    assert export(run.id, "best", ["onnx", "torchscript"], "aaaaaaaa")["ok"]
    first = {a.kind: a for a in list_artifacts(env, run.id)}
    before = {kind: read_artifact(a.id, engine=env) for kind, a in first.items()}
    assert json.loads(before["export_report"])["requested_formats"] == ["onnx", "torchscript"]
    assert export(run.id, "last", ["onnx"], "bbbbbbbb")["ok"]
    after = list_artifacts(env, run.id)
    assert len(after) == 2 * 3 + 1  # onnx, export.json, bundle twice; the TorchScript file once
    latest = latest_by_kind(after)
    for kind, a in first.items():
        assert get_artifact(env, a.id) == a  # the row is untouched
        data = read_artifact(a.id, engine=env)  # and so are the bytes behind its id
        assert data == before[kind] and hashlib.sha256(data).hexdigest() == a.sha256 and len(data) == a.size
        if kind != "torchscript":
            assert latest[kind].id != a.id and latest[kind].uri != a.uri
    assert json.loads(read_artifact(latest["export_report"].id, engine=env))["requested_formats"] == ["onnx"]
    assert latest["torchscript"].id == first["torchscript"].id  # not made again: the earlier one stays the latest
    keys = artifact_store().list(f"runs/{run.id}/exports")
    assert len(keys) == 7 and len({k.split("/")[3] for k in keys}) == 2, keys  # two folders, nothing replaced


def test_a_file_changed_behind_its_artifact_id_is_refused(env):
    """The download re-hashes what it serves: bytes that are not the registered ones (same size or not) are
    refused with both hashes, whole or streamed, and served again once the stored bytes are back."""
    _, art, data = _run_with_onnx(env)
    store = artifact_store()
    key = store.key_of(art.uri)
    forged = data[:-5] + b"EVIL!"  # the same size: only the hash can tell
    store.put_bytes(forged, key)  # behind the artifact's back: its row still says the old sha256
    digest = hashlib.sha256(forged).hexdigest()
    message = f"artifact {art.id}'s file changed since it was stored: sha256 {digest} ≠ {art.sha256}"
    with pytest.raises(ArtifactChanged, match=re.escape(message)):
        read_artifact(art.id, engine=env)
    _, f = open_artifact(art.id, engine=env)
    served = b""
    with f, pytest.raises(ArtifactChanged, match=re.escape(message)):
        while chunk := f.read(1000):
            served += chunk
    assert len(served) < len(forged)  # the read that would complete the file raises instead
    store.put_bytes(data + b"more", key)  # grown: refused too, and seen without reading when the file is local
    with pytest.raises(ArtifactChanged, match="changed since it was stored"):
        read_artifact(art.id, engine=env)
    if store.local_path(key) is not None:
        assert artifact_problem(art).startswith("file changed since it was stored")
    store.put_bytes(data, key)
    assert read_artifact(art.id, engine=env) == data and artifact_problem(art) is None


def test_the_download_route_streams_from_the_store_and_never_completes_changed_bytes(env, monkeypatch):
    """app/web/downloads.py, on the local store and on a bucket: the bytes by id, piece by piece. Changed behind the
    id: a file on this host is refused before its first byte (409); a bucket's (not read twice) is hashed as it
    is sent, and the piece that would complete it raises instead: the download breaks off short."""
    import os

    from starlette.applications import Starlette
    from starlette.testclient import TestClient

    from app.web import downloads

    monkeypatch.delenv("TORCHDECK_MODE", raising=False)
    monkeypatch.setenv(downloads.SERVED_ENV, "0")  # routes() sets it: restored (unset) after the test
    _, art, data = _run_with_onnx(env, os.urandom(3 * DOWNLOAD_PIECE + 7))
    store = artifact_store()
    with TestClient(Starlette(routes=downloads.routes()), client=("127.0.0.1", 50000)) as client:
        assert client.get(downloads.url(art.id)).content == data
        store.put_bytes(data[:-5] + b"EVIL!", store.key_of(art.uri))
        if store.is_local:
            got = client.get(downloads.url(art.id))
            assert got.status_code == 409 and "changed since it was stored" in got.text
        else:
            with pytest.raises(ArtifactChanged, match="changed since it was stored"):
                client.get(downloads.url(art.id))
