"""ImageFolder datasets from a folder or a .zip: one sub-folder per class.

Bad input is refused with a message that names the problem and the files:
missing path, not a zip, fewer than two classes, an empty class, too many
unreadable images. Mixed grayscale/RGB/RGBA images are converted to one mode.
"""

from __future__ import annotations

import io
import math
import time
import zipfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

import numpy as np
import torch

from core.cached_images import CachedImages
from core.decode import GRAY_MODES, ImageTooLarge, Source, decode, decode_files, processes
from core.image_cache import build, cache_root, entry_key, fingerprint
from core.names import IMAGE_EXTENSIONS

IMAGE_EXTS = frozenset(IMAGE_EXTENSIONS)
__all__ = ["ImageTooLarge", "decode"]  # the decoding itself is core/decode.py's


class DataError(ValueError):
    """A dataset that cannot be used, with what is wrong and how to fix it."""


class DataNotFoundError(DataError, FileNotFoundError):
    """The dataset's path does not exist (also a FileNotFoundError for callers that catch that)."""


def _is_hidden(parts: tuple[str, ...]) -> bool:
    return any(p.startswith(".") or p == "__MACOSX" for p in parts)


class LazyImages:
    """Images decoded per item (large folders); indexable like a uint8 (N, C, H, W) tensor."""

    def __init__(self, source: Source, files: list[str], mode: str, size: int, interpolation: str = "bilinear"):
        self.source, self.files, self.mode, self.size = source, files, mode, size
        self.interpolation = interpolation
        self.shape = (len(files), 1 if mode == "L" else 3, size, size)

    def __len__(self) -> int:
        return len(self.files)

    def __getitem__(self, i: int) -> torch.Tensor:
        return torch.from_numpy(decode(self.source.read(self.files[int(i)]), self.mode, self.size, self.interpolation))

    def subset(self, idx: np.ndarray) -> LazyImages:
        return LazyImages(self.source, [self.files[i] for i in idx], self.mode, self.size, self.interpolation)

    def sample_tensor(self, n: int, seed: int) -> torch.Tensor:
        idx = np.random.default_rng(seed).permutation(len(self))[:n]
        return torch.stack([self[i] for i in idx])


Entry = tuple[str, tuple[str, ...], bool]  # (member name, path parts, is a folder)


def _unwrap(entries: list[Entry]) -> list[Entry]:
    """A zip often wraps the classes in one top folder (dataset/cat/1.png): look inside it.
    Loose top-level files (README) do not stop this; a top folder holding images itself does."""
    while True:
        tops = {p[0] for _, p, is_dir in entries if is_dir or len(p) > 1}
        deeper = any(len(p) > 2 or (is_dir and len(p) > 1) for _, p, is_dir in entries)
        own_images = any(
            len(p) == 2 and not d and PurePosixPath(p[1]).suffix.lower() in IMAGE_EXTS for _, p, d in entries
        )
        if len(tops) != 1 or not deeper or own_images:
            return entries
        top = tops.pop()
        entries = [(n, p[1:], d) for n, p, d in entries if p[0] == top and len(p) > 1]


SPLIT_FOLDERS = ("train", "val", "test")  # <root>/train/<class>/…, optional <root>/val/…, <root>/test/…


def _split_layout(entries: list[Entry]) -> tuple[str, ...]:
    """The split folders of a train/ [val/] test/ layout, in SPLIT_FOLDERS' order; () for one folder of classes.
    Only when every top-level folder is a split's, train/ among them, and train/ holds class folders of images."""
    tops = {p[0] for _, p, d in entries if d or len(p) > 1}
    nested = any(len(p) >= 3 and p[0] == "train" and not d for _, p, d in entries)
    if "train" not in tops or not tops <= set(SPLIT_FOLDERS) or not nested:
        return ()
    return tuple(s for s in SPLIT_FOLDERS if s in tops)


def _in_part(entries: list[Entry], part: str | None, label: str) -> list[Entry]:
    """The entries of split folder `part` (train when None) of a split layout, as if it were the root;
    a folder of classes is its own train part and has no other."""
    parts = _split_layout(entries)
    if not parts:
        if part not in (None, "train"):
            raise DataError(f"{label} has no {part}/ folder (a split layout: <root>/train/<class>/…, <root>/{part}/…)")
        return entries
    part = part or "train"
    if part not in parts:
        raise DataError(f"{label} has no {part}/ folder beside {', '.join(p + '/' for p in parts)}")
    return [(n, p[1:], d) for n, p, d in entries if p[0] == part and len(p) > 1]


