"""The on-disk image cache: an image folder decoded and resized once, kept as one memory-mapped uint8 array per
(dataset content, part, mode, side, interpolation), shared by every run on this machine.

Where: `$TORCHDECK_IMAGE_CACHE` (`off` turns it off), else `image-cache/` in the data folder (`$TORCHDECK_HOME`,
default `./.torchdeck`). An entry is a folder named by its key, holding `images.u8` (N × C × side × side bytes,
row i the i-th file of the listing; an unreadable file's row stays zero) and `meta.json` (written last: an entry
without it is unfinished and never read). The key hashes the files' names, sizes and modification times (a zip:
its members' names, sizes and CRCs), so changed data gets a new entry and a run of other data never reads this
one; building an entry removes the older entries of the same folder and part. One builder at a time per key (a
lock file): a second run waits for it and reads what it built.

An entry is used as soon as it is built, while a thread writes it to the disk (`fsync`) and then marks it synced
(an empty file `synced`):
a process that dies loses nothing written (the kernel's page cache holds it), and an entry that was never synced
is read only during the boot that built it (a crash of the machine could have left zeros in it).
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import shutil
import threading
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import numpy as np

CACHE_ENV = "TORCHDECK_IMAGE_CACHE"
FORMAT = 1  # bump when the decoding changes what is stored
_META, _IMAGES, _LOCK, _SYNCED = "meta.json", "images.u8", ".lock", "synced"
_BUILDING, _REMOVING = ".building-", ".removing-"  # a folder being built or removed: never an entry


def cache_root() -> Path | None:
    """The cache's folder on this machine; None when `$TORCHDECK_IMAGE_CACHE` is `off`."""
    chosen = os.environ.get(CACHE_ENV, "").strip()
    if chosen.lower() in ("off", "0", "none", "false"):
        return None
    if chosen:
        return Path(chosen).expanduser()
    return Path(os.environ.get("TORCHDECK_HOME") or ".torchdeck").expanduser() / "image-cache"


@dataclass(frozen=True)
class CacheEntry:
    """One finished entry, as the Datasets page and `torchdeck cache` list it."""

    key: str
    folder: Path
    source: str  # the dataset's path
    part: str  # train, val, test (a folder of classes: train)
    mode: str  # L or RGB
    side: int
    images: int  # readable images stored
    files: int  # files listed (unreadable ones included)
    bytes: int  # on disk
    created: float  # Unix time
    last_used: float

    def to_dict(self) -> dict:
        return {k: (str(v) if isinstance(v, Path) else v) for k, v in self.__dict__.items()}


def fingerprint(stats: list[tuple[str, int, int]]) -> str:
    """A hash of (name, size, mtime or CRC) for every file: what the data is, not where it lies."""
    h = hashlib.sha256()
    for name, size, stamp in stats:
        h.update(f"{name}\0{size}\0{stamp}\n".encode())
    return h.hexdigest()


def entry_key(content: str, part: str, mode: str, side: int, interpolation: str) -> str:
    recipe = f"{FORMAT}|{content}|{part}|{mode}|{side}|{interpolation}"
    return hashlib.sha256(recipe.encode()).hexdigest()[:24]


@dataclass(frozen=True)
class Found:
    """A finished entry read back: its array (memory-mapped) and the rows of readable images, in file order."""

    images: np.ndarray  # uint8 (files, C, side, side), memory-mapped read-only
    good: np.ndarray  # int64 rows of the readable files
    skipped: list[str]  # the unreadable files, with why


def _meta(folder: Path) -> dict | None:
    try:
        return json.loads((folder / _META).read_text())
    except (OSError, ValueError):
        return None


def _open(folder: Path, meta: dict) -> Found:
    shape = tuple(meta["shape"])
    arr = np.memmap(folder / _IMAGES, dtype=np.uint8, mode="r", shape=shape) if shape[0] else np.zeros(shape, np.uint8)
    return Found(arr, np.asarray(meta["good"], dtype=np.int64), list(meta["skipped"]))


def _touch(folder: Path) -> None:
    try:
        os.utime(folder / _META)  # last used: the Datasets page lists entries by it
    except OSError:
        pass


@contextmanager
def _locked(root: Path, key: str) -> Iterator[None]:
    root.mkdir(parents=True, exist_ok=True)
    with open(root / f"{key}{_LOCK}", "a+b") as f:
        fcntl.flock(f, fcntl.LOCK_EX)  # released when the file closes, also when the process dies
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def _boot() -> str | None:
    """This boot of the machine (Linux), None elsewhere."""
    try:
        return Path("/proc/sys/kernel/random/boot_id").read_text().strip() or None
    except OSError:
        return None


def _sync(folder: Path) -> None:
    """Write the entry's images to the disk, then mark it synced (an empty file: the entry's size stays what it
    is). Everything goes through the folder opened once, so the mark lands beside the images it vouches for, even
    when the entry was removed and built again meanwhile. The thread runs at the lowest priority (Linux: a thread's
    own): the run's training goes first."""
    try:
        os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), 19)
    except (OSError, AttributeError):
        pass
    try:
        at = os.open(folder, os.O_RDONLY | os.O_DIRECTORY)
    except OSError:  # removed meanwhile (a newer entry, the Datasets page): nothing to keep
        return
    try:
        fd = os.open(_IMAGES, os.O_RDONLY, dir_fd=at)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
        os.stat(_META, dir_fd=at)
        os.close(os.open(_SYNCED, os.O_WRONLY | os.O_CREAT, 0o644, dir_fd=at))
    except OSError:  # removed meanwhile
        pass
    finally:
        os.close(at)


