"""The artifact store, addressed by URL: where run files (checkpoints, exports, bundles) and
uploaded datasets live so that every host of a team can reach them.

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
"""

from __future__ import annotations

import hashlib
import os
import re
import secrets
import shutil
import socket
import tempfile
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO
from urllib.parse import unquote, urlparse

from db.engine import data_home

ENV = "TORCHDECK_ARTIFACTS"
ENDPOINT_ENV = "TORCHDECK_S3_ENDPOINT_URL"
CHUNK = 8 << 20
_BAD_CHARS = re.compile(r"[\x00-\x1f\x7f\\]")


class BadKey(ValueError):
    """A key that could name something outside the store."""


class StoreError(RuntimeError):
    """The store cannot be reached or used; the message says what to fix."""


@dataclass(frozen=True)
class StoredObject:
    key: str
    uri: str
    size: int
    sha256: str


@dataclass(frozen=True)
class StoreCheck:
    """The result of ArtifactStore.check(): ok, or what is wrong and how to fix it."""

    ok: bool
    url: str
    message: str
    fix: str = ""

    def __str__(self) -> str:
        return self.message + (f" — fix: {self.fix}" if self.fix else "")


def check_key(key: str, *, prefix: bool = False) -> str:
    """The key itself when it is a safe relative path; BadKey otherwise."""
    if not isinstance(key, str) or not key:
        raise BadKey("an artifact key must be a non-empty string")
    k = key.rstrip("/") if prefix else key
    if k.startswith("/") or _BAD_CHARS.search(k) or re.match(r"^[A-Za-z]:", k) or "://" in k:
        raise BadKey(f"artifact key {key!r} is refused: keys are relative paths such as runs/<id>/model.onnx "
                     "(no leading '/', backslash, drive letter, URL or control character)")
    parts = k.split("/")
    if any(p in ("", ".", "..") for p in parts):
        raise BadKey(f"artifact key {key!r} is refused: '..', '.' and empty path parts are not allowed")
    return k


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


class ArtifactStore:
    """Common interface of the local and object stores."""

    url: str
    is_local: bool = False

    # -- to implement ------------------------------------------------------------------------------
    def _write_stream(self, src: BinaryIO, key: str) -> tuple[int, str]: ...
    def open(self, key: str) -> BinaryIO: ...
    def exists(self, key: str) -> bool: ...
    def size(self, key: str) -> int: ...
    def modified(self, key: str) -> float | None: ...
    def delete(self, key: str) -> bool: ...
    def delete_prefix(self, prefix: str) -> int: ...
    def list(self, prefix: str = "") -> list[str]: ...
    def uri(self, key: str) -> str: ...
    def key_of(self, uri: str) -> str | None: ...

    # -- shared --------------------------------------------------------------------------------------
    def local_path(self, key: str) -> Path | None:
        """The file of `key` on this host, for a local store; None for an object store."""
        return None

    def key_for_local(self, path: str | Path) -> str | None:
        """The key of a local file already inside the store (the no-copy fast path), else None."""
        return None

    def put_file(self, local: str | Path, key: str) -> StoredObject:
        """Store a local file under key (replacing it atomically). The file is read once: its size and
        sha256 describe exactly the bytes stored, even if it is replaced on disk meanwhile."""
        key = check_key(key)
        with open(local, "rb") as src:
            size, digest = self._write_stream(src, key)
        return StoredObject(key, self.uri(key), size, digest)

    def put_bytes(self, data: bytes, key: str) -> StoredObject:
        import io

        key = check_key(key)
        size, digest = self._write_stream(io.BytesIO(data), key)
        return StoredObject(key, self.uri(key), size, digest)

    def get_file(self, key: str, local: str | Path) -> Path:
        """Copy key to a local file (written to a temporary name, then renamed: never half a file)."""
        key = check_key(key)
        dest = Path(local)
        dest.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=f".{dest.name}.", dir=dest.parent)
        try:
            with self.open(key) as src, os.fdopen(fd, "wb") as out:
                shutil.copyfileobj(src, out, CHUNK)
            os.replace(tmp, dest)
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise
        return dest

    def read_bytes(self, key: str) -> bytes:
        with self.open(key) as f:
            return f.read()

    def iter_chunks(self, key: str, chunk_size: int = 1 << 20) -> Iterator[bytes]:
        with self.open(key) as f:
            while chunk := f.read(chunk_size):
                yield chunk

    def check(self) -> StoreCheck:
        """Write, read back and delete a small probe: can this host use the store? Never raises."""
        key = f".torchdeck-check/{socket.gethostname()}-{os.getpid()}-{secrets.token_hex(4)}"
        probe = secrets.token_bytes(64)
        step = "write to"
        try:
            self.put_bytes(probe, key)
            step = "read back from"
            if self.read_bytes(key) != probe:
                return StoreCheck(False, self.url, f"artifact store {self.url}: a probe read back differs from what "
                                  "was written", "check the storage service's health")
            step = "delete from"
            self.delete(key)
        except Exception as e:  # noqa: BLE001 - reported, never raised
            return StoreCheck(False, self.url, f"artifact store {self.url}: cannot {step} it "
                              f"({e.__class__.__name__}: {_short(e)})", self._fix(e))
        return StoreCheck(True, self.url, f"artifact store {self.url}: write, read and delete work")

    def _fix(self, e: Exception) -> str:
        return "set TORCHDECK_ARTIFACTS to a folder or s3://bucket/prefix this host can write"

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.url!r})"


