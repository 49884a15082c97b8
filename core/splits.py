"""A run's three splits: the samples it trains on, those it validates (and selects) on, and the held-out test
split it is scored on once at the end (core/test_scores.py), which nothing that selects ever sees.

Where the test split comes from is data.test_split (core/spec_data.py): a torchvision dataset's official test
split, an image folder's test/ folder (beside train/ and an optional val/), another folder with the same classes
(data.test_path), or a stratified, seeded fraction of the samples carved before validation is, so that the
validation split never holds a test sample. core/data.py's load_data calls `make_splits`.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np
import torch

from core.cached_images import CachedImages, take_rows
from core.catalog import DatasetEntry
from core.imagefolder import DataError, LazyImages, folder_parts
from core.spec_sections import DataSpec

Images = torch.Tensor | LazyImages | CachedImages
# What a loader returns: uint8 images (N, C, H, W) or lazily decoded files, labels, class names, skipped files.
Loaded = tuple[Images, torch.Tensor, list[str], list[str]]
# The test split's sources, as DataInfo.test_source records them ("none": the run has no test split).
TEST_SOURCES = ("official", "folder", "fraction", "path", "none")
_TEST_STREAM = 7_919  # the carve's own random stream: validation's draw from the same seed stays independent


@dataclass
class Split:
    images: Images  # uint8 (N, C, H, W), or lazily decoded files
    labels: torch.Tensor  # int64 (N,)

    def __len__(self) -> int:
        return len(self.labels)


@dataclass
class Splits:
    train: Split
    val: Split
    test: Split | None  # None: no test split (test_source "none")
    test_source: str
    skipped: list[str] = field(default_factory=list)  # unreadable files of the parts read from other folders


def subset(images: Images, labels: torch.Tensor, idx: np.ndarray) -> Split:
    t = torch.as_tensor(idx, dtype=torch.int64)
    return Split(take_rows(images, t) if isinstance(images, torch.Tensor) else images.subset(idx), labels[t])


def stratified_split(labels: torch.Tensor, val_fraction: float, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """Seeded split that keeps every class's proportion in both parts (each class ≥1 val sample when it has ≥2)."""
    return _stratified(labels.numpy(), val_fraction, np.random.default_rng(seed), keep=1)