def _entries(source: Source) -> list[Entry]:
    entries = [(n, PurePosixPath(n).parts, n.endswith("/")) for n in source.names()]
    return _unwrap([e for e in entries if e[1] and not _is_hidden(e[1])])


def folder_parts(path: str) -> tuple[str, ...]:
    """The split folders (train, val, test) of an image folder or zip laid out that way; () for one of classes."""
    return _split_layout(_entries(_open(path)))


def _class_files(source: Source, label: str, part: str | None = None) -> dict[str, list[str]]:
    entries = _in_part(_entries(source), part, label)
    classes: dict[str, list[str]] = {}
    for name, p, is_dir in entries:
        if len(p) < 2 and not is_dir:
            continue  # files at the top level belong to no class
        files = classes.setdefault(p[0], [])
        if not is_dir and PurePosixPath(name).suffix.lower() in IMAGE_EXTS:
            files.append(name)
    if len(classes) < 2:
        raise DataError(
            f"{label}: an image folder needs at least 2 class sub-folders, found {len(classes)} "
            f"({', '.join(sorted(classes)) or 'none'}). Expected layout: <root>/<class>/<image>.png"
        )
    empty = sorted(c for c, f in classes.items() if not f)
    if empty:
        raise DataError(
            f"{label}: class folder(s) with no images: {', '.join(empty)} "
            f"(image files end in {', '.join(sorted(IMAGE_EXTS))}); add images or remove the folder(s)"
        )
    return {c: sorted(classes[c]) for c in sorted(classes)}


def folder_classes(path: str, part: str | None = None) -> list[str]:
    """The class folders of an image folder or zip (of its `part` folder when laid out in splits), nothing decoded."""
    return list(_class_files(_open(path), path if part is None else f"{path} ({part}/)", part))


def folder_fingerprint(path: str) -> str:
    """What an image folder or zip holds: a hash of every file's name, size and modification time (a zip member's
    CRC), as the image cache keys it; the same files in another place give the same value."""
    return fingerprint(_open(path).stats())


def _open(path: str) -> Source:
    root = Path(path).expanduser()
    if not root.exists():
        raise DataNotFoundError(f"data.path not found: {root} (give a folder or a .zip with one sub-folder per class)")
    if root.is_file() and not zipfile.is_zipfile(root):
        raise DataError(f"data.path {root} is a file but not a zip archive; give a folder or a .zip of class folders")
    return Source(root)


def _choose_mode(source: Source, files: list[str]) -> str:
    """Grayscale only when every image is; otherwise RGB (RGBA/P are composited on white)."""
    from PIL import Image

    for name in files:
        try:
            with Image.open(io.BytesIO(source.read(name))) as im:
                if im.mode not in GRAY_MODES:
                    return "RGB"
        except Exception:  # noqa: BLE001 - counted as unreadable later
            continue
    return "L"


@dataclass(frozen=True)
class Reading:
    """How an image folder's files are decoded at load: `workers` threads (loader.num_workers; None: one per
    core), through this machine's on-disk image cache (core/image_cache.py) unless `disk_cache` is off;
    `progress(done, total)` while decoding, `report(message)` once it is done."""

    workers: int | None = None
    disk_cache: bool = True
    progress: Callable[[int, int], None] | None = None
    report: Callable[[str], None] | None = None


