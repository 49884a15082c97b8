"""db.artifacts against a local folder and against a real S3 endpoint (moto's server)."""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

import pytest

from db.artifacts import (
    BadKey,
    KeyExists,
    LocalStore,
    S3Store,
    StoreError,
    check_key,
    local_run_root,
    open_store,
)


@pytest.fixture(params=("local", "s3"))
def store(request, tmp_path, monkeypatch):
    monkeypatch.setenv("TORCHDECK_HOME", str(tmp_path / "home"))
    if request.param == "local":
        return open_store(str(tmp_path / "store"))
    s3 = request.getfixturevalue("s3_artifacts")
    return open_store(s3.url)


def test_put_get_stream_exists_delete(store, tmp_path):
    src = tmp_path / "model.onnx"
    data = os.urandom(3 << 20) + b"tail"
    src.write_bytes(data)
    obj = store.put_file(src, "runs/r1/export/model.onnx")
    assert obj.size == len(data) and obj.sha256 == hashlib.sha256(data).hexdigest()
    assert obj.key == "runs/r1/export/model.onnx" and store.key_of(obj.uri) == obj.key
    assert store.exists("runs/r1/export/model.onnx") and not store.exists("runs/r1/export")
    assert store.size(obj.key) == len(data) and store.modified(obj.key) is not None
    with store.open(obj.key) as f:  # streamed in pieces
        first = f.read(1000)
        rest = f.read()
    assert first + rest == data
    out = store.get_file(obj.key, tmp_path / "down" / "m.onnx")
    assert out.read_bytes() == data and [p.name for p in out.parent.iterdir()] == ["m.onnx"]  # no temp left over

    store.put_bytes(b"{}", "runs/r1/export/export.json")
    store.put_bytes(b"ck", "runs/r1/checkpoints/last.pt")
    store.put_bytes(b"other", "runs/r10/checkpoints/last.pt")  # shares the prefix text, not the folder
    assert store.list("runs/r1") == [
        "runs/r1/checkpoints/last.pt",
        "runs/r1/export/export.json",
        "runs/r1/export/model.onnx",
    ]
    assert store.delete("runs/r1/export/export.json") and not store.delete("runs/r1/export/export.json")
    assert store.delete_prefix("runs/r1") == 2
    assert store.list("runs") == ["runs/r10/checkpoints/last.pt"]
    assert store.delete_prefix("runs/nothing") == 0
    with pytest.raises(FileNotFoundError):
        store.open("runs/r1/export/model.onnx").read()


def test_put_replaces_whole_objects(store, tmp_path):
    store.put_bytes(b"a" * 100, "runs/x/last.pt")
    store.put_bytes(b"b" * 10, "runs/x/last.pt")
    assert store.read_bytes("runs/x/last.pt") == b"b" * 10


def test_put_without_overwrite_never_replaces_a_stored_key(store, tmp_path):
    """The files behind artifact ids are written with overwrite=False: a second write of the key is refused and
    the first bytes stay, whether through put_bytes or put_file, in a folder or a bucket."""
    first = store.put_bytes(b"first" * 1000, "runs/x/exports/t1/model.onnx", overwrite=False)
    (tmp_path / "other.onnx").write_bytes(b"second")
    with pytest.raises(KeyExists, match="exists already and is never overwritten"):
        store.put_bytes(b"second", first.key, overwrite=False)
    with pytest.raises(KeyExists):
        store.put_file(tmp_path / "other.onnx", first.key, overwrite=False)
    assert store.read_bytes(first.key) == b"first" * 1000
    assert hashlib.sha256(store.read_bytes(first.key)).hexdigest() == first.sha256
    assert store.list("runs/x") == [first.key]  # no temporary file or placeholder left behind


def test_a_failed_exclusive_write_leaves_the_key_free(store):
    class Broken:
        def read(self, n=-1):
            raise OSError("disk went away")

    with pytest.raises(OSError, match="disk went away"):
        store._write_stream(Broken(), "runs/x/exports/t1/model.onnx", overwrite=False)
    assert not store.exists("runs/x/exports/t1/model.onnx")
    store.put_bytes(b"ok", "runs/x/exports/t1/model.onnx", overwrite=False)
    assert store.read_bytes("runs/x/exports/t1/model.onnx") == b"ok"


