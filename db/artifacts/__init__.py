"""The second half of the storage layer, beside the database: the artifact store, addressed by URL: where run
files (checkpoints, exports, bundles) and uploaded datasets live so that every host of a team can reach them.

    store = open_store()                       # $TORCHDECK_ARTIFACTS, default $TORCHDECK_HOME/artifacts
    obj = store.put_file("/tmp/model.onnx", "runs/ab12/export/model.onnx")
    with store.open("runs/ab12/export/model.onnx") as f: ...
    store.delete_prefix("runs/ab12")

URLs: a plain path or `file:///…` (a local or shared folder: the default, and the fast path —
a run directory inside it is never copied), or `s3://bucket/prefix` (any S3-compatible service
through fsspec/s3fs; credentials from the standard AWS variables — AWS_ACCESS_KEY_ID,
AWS_SECRET_ACCESS_KEY, AWS_SESSION_TOKEN, AWS_REGION/AWS_DEFAULT_REGION, AWS_PROFILE — and the
endpoint of MinIO, Ceph or moto from TORCHDECK_S3_ENDPOINT_URL).

Keys are relative POSIX paths (`runs/<run_id>/export/model.onnx`); a key with `..`, `.`, an empty
part, a leading `/`, a backslash, a drive letter or a control character is refused (BadKey), so a
key can never name anything outside the store.

`put_file`/`put_bytes` replace an object by default (checkpoints, job answers); with `overwrite=False`
they raise KeyExists instead and leave what is stored untouched: the files behind artifact ids
(exports) are written that way, so an artifact id never serves other bytes than those it was
registered with.
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from urllib.parse import urlparse

from db.artifacts.base import (
    CHUNK,
    ENDPOINT_ENV,
    ENV,
    ArtifactStore,
    BadKey,
    KeyExists,
    StoreCheck,
    StoredObject,
    StoreError,
    VerifiedReader,
    check_key,
    file_sha256,
)
from db.artifacts.local import LocalStore
from db.artifacts.s3 import S3Store
from db.engine import data_home

__all__ = [
    "CHUNK",
    "ENDPOINT_ENV",
    "ENV",
    "ArtifactStore",
    "BadKey",
    "KeyExists",
    "LocalStore",
    "S3Store",
    "StoreCheck",
    "StoreError",
    "StoredObject",
    "VerifiedReader",
    "check_key",
    "default_url",
    "file_sha256",
    "is_local_url",
    "local_run_root",
    "open_store",
]


def default_url() -> str:
    return os.environ.get(ENV) or str(data_home() / "artifacts")


def is_local_url(url: str) -> bool:
    scheme = urlparse(url).scheme
    return scheme in ("", "file") or bool(re.match(r"^[A-Za-z]$", scheme))  # C:\… on Windows


def local_run_root(url: str | None = None) -> Path:
    """Where runs write their files on this host: the store's own folder when it is local (so nothing
    is copied), else $TORCHDECK_HOME/artifacts (uploaded to the store as the run goes)."""
    url = url or default_url()
    if is_local_url(url):
        return LocalStore(url).root
    root = data_home() / "artifacts"
    root.mkdir(parents=True, exist_ok=True)
    return root.resolve()


def open_store(url: str | None = None) -> ArtifactStore:
    """The store at `url` (default $TORCHDECK_ARTIFACTS, else $TORCHDECK_HOME/artifacts)."""
    url = url or default_url()
    if is_local_url(url):
        return LocalStore(url)
    scheme = urlparse(url).scheme
    if scheme in ("s3", "s3a"):
        return S3Store(url)
    raise StoreError(f"artifact store URL {url!r}: use a folder (or file:///folder) or s3://bucket/prefix")