def load_imagefolder(
    path: str,
    size: int,
    max_bad_fraction: float,
    cache_mb: int,
    interpolation: str = "bilinear",
    *,
    part: str | None = None,
    mode: str | None = None,
    reading: Reading = Reading(),
    hold: bool = True,
):
    """Return (images, labels, class_names, skipped_files). images is a uint8 tensor when it fits in `cache_mb`,
    else a CachedImages read from the on-disk cache (a LazyImages that decodes per item when the cache is off);
    unreadable files are found and left out at load. `hold` False: a set that fits and came through the cache is
    returned as its CachedImages marked `held`, served from the page cache (core/data.py: no private copy). A folder
    laid out as train/ [val/] test/ is read from `part` (train when None); `mode` (L or RGB) imposes the training
    split's."""
    source = _open(path)
    classes = _class_files(source, path if part is None else f"{path} ({part}/)", part)
    files = [f for c in classes for f in classes[c]]
    labels_all = np.asarray([i for i, c in enumerate(classes) for _ in classes[c]], dtype=np.int64)
    mode = mode or _choose_mode(source, files)
    shape = (len(files), 1 if mode == "L" else 3, size, size)
    fits = math.prod(shape) <= cache_mb * 2**20
    started = time.perf_counter()
    images, good, skipped, how = _read(source, files, (mode, size, interpolation), shape, fits, part, reading)
    if hold and isinstance(images, CachedImages) and images.held:
        images = images.in_memory()
    _check_readable(path, classes, files, labels_all[good], skipped, max_bad_fraction)
    if reading.report is not None:
        took = time.perf_counter() - started
        reading.report(f"{len(files):,} images of {path}{f' ({part}/)' if part else ''} {how} in {took:.1f} s")
    y = torch.as_tensor(labels_all[good], dtype=torch.int64)
    return images, y, list(classes), skipped


def _read(source: Source, files: list[str], how: tuple[str, int, str], shape: tuple, fits: bool, part, reading):
    """(images, rows of the readable files, skipped files, how they were read: for the report)."""
    workers = processes(reading.workers)
    root = cache_root() if reading.disk_cache else None
    if root is not None:
        try:
            return _through_cache(root, source, files, how, shape, fits, part, reading)
        except OSError as e:  # a full disk, a read-only or foreign folder: the run goes on without it
            if reading.report is not None:
                reading.report(f"the image cache in {root} cannot be used ({e.__class__.__name__}: {e}); decoding anew")
    if not fits:
        bad, n = decode_files(source.root, files, how, None, workers, reading.progress)
        good = np.asarray([i for i in range(len(files)) if i not in bad], dtype=np.int64)
        lazy = LazyImages(source, [files[i] for i in good], how[0], how[1], how[2])
        return lazy, good, _why(files, bad), f"checked with {n} thread(s), decoded per batch (image cache off)"
    out = np.empty(shape, dtype=np.uint8)
    bad, n = decode_files(source.root, files, how, out, workers, reading.progress)
    good = np.asarray([i for i in range(len(files)) if i not in bad], dtype=np.int64)
    images = torch.from_numpy(out if len(good) == len(files) else out[good])
    return images, good, _why(files, bad), f"decoded with {n} thread(s)"


def _through_cache(root: Path, source: Source, files, how, shape, fits: bool, part, reading):
    """Read from this machine's image cache, built first when it lacks this data (core/image_cache.py)."""
    key = entry_key(fingerprint(source.stats()), part or "train", *how)
    describe = {"source": str(source.root.resolve()), "part": part or "train", "mode": how[0], "side": how[1]}
    describe["interpolation"] = how[2]
    used: list[int] = []

    def fill(out: Path) -> tuple[np.ndarray, list[str]]:
        bad, n = decode_files(source.root, files, how, out, processes(reading.workers), reading.progress)
        used.append(n)
        return np.asarray([i for i in range(len(files)) if i not in bad], dtype=np.int64), _why(files, bad)

    found = build(root, key, describe, shape, fill)
    images = CachedImages(root / key / "images.u8", shape, found.good, how[0], held=fits)
    said = f"decoded with {used[0]} thread(s) into" if used else "read from"
    return images, found.good, found.skipped, f"{said} the image cache"


def _why(files: list[str], bad: dict[int, str]) -> list[str]:
    return [bad[i] for i in sorted(bad)]


def _check_readable(path, classes, files, labels, skipped, max_bad_fraction) -> None:
    if files and len(skipped) / len(files) > max_bad_fraction:
        raise DataError(
            f"{path}: {len(skipped)} of {len(files)} images are unreadable "
            f"(more than data.max_bad_fraction={max_bad_fraction}), e.g. {', '.join(skipped[:5])}"
        )
    counts = np.bincount(np.asarray(labels, dtype=np.int64), minlength=len(classes))
    if (counts == 0).any():
        lost = [c for c, n in zip(classes, counts, strict=True) if n == 0]
        raise DataError(
            f"{path}: every image of class(es) {', '.join(lost)} is unreadable, e.g. {', '.join(skipped[:5])}"
        )