def test_exclusive_writers_racing_for_one_key_leave_exactly_one_file(tmp_path):
    """O_EXCL claims the name: of many writers at once exactly one wins, and the file holds its bytes whole."""
    import threading

    store = open_store(str(tmp_path / "store"))
    start, won, refused = threading.Barrier(8), [], []

    def write(i: int) -> None:
        start.wait()
        try:
            won.append(store.put_bytes(bytes([i]) * 200_000, "runs/x/exports/t/model.onnx", overwrite=False))
        except KeyExists:
            refused.append(i)

    threads = [threading.Thread(target=write, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert len(won) == 1 and len(refused) == 7
    assert hashlib.sha256(store.read_bytes(won[0].key)).hexdigest() == won[0].sha256


BAD_KEYS = [
    "",
    "/etc/passwd",
    "../x",
    "runs/../../etc/passwd",
    "runs/./x",
    "runs//x",
    "runs\\x",
    "C:/x",
    "s3://other/x",
    "runs/x\x00",
    "runs/..",
    "a/b/../c",
]


@pytest.mark.parametrize("key", BAD_KEYS)
def test_bad_keys_are_refused(key):
    with pytest.raises(BadKey):
        check_key(key)


def test_every_method_refuses_bad_keys(store, tmp_path):
    (tmp_path / "f").write_bytes(b"x")
    for key in ("../escape", "/abs", "a\\b"):
        for call in (
            lambda k: store.put_file(tmp_path / "f", k),
            lambda k: store.put_bytes(b"x", k),
            store.open,
            store.exists,
            store.delete,
            store.delete_prefix,
            store.uri,
            lambda k: store.get_file(k, tmp_path / "g"),
        ):
            with pytest.raises(BadKey):
                call(key)
    assert not (tmp_path / "escape").exists() and not (tmp_path / "g").exists()


def test_key_of_only_accepts_this_store(store):
    assert store.key_of(store.uri("runs/a/b.pt")) == "runs/a/b.pt"
    assert store.key_of("file:///etc/passwd") is None
    assert store.key_of("s3://another-bucket/torchdeck/runs/a/b.pt") is None
    assert store.key_of(store.url + "/runs/../../x") is None


def test_check_passes_and_leaves_nothing(store):
    result = store.check()
    assert result.ok, str(result)
    assert "write, read and delete work" in result.message
    assert store.list("") == []


def test_check_reports_an_unwritable_local_store(tmp_path):
    if os.geteuid() == 0:
        blocker = tmp_path / "a-file"  # root may write anywhere: a store "folder" that is a file fails too
        blocker.write_text("x")
        store = open_store(str(blocker / "artifacts"))
    else:
        ro = tmp_path / "ro"
        ro.mkdir()
        ro.chmod(0o500)
        store = open_store(str(ro / "artifacts"))
    result = store.check()
    assert not result.ok
    assert "cannot write" in result.message and "writable" in result.fix


def test_check_reports_a_missing_bucket_and_a_dead_endpoint(moto_s3, monkeypatch):
    for k, v in moto_s3.env().items():
        monkeypatch.setenv(k, v)
    result = open_store("s3://no-such-bucket-here/x").check()
    assert not result.ok and "create the bucket 'no-such-bucket-here'" in result.fix
    from tests._servers import free_port

    monkeypatch.setenv("TORCHDECK_S3_ENDPOINT_URL", f"http://127.0.0.1:{free_port()}")
    result = open_store("s3://whatever/x").check()
    assert not result.ok and "reachable" in result.fix, str(result)


def test_a_dead_endpoint_is_told_apart_from_a_refusal_whatever_its_port():
    """A connection error's message holds the endpoint's port: port 40393 is not an HTTP 403."""
    from botocore.exceptions import ClientError, EndpointConnectionError

    store = S3Store("s3://bucket/x")
    dead = EndpointConnectionError(endpoint_url="http://127.0.0.1:40393/bucket/x/probe")
    assert "reachable" in store._fix(dead)
    refused = ClientError({"Error": {"Code": "403", "Message": "Forbidden"}}, "PutObject")
    assert "AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY" in store._fix(refused)


def test_urls_and_local_fast_path(tmp_path, monkeypatch):
    monkeypatch.setenv("TORCHDECK_HOME", str(tmp_path / "home"))
    monkeypatch.delenv("TORCHDECK_ARTIFACTS", raising=False)
    default = open_store()
    assert (
        isinstance(default, LocalStore) and default.local_path("k") == (tmp_path / "home" / "artifacts" / "k").resolve()
    )
    assert isinstance(open_store((tmp_path / "s").as_uri()), LocalStore)
    assert isinstance(open_store("s3://bucket/prefix"), S3Store)
    with pytest.raises(StoreError):
        open_store("ftp://host/x")
    with pytest.raises(StoreError):
        open_store("s3:///nobucket")
    assert local_run_root("s3://bucket/p") == (tmp_path / "home" / "artifacts").resolve()
    assert local_run_root(str(tmp_path / "s")) == (tmp_path / "s").resolve()

    store = open_store(str(tmp_path / "s"))
    inside = store.local_path("runs/r/export/model.onnx")
    inside.parent.mkdir(parents=True)
    inside.write_bytes(b"onnx")
    before = inside.stat().st_ino
    assert store.key_for_local(inside) == "runs/r/export/model.onnx"
    obj = store.put_file(inside, "runs/r/export/model.onnx")  # already in place: described, not copied
    assert inside.stat().st_ino == before and obj.sha256 == hashlib.sha256(b"onnx").hexdigest()
    assert obj.uri == inside.as_uri()
    assert store.key_for_local(tmp_path / "elsewhere.txt") is None
    outside = Path(tmp_path / "s" / "runs" / "link")
    outside.symlink_to(tmp_path)
    assert store.key_for_local(outside / "elsewhere.txt") is None  # a link out of the store is not in it