def carve_test(labels: torch.Tensor, fraction: float, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """(rest, test): `fraction` of every class held out for the test split, seeded by a stream of its own. A class
    keeps at least two samples (one to train on, one to validate); one of three or more gives at least one."""
    return _stratified(labels.numpy(), fraction, np.random.default_rng([seed, _TEST_STREAM]), keep=2)


def _stratified(y: np.ndarray, fraction: float, rng: np.random.Generator, keep: int) -> tuple[np.ndarray, np.ndarray]:
    rest, held = [], []
    for c in np.unique(y):
        idx = rng.permutation(np.flatnonzero(y == c))
        n = min(max(int(round(len(idx) * fraction)), 1 if len(idx) > keep else 0), max(len(idx) - keep, 0))
        held.append(idx[:n])
        rest.append(idx[n:])
    return np.sort(np.concatenate(rest)), np.sort(np.concatenate(held))


def test_source(entry: DatasetEntry, spec: DataSpec) -> str:
    """Where this spec's test split comes from (one of TEST_SOURCES), data.test_split=auto resolved."""
    if spec.test_split != "auto":
        return spec.test_split
    if entry.kind == "torchvision":
        return "official"
    if entry.kind == "folder":
        if spec.test_path:
            return "path"
        if "test" in folder_parts(spec.path or ""):
            if spec.test_fraction:
                raise DataError(
                    f"data.test_fraction is set but {spec.path} has a test/ folder, the test split under "
                    "data.test_split=auto: drop data.test_fraction, or set data.test_split=fraction to carve one"
                )
            return "folder"
    return "fraction" if spec.carved_test_fraction > 0 else "none"


def same_classes(what: str, got: list[str], classes: list[str]) -> None:
    """A test or validation split read from elsewhere must name the training split's classes, in its order."""
    if got == classes:
        return
    missing, extra = sorted(set(classes) - set(got)), sorted(set(got) - set(classes))
    bits = ([f"missing {', '.join(missing)}"] if missing else []) + ([f"extra {', '.join(extra)}"] if extra else [])
    raise DataError(
        f"{what} must have the training split's classes: "
        + ("; ".join(bits) + ". Give it the same class sub-folders" if bits else "the same ones in another order")
    )


Fit = Callable[[Images, torch.Tensor], tuple[Images, torch.Tensor]]  # core/data.py's stored size and data.limit


@dataclass(frozen=True)
class Readers:
    """How the parts that are not among the loaded samples are read, as the training split was (core/data.py):
    `official()` a torchvision set's test split; `folder(path, part, mode)` an image folder (its `part` folder,
    or all of it when None) decoded in the training split's mode (L or RGB)."""

    official: Callable[[], Loaded]
    folder: Callable[[str, str | None, str], Loaded]
    fit: Fit  # a part read from elsewhere brought to the stored size and data.limit, as the loaded samples were


def limited(images: Images, labels: torch.Tensor, limit: int | None, seed: int) -> tuple[Images, torch.Tensor]:
    """At most `limit` samples (data.limit), a seeded subset in their order; all of them when None."""
    if not limit or limit >= len(labels):
        return images, labels
    keep = np.sort(np.random.default_rng(seed).permutation(len(labels))[:limit])
    sub = subset(images, labels, keep)
    return sub.images, sub.labels


def _folder(read: Readers, images: Images, classes: list[str], where: tuple[str, str | None], what: str) -> Loaded:
    """A part (val/ or test/) of the training folder, or another folder, decoded like the training split."""
    mode = ("L" if images.shape[1] == 1 else "RGB") if isinstance(images, torch.Tensor) else images.mode
    got = read.folder(where[0], where[1], mode)
    same_classes(what, got[2], classes)
    return got


def make_splits(
    entry: DatasetEntry,
    spec: DataSpec,
    seed: int,
    loaded: tuple[Images, torch.Tensor, list[str]],
    read: Readers,
) -> Splits:
    """Train, validation and test splits of the (resized, limited) samples `loaded` = (images, labels, classes).
    `read` reads (and fits) the parts found elsewhere."""
    images, labels, classes = loaded
    source, test, skipped = test_source(entry, spec), None, []
    if source == "official":
        got = read.official()
        same_classes(f"{spec.name}'s official test split", got[2], classes)
        test = Split(*read.fit(got[0], got[1]))
    elif source in ("folder", "path"):
        what = "data.test_path" if source == "path" else f"{spec.path}'s test/ folder"
        where = (spec.test_path or "", None) if source == "path" else (spec.path or "", "test")
        got = _folder(read, images, classes, where, what)
        test, skipped = Split(*read.fit(got[0], got[1])), list(got[3])
    rest = np.arange(len(labels))
    if source == "fraction":
        if spec.val_fraction + spec.carved_test_fraction >= 1:
            raise DataError(
                f"{spec.name}: data.val_fraction ({spec.val_fraction}) + data.test_fraction "
                f"({spec.carved_test_fraction}) leave nothing to train on: lower one (their sum must be below 1)"
            )
        rest, held = carve_test(labels, spec.carved_test_fraction, seed)
        test = subset(images, labels, held) if len(held) else None
        if test is None and spec.test_split == "fraction":
            raise DataError(f"{spec.name}: {len(labels)} samples are too few to hold out data.test_fraction")
    if entry.kind == "folder" and "val" in folder_parts(spec.path or ""):
        got = _folder(read, images, classes, (spec.path or "", "val"), f"{spec.path}'s val/ folder")
        train, val, skipped = subset(images, labels, rest), Split(*read.fit(got[0], got[1])), skipped + list(got[3])
    else:
        share = spec.val_fraction / (1 - spec.carved_test_fraction) if source == "fraction" else spec.val_fraction
        tr, va = stratified_split(labels[torch.as_tensor(rest)], min(share, 0.99), seed)
        train, val = subset(images, labels, rest[tr]), subset(images, labels, rest[va])
    if len(val) == 0 or len(train) == 0:
        raise DataError(
            f"{spec.name}: {len(labels)} samples are too few to split with val_fraction={spec.val_fraction}"
        )
    return Splits(train, val, test, source if test is not None else "none", skipped)
