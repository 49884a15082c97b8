"""A folder as the artifact store (local, or shared between hosts)."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import BinaryIO
from urllib.parse import unquote, urlparse

from db.artifacts.base import (
    ArtifactStore,
    BadKey,
    KeyExists,
    StoredObject,
    StoreError,
    atomic_file,
    check_key,
    copy_hashing,
    file_sha256,
)


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

    def put_file(self, local: str | Path, key: str, *, overwrite: bool = True) -> StoredObject:
        dest = self._path(key)
        if Path(local).resolve() == dest.resolve():  # the fast path: already in place, only describe it
            size, digest = file_sha256(dest)
            return StoredObject(key, self.uri(key), size, digest)
        return super().put_file(local, key, overwrite=overwrite)

    def _write_stream(self, src: BinaryIO, key: str, overwrite: bool = True) -> tuple[int, str]:
        try:
            with atomic_file(self._path(key), exclusive=not overwrite) as out:
                return copy_hashing(src, out)
        except FileExistsError:
            raise KeyExists(self.url, key) from None

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
        return (
            f"make {self.root} writable by this user (or point TORCHDECK_ARTIFACTS at a folder it can write, "
            "or at s3://bucket/prefix)"
        )