def _usable(folder: Path, meta: dict) -> bool:
    """Synced to the disk (or built before entries were synced in the background), or built during this boot (in the
    page cache still)."""
    boot = meta.get("boot")
    return boot is None or boot == _boot() or (folder / _SYNCED).exists()


def lookup(root: Path, key: str) -> Found | None:
    """A finished entry, or None."""
    folder = root / key
    meta = _meta(folder)
    if meta is not None and not _usable(folder, meta):
        return None
    if meta is None or not (folder / _IMAGES).exists() and meta["shape"][0]:
        return None
    _touch(folder)
    return _open(folder, meta)


def build(root: Path, key: str, describe: dict, shape: tuple[int, ...], fill) -> Found:
    """The entry `key`, built by `fill(path)` unless a finished one is there (another run may be building it: this
    waits for it). `fill` writes every row of the sized uint8 file at `path` (`shape`) and returns (rows of the
    readable files, the unreadable files with why); `describe` (source, part, mode, side, interpolation) goes into
    meta.json."""
    with _locked(root, key):
        found = lookup(root, key)
        if found is not None:
            return found
        tmp = root / f"{key}{_BUILDING}{os.getpid()}"
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir(parents=True)
        try:
            boot = _boot()
            if shape[0]:
                np.memmap(tmp / _IMAGES, dtype=np.uint8, mode="w+", shape=shape).flush()  # sized, zero-filled
                good, skipped = fill(tmp / _IMAGES)
                if boot is None:  # no way to tell a crash of the machine later: on the disk before it counts
                    fd = os.open(tmp / _IMAGES, os.O_RDONLY)
                    os.fsync(fd)
                    os.close(fd)
            else:
                good, skipped = np.zeros(0, np.int64), []
            meta = {
                "boot": boot if shape[0] else None,  # None: on the disk before it counted (no boot id), or empty
                **describe,
                "key": key,
                "shape": list(shape),
                "good": [int(i) for i in good],
                "skipped": skipped,
                "created": time.time(),
            }
            (tmp / _META).write_text(json.dumps(meta))
            _discard(root / key)
            tmp.rename(root / key)
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
        if meta["boot"] is not None:
            threading.Thread(target=_sync, args=(root / key,), name="image-cache-sync", daemon=True).start()
        _forget_older(root, key, describe)
        return _open(root / key, meta)


def _forget_older(root: Path, key: str, describe: dict) -> None:
    """The entries of the same folder and part at the same side and mode, built from data that has changed since."""
    same = ("source", "part", "mode", "side", "interpolation")
    for e in list_entries(root):
        if e.key != key and (meta := _meta(e.folder)) and all(meta.get(k) == describe.get(k) for k in same):
            _discard(e.folder)


def _discard(folder: Path) -> None:
    """Remove an entry's folder: renamed away first (no reader or builder finds a half-removed entry), removed again
    should the background sync have written its mark into it after the files went (the folder would stay)."""
    gone = folder.with_name(f"{folder.name}{_REMOVING}{uuid.uuid4().hex[:12]}")
    try:
        folder.rename(gone)
    except FileNotFoundError:
        return
    for _ in range(3):  # the sync writes one mark at most: a second pass finds it
        shutil.rmtree(gone, ignore_errors=True)
        if not gone.exists():
            return


def list_entries(root: Path | None = None) -> list[CacheEntry]:
    """The finished entries, the most recently used first."""
    root = cache_root() if root is None else root
    if root is None or not root.is_dir():
        return []
    out = []
    for folder in root.iterdir():
        unfinished = _BUILDING in folder.name or _REMOVING in folder.name
        meta = _meta(folder) if folder.is_dir() and not unfinished else None
        if meta is None:
            continue
        size = sum(f.stat().st_size for f in folder.iterdir() if f.is_file())
        out.append(
            CacheEntry(
                key=folder.name,
                folder=folder,
                source=str(meta.get("source", "")),
                part=str(meta.get("part", "train")),
                mode=str(meta.get("mode", "")),
                side=int(meta.get("side", 0)),
                images=len(meta.get("good", [])),
                files=int(meta.get("shape", [0])[0]),
                bytes=size,
                created=float(meta.get("created", 0.0)),
                last_used=(folder / _META).stat().st_mtime,
            )
        )
    return sorted(out, key=lambda e: e.last_used, reverse=True)


def remove_entry(key: str, root: Path | None = None) -> int:
    """Remove one entry (a run reading it keeps its open file until it ends); the bytes freed. KeyError when no
    finished entry has that key."""
    root = cache_root() if root is None else root
    found = [e for e in list_entries(root) if e.key == key] if root is not None else []
    if not found:
        raise KeyError(f"no image cache entry {key!r}")
    _discard(found[0].folder)
    (found[0].folder.parent / f"{key}{_LOCK}").unlink(missing_ok=True)
    return found[0].bytes


def clear(root: Path | None = None) -> int:
    """Remove every finished entry, and what a removal cut short left; the bytes freed."""
    root = cache_root() if root is None else root
    freed = sum(remove_entry(e.key, root) for e in list_entries(root))
    for left in root.glob(f"*{_REMOVING}*") if root is not None and root.is_dir() else []:
        shutil.rmtree(left, ignore_errors=True)
    return freed