def _short(e: Exception) -> str:
    text = str(e).strip().splitlines()
    return (text[0] if text else "")[:300]


def _copy_hashing(src: BinaryIO, dst: BinaryIO) -> tuple[int, str]:
    h, size = hashlib.sha256(), 0
    while chunk := src.read(CHUNK):
        h.update(chunk)
        dst.write(chunk)
        size += len(chunk)
    return size, h.hexdigest()


def file_sha256(path: str | Path) -> tuple[int, str]:
    h, size = hashlib.sha256(), 0
    with open(path, "rb") as f:
        while chunk := f.read(CHUNK):
            h.update(chunk)
            size += len(chunk)
    return size, h.hexdigest()


class LocalStore(ArtifactStore):
    """A folder on this host (or a shared mount)."""

    is_local = True

    def __init__(self, url: str):
        parsed = urlparse(url)
        raw = unquote(parsed.path) if parsed.scheme == "file" else url
        if parsed.scheme == "file" and parsed.netloc not in ("", "localhost"):
            raise StoreError(f"artifact store URL {url!r}: file URLs name a local folder (file:///path)")
        self.root = Path(raw).expanduser().absolute()
        self.url = url
        self._made = False

    def _ensure(self) -> Path:
        if not self._made:
            self.root.mkdir(parents=True, exist_ok=True)
            self.root = self.root.resolve()
            self._made = True
        return self.root

    def _path(self, key: str, *, prefix: bool = False) -> Path:
        return self._ensure().joinpath(*check_key(key, prefix=prefix).split("/"))

    def local_path(self, key: str) -> Path:
        return self._path(key)

    def key_for_local(self, path: str | Path) -> str | None:
        p = Path(path).resolve()
        root = self._ensure()
        if root not in p.parents:
            return None
        return check_key(p.relative_to(root).as_posix())

    def put_file(self, local: str | Path, key: str) -> StoredObject:
        dest = self._path(key)
        if Path(local).resolve() == dest.resolve():  # the fast path: already in place, only describe it
            size, digest = file_sha256(dest)
            return StoredObject(key, self.uri(key), size, digest)
        return super().put_file(local, key)

    def _write_stream(self, src: BinaryIO, key: str) -> tuple[int, str]:
        dest = self._path(key)
        dest.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=f".{dest.name}.", dir=dest.parent)
        try:
            with os.fdopen(fd, "wb") as out:
                result = _copy_hashing(src, out)
            os.replace(tmp, dest)
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise
        return result

    def open(self, key: str) -> BinaryIO:
        return open(self._path(key), "rb")

    def exists(self, key: str) -> bool:
        return self._path(key).is_file()

    def size(self, key: str) -> int:
        return self._path(key).stat().st_size

    def modified(self, key: str) -> float | None:
        return self._path(key).stat().st_mtime

    def delete(self, key: str) -> bool:
        p = self._path(key)
        if p.is_file():
            p.unlink()
            return True
        return False

    def delete_prefix(self, prefix: str) -> int:
        p = self._path(prefix, prefix=True)
        if p.is_file():
            p.unlink()
            return 1
        if not p.is_dir() or p.is_symlink():
            return 0
        n = sum(1 for f in p.rglob("*") if f.is_file())
        shutil.rmtree(p)
        return n

    def list(self, prefix: str = "") -> list[str]:
        base = self._path(prefix, prefix=True) if prefix else self._ensure()
        if base.is_file():
            return [base.relative_to(self.root).as_posix()]
        if not base.is_dir():
            return []
        return sorted(f.relative_to(self.root).as_posix() for f in base.rglob("*") if f.is_file())

    def uri(self, key: str) -> str:
        return self._path(key).as_uri()

    def key_of(self, uri: str) -> str | None:
        parsed = urlparse(uri)
        if parsed.scheme not in ("file", ""):
            return None
        try:
            return self.key_for_local(Path(unquote(parsed.path)))
        except BadKey:
            return None

    def _fix(self, e: Exception) -> str:
        return (f"make {self.root} writable by this user (or point TORCHDECK_ARTIFACTS at a folder it can write, "
                "or at s3://bucket/prefix)")


