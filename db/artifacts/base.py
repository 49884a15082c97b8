"""The artifact store's interface and what every store shares: keys, errors, hashing, atomic files."""

from __future__ import annotations

import hashlib
import io
import os
import re
import secrets
import shutil
import socket
import tempfile
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

ENV = "TORCHDECK_ARTIFACTS"
ENDPOINT_ENV = "TORCHDECK_S3_ENDPOINT_URL"
CHUNK = 8 << 20
_BAD_CHARS = re.compile(r"[\x00-\x1f\x7f\\]")


class BadKey(ValueError):
    """A key that could name something outside the store."""


class StoreError(RuntimeError):
    """The store cannot be reached or used; the message says what to fix."""


class KeyExists(FileExistsError):
    """A put with overwrite=False found the key taken: what is stored there is left as it is."""

    def __init__(self, url: str, key: str):
        super().__init__(
            f"artifact store {url}: {key} exists already and is never overwritten (an artifact id "
            "keeps its bytes): write the new file under a new key"
        )
        self.key = key


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
        raise BadKey(
            f"artifact key {key!r} is refused: keys are relative paths such as runs/<id>/model.onnx "
            "(no leading '/', backslash, drive letter, URL or control character)"
        )
    parts = k.split("/")
    if any(p in ("", ".", "..") for p in parts):
        raise BadKey(f"artifact key {key!r} is refused: '..', '.' and empty path parts are not allowed")
    return k


class ArtifactStore:
    """Common interface of the local and object stores."""

    url: str
    is_local: bool = False

    # -- to implement ------------------------------------------------------------------------------
    def _write_stream(self, src: BinaryIO, key: str, overwrite: bool = True) -> tuple[int, str]: ...
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

    def put_file(self, local: str | Path, key: str, *, overwrite: bool = True) -> StoredObject:
        """Store a local file under key (replacing it atomically; with overwrite=False, KeyExists when the key
        is taken, checked by the write itself, so two writers never both succeed). The file is read once:
        its size and sha256 describe exactly the bytes stored, even if it is replaced on disk meanwhile."""
        key = check_key(key)
        with open(local, "rb") as src:
            size, digest = self._write_stream(src, key, overwrite)
        return StoredObject(key, self.uri(key), size, digest)

    def put_bytes(self, data: bytes, key: str, *, overwrite: bool = True) -> StoredObject:
        import io

        key = check_key(key)
        size, digest = self._write_stream(io.BytesIO(data), key, overwrite)
        return StoredObject(key, self.uri(key), size, digest)

    def get_file(self, key: str, local: str | Path) -> Path:
        """Copy key to a local file (written to a temporary name, then renamed: never half a file)."""
        key = check_key(key)
        dest = Path(local)
        with self.open(key) as src, atomic_file(dest) as out:
            shutil.copyfileobj(src, out, CHUNK)
        return dest

    def read_bytes(self, key: str) -> bytes:
        with self.open(key) as f:
            return f.read()

    def check(self) -> StoreCheck:
        """Write, read back and delete a small probe: can this host use the store? Never raises."""
        key = f".torchdeck-check/{socket.gethostname()}-{os.getpid()}-{secrets.token_hex(4)}"
        probe = secrets.token_bytes(64)
        step = "write to"
        try:
            self.put_bytes(probe, key)
            step = "read back from"
            if self.read_bytes(key) != probe:
                return StoreCheck(
                    False,
                    self.url,
                    f"artifact store {self.url}: a probe read back differs from what was written",
                    "check the storage service's health",
                )
            step = "delete from"
            self.delete(key)
        except Exception as e:  # noqa: BLE001 - reported, never raised
            return StoreCheck(
                False,
                self.url,
                f"artifact store {self.url}: cannot {step} it ({e.__class__.__name__}: {short_error(e)})",
                self._fix(e),
            )
        return StoreCheck(True, self.url, f"artifact store {self.url}: write, read and delete work")

    def _fix(self, e: Exception) -> str:
        return "set TORCHDECK_ARTIFACTS to a folder or s3://bucket/prefix this host can write"

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.url!r})"