_FS_CACHE: dict[tuple, object] = {}
_FS_LOCK = threading.Lock()


class S3Store(ArtifactStore):
    """An S3-compatible bucket through s3fs (AWS, MinIO, Ceph, moto)."""

    def __init__(self, url: str):
        parsed = urlparse(url)
        if not parsed.netloc:
            raise StoreError(f"artifact store URL {url!r}: name a bucket (s3://bucket/prefix)")
        self.bucket = parsed.netloc
        self.prefix = parsed.path.strip("/")
        if self.prefix:
            check_key(self.prefix)
        self.url = f"s3://{self.bucket}" + (f"/{self.prefix}" if self.prefix else "")
        self.endpoint_url = os.environ.get(ENDPOINT_ENV) or None
        self._fs = None

    @property
    def fs(self):
        if self._fs is None:
            self._fs = self._make_fs(attempts=4)
        return self._fs

    def _make_fs(self, attempts: int):
        """One client per configuration and process (making one costs ~0.5 s); the configuration comes
        from the environment each time, so changed credentials or endpoint give a new client."""
        region = os.environ.get("AWS_REGION") or os.environ.get("AWS_DEFAULT_REGION") or "us-east-1"
        creds = tuple(os.environ.get(k) for k in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN",
                                                   "AWS_PROFILE"))
        token = (os.getpid(), self.endpoint_url, region, creds, attempts)
        with _FS_LOCK:
            fs = _FS_CACHE.get(token)
            if fs is None:
                fs = _FS_CACHE[token] = self._new_fs(attempts, region)
        return fs

    def _new_fs(self, attempts: int, region: str):
        try:
            import s3fs
        except ImportError as e:  # pragma: no cover - s3fs is a dependency
            raise StoreError("s3:// artifact stores need the s3fs package (pip install s3fs)") from e
        kwargs: dict = {"use_listings_cache": False, "skip_instance_cache": True,
                        "client_kwargs": {"region_name": region},
                        "config_kwargs": {"retries": {"max_attempts": attempts, "mode": "standard"},
                                          "connect_timeout": 10, "read_timeout": 120}}
        if self.endpoint_url:
            kwargs["endpoint_url"] = self.endpoint_url
        key, secret = os.environ.get("AWS_ACCESS_KEY_ID"), os.environ.get("AWS_SECRET_ACCESS_KEY")
        if key and secret:
            kwargs.update(key=key, secret=secret, token=os.environ.get("AWS_SESSION_TOKEN") or None)
        fs = s3fs.S3FileSystem(**kwargs)
        fs.retries = attempts  # s3fs's own retry loop (on top of botocore's)
        return fs

    def check(self) -> StoreCheck:
        """As ArtifactStore.check, without retrying: a doctor answers quickly."""
        fs, self._fs = self._fs, self._make_fs(attempts=1)
        try:
            return super().check()
        finally:
            self._fs = fs

    def _path(self, key: str, *, prefix: bool = False) -> str:
        k = check_key(key, prefix=prefix)
        return "/".join(filter(None, (self.bucket, self.prefix, k)))

    def _write_stream(self, src: BinaryIO, key: str) -> tuple[int, str]:
        # An S3 object appears whole when its (multipart) upload completes: readers never see half a file.
        out = self.fs.open(self._path(key), "wb")
        try:
            result = _copy_hashing(src, out)
        except BaseException:
            discard = getattr(out, "discard", None)  # abort the multipart upload: nothing is stored
            if discard is not None:
                discard()
            raise
        out.close()
        return result

    def open(self, key: str) -> BinaryIO:
        return self.fs.open(self._path(key), "rb", block_size=CHUNK)

    def exists(self, key: str) -> bool:
        return bool(self.fs.isfile(self._path(key)))

    def size(self, key: str) -> int:
        return int(self.fs.info(self._path(key))["size"])

    def modified(self, key: str) -> float | None:
        stamp = self.fs.info(self._path(key)).get("LastModified")
        return stamp.timestamp() if hasattr(stamp, "timestamp") else None

    def delete(self, key: str) -> bool:
        p = self._path(key)
        if not self.fs.isfile(p):
            return False
        self.fs.rm_file(p)
        return True

    def delete_prefix(self, prefix: str) -> int:
        base = self._path(prefix, prefix=True)
        found = self.fs.find(base + "/")
        if self.fs.isfile(base):
            found.append(base)
        if found:
            self.fs.rm(found)
        return len(found)

    def list(self, prefix: str = "") -> list[str]:
        base = self._path(prefix, prefix=True) if prefix else "/".join(filter(None, (self.bucket, self.prefix)))
        start = len("/".join(filter(None, (self.bucket, self.prefix)))) + 1
        return sorted(p[start:] for p in self.fs.find(base + "/"))

    def uri(self, key: str) -> str:
        return "s3://" + self._path(key)

    def key_of(self, uri: str) -> str | None:
        base = self.url + "/"
        if not uri.startswith(base):
            return None
        try:
            return check_key(uri[len(base):])
        except BadKey:
            return None

    def _fix(self, e: Exception) -> str:
        text = f"{e.__class__.__name__} {e}"
        if "NoSuchBucket" in text or "does not exist" in text.lower():
            return f"create the bucket {self.bucket!r} (or fix the bucket name in TORCHDECK_ARTIFACTS)"
        if any(s in text for s in ("AccessDenied", "Forbidden", "InvalidAccessKeyId", "SignatureDoesNotMatch", "403")):
            return "give AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY of a user allowed to read and write the bucket"
        if "NoCredentials" in text or "Unable to locate credentials" in text:
            return "set AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY (or AWS_PROFILE)"
        return (f"check that the S3 endpoint ({self.endpoint_url or 'AWS'}) is reachable from this host "
                f"({ENDPOINT_ENV} for MinIO or another S3-compatible service) and the credentials are right")