@contextmanager
def atomic_file(dest: Path, *, exclusive: bool = False) -> Iterator[BinaryIO]:
    """A file to write `dest` through: a temporary name in its folder, renamed over `dest` when the block
    ends without error (never half a file), removed otherwise. exclusive: FileExistsError when `dest`
    exists, before anything is written; its name is claimed first (O_EXCL, atomic), so of two writers
    only one gets it and an existing file is never replaced."""
    dest.parent.mkdir(parents=True, exist_ok=True)
    if exclusive:
        os.close(os.open(dest, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600))
    tmp = None
    try:
        fd, tmp = tempfile.mkstemp(prefix=f".{dest.name}.", dir=dest.parent)
        with os.fdopen(fd, "wb") as out:
            yield out
        os.replace(tmp, dest)
    except BaseException:
        if tmp is not None:
            Path(tmp).unlink(missing_ok=True)
        if exclusive:
            dest.unlink(missing_ok=True)  # the empty name this writer claimed: nobody else's file
        raise


def short_error(e: Exception) -> str:
    text = str(e).strip().splitlines()
    return (text[0] if text else "")[:300]


def copy_hashing(src: BinaryIO, dst: BinaryIO) -> tuple[int, str]:
    h, size = hashlib.sha256(), 0
    while chunk := src.read(CHUNK):
        h.update(chunk)
        dst.write(chunk)
        size += len(chunk)
    return size, h.hexdigest()


class VerifiedReader(io.RawIOBase):
    """A stored file read through, checked against what was recorded of it (size, sha256): each byte is
    hashed as it is handed out, and the read that reaches the recorded size or the end raises
    mismatch(why) instead of returning when the bytes differ, as does a read past the recorded size.
    So a caller never gets a whole file that is not the recorded one, and nothing is held twice: the
    hash is updated from the very buffers returned. Not seekable. Unknown size or sha256: not checked."""

    def __init__(self, raw: BinaryIO, size: int | None, sha256: str | None, mismatch: Callable[[str], Exception]):
        super().__init__()
        self._raw, self._size, self._sha256, self._mismatch = raw, size, sha256, mismatch
        self._hash, self._seen, self._done, self._failed = hashlib.sha256(), 0, False, None

    def readable(self) -> bool:
        return True

    def read(self, size: int | None = -1) -> bytes:
        if self._failed is not None:
            raise self._failed
        whole = size is None or size < 0
        if size == 0:
            return b""
        data = self._raw.read() if whole else self._raw.read(size)
        self._hash.update(data)
        self._seen += len(data)
        if self._size is not None and self._seen > self._size:
            self._fail(f"it has more than the {self._size} bytes stored")
        if whole or not data or self._seen == self._size:
            self._verify()
        return data

    def readall(self) -> bytes:
        return self.read(-1)

    def readinto(self, buffer) -> int:
        data = self.read(len(buffer))
        buffer[: len(data)] = data
        return len(data)

    def _verify(self) -> None:
        if self._done:
            return
        self._done = True
        if self._size is not None and self._seen != self._size:
            self._fail(f"{self._seen} bytes ≠ {self._size} stored")
        digest = self._hash.hexdigest()
        if self._sha256 and digest != self._sha256:
            self._fail(f"sha256 {digest} ≠ {self._sha256}")

    def _fail(self, why: str) -> None:
        self._failed = self._mismatch(why)
        raise self._failed

    def close(self) -> None:
        if not self.closed:
            self._raw.close()
        super().close()


def file_sha256(path: str | Path) -> tuple[int, str]:
    h, size = hashlib.sha256(), 0
    with open(path, "rb") as f:
        while chunk := f.read(CHUNK):
            h.update(chunk)
            size += len(chunk)
    return size, h.hexdigest()
