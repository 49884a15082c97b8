"""Datasets, the stratified split and the preprocessing; the batches the loop draws are in core/batches.py.

Every dataset becomes uint8 images (N, C, H, W) plus integer labels, decoded once. Small
sets live on the training device for the whole run; large image folders decode per item in
DataLoader workers. Normalisation (mean/std of
the training split) and augmentation (training split only) run as
batched tensor ops on the device, so they cost the same for every source.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Callable
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

from core import catalog
from core.augment import as_float, augment_batch
from core.cached_images import CachedImages
from core.catalog import DatasetEntry

# DataError lives with the image-folder reader (which raises it) and is re-exported here.
from core.imagefolder import (  # noqa: F401
    DataError,
    DataNotFoundError,
    LazyImages,
    Reading,
    folder_classes,
    folder_fingerprint,
    folder_parts,
    load_imagefolder,
)
from core.preprocess_ops import centre_crop, for_loader, input_size, plan_for, resize_batch, statistics
from core.preprocess_ops import store as store_images
from core.spec_sections import AugmentSpec, DataSpec, ModelSpec

# The splits (train, validation, the held-out test split) are core/splits.py's; Split and stratified_split are
# re-exported here.
from core.splits import Readers, Split, limited, make_splits, stratified_split  # noqa: F401


@dataclass
class DataInfo:
    """What a model and an export need to know about the data (recorded in checkpoints)."""

    name: str
    class_names: list[str]
    channels: int
    image_size: int
    mean: list[float]
    std: list[float]
    num_train: int
    num_val: int
    skipped: int = 0
    skipped_files: list[str] = field(default_factory=list)
    # what the images went through: core/preprocessing.py's record (source, sizes, interpolation, mean/std)
    preprocessing: dict = field(default_factory=dict)
    class_counts: list[int] = field(default_factory=list)  # training samples per class, in class_names' order
    num_test: int = 0  # the held-out test split's samples (0: none)
    test_source: str = "none"  # where it comes from: core/splits.py's TEST_SOURCES
    # what the data was: an image folder's files (names, sizes, times), else a hash of the loaded images and labels
    fingerprint: str = ""

    @property
    def num_classes(self) -> int:
        return len(self.class_names)

    def to_dict(self) -> dict:
        return asdict(self)


@dataclass
class DataBundle:
    info: DataInfo
    train: Split
    val: Split
    test: Split | None = None  # the held-out test split, scored once at the end (core/test_scores.py)


# --- sources -------------------------------------------------------------------


def _to_uint8(x: np.ndarray | torch.Tensor) -> torch.Tensor:
    t = torch.as_tensor(x, dtype=torch.float32)
    return (t.clamp(0, 1) * 255).round().to(torch.uint8)


# What a loader returns: uint8 images (N, C, H, W) or lazily decoded files, labels, class names, skipped files.
Loaded = tuple[torch.Tensor | LazyImages, torch.Tensor, list[str], list[str]]


def _digits(entry: DatasetEntry, spec: DataSpec, seed: int) -> Loaded:
    """The one builtin set: scikit-learn's load_digits."""
    from sklearn.datasets import load_digits

    d = load_digits()  # 1,797 real 8×8 handwritten digits, pixel values 0..16
    images = _to_uint8(d.images[:, None] / 16.0)
    return images, torch.as_tensor(d.target, dtype=torch.int64), [str(c) for c in d.target_names], []


def _synthetic(entry: DatasetEntry, spec: DataSpec, seed: int) -> Loaded:
    """Seeded class templates (smooth random patterns) plus per-sample noise: learnable, not trivial."""
    g = torch.Generator().manual_seed(seed)
    low = torch.rand(spec.num_classes, spec.channels, 4, 4, generator=g)
    templates = F.interpolate(low, size=(spec.size, spec.size), mode="bilinear", align_corners=False)
    labels = torch.arange(spec.num_samples) % spec.num_classes
    labels = labels[torch.randperm(spec.num_samples, generator=g)]
    noise = torch.randn(spec.num_samples, spec.channels, spec.size, spec.size, generator=g)
    images = templates[labels] + spec.noise * 0.25 * noise
    return _to_uint8(images), labels, [f"class_{i}" for i in range(spec.num_classes)], []


def _torchvision(entry: DatasetEntry, spec: DataSpec, seed: int, train: bool = True) -> Loaded:
    """A torchvision set's train split (torchdeck holds its own validation split out of it), or its test split."""
    import torchvision

    root = Path(spec.path or os.environ.get("TORCHDECK_DATA", "data")).expanduser().resolve()
    cls = getattr(torchvision.datasets, entry.source)
    try:
        ds = cls(root=str(root), train=train, download=spec.download)
    except (RuntimeError, OSError) as e:  # not on disk; or the download failed (offline)
        raise DataError(
            f"{spec.name} not found under {root} ({e.__class__.__name__}: {e}). Offline, put torchvision's "
            f"{entry.source} files in {root / entry.folder}/ ({entry.files}), "
            "or set data.download=true where the machine has internet."
        ) from None
    data = torch.as_tensor(np.asarray(ds.data))
    images = data[:, None] if data.ndim == 3 else data.permute(0, 3, 1, 2)
    return (
        images.contiguous().to(torch.uint8),
        torch.as_tensor(np.asarray(ds.targets), dtype=torch.int64),
        list(ds.classes),
        [],
    )


def _imagefolder(
    entry: DatasetEntry, spec: DataSpec, seed: int, reading: Reading | None = None, **where: str | None
) -> Loaded:
    """`where`: load_imagefolder's part (a split folder) and mode, for a val/ or test/ part (core/splits.py);
    `reading`: the decoding threads and the on-disk cache (data.disk_cache off: no cache)."""
    size, interpolation = spec.image_size or entry.size, spec.preprocess.interpolation or "bilinear"
    reading = replace(reading or Reading(), disk_cache=spec.disk_cache and (reading or Reading()).disk_cache)
    path = spec.path or ""
    args = (path, size, spec.max_bad_fraction, spec.cache_mb, interpolation)
    return load_imagefolder(*args, reading=reading, hold=False, **where)  # held sets served from the page cache


# One loader per kind of dataset (core/catalog.py's DatasetEntry.kind): (entry, spec, seed) -> Loaded.
LOADERS: dict[str, Callable[[DatasetEntry, DataSpec, int], Loaded]] = {
    "builtin": _digits,
    "generated": _synthetic,
    "torchvision": _torchvision,
    "folder": _imagefolder,
}


# --- split, statistics, resizing -----------------------------------------------------


def _readers(entry: DatasetEntry, spec: DataSpec, seed: int, fit: Callable, reading: Reading | None) -> Readers:
    """How core/splits.py reads a torchvision set's test split and an image folder's other parts: as the loader
    read the training split (`spec`: the loader's), then `fit` (stored size, data.limit)."""
    return Readers(
        official=lambda: _torchvision(entry, spec, seed, train=False),
        folder=lambda path, part, mode: _imagefolder(
            entry, spec.model_copy(update={"path": path}), seed, reading, part=part, mode=mode
        ),
        fit=fit,
    )


def load_data(spec: DataSpec, seed: int, model: ModelSpec | None = None, reading: Reading | None = None) -> DataBundle:
    """Load, (optionally) limit, split and measure a registered dataset, preprocessed for `model` (the weights it
    starts from decide the defaults: core/preprocessing.py); an image folder decoded as `reading` says (its
    processes, the on-disk cache, progress)."""
    entry = catalog.dataset(spec.name)
    plan = plan_for(spec, model)
    size = input_size(plan, entry, spec)
    loader_spec = for_loader(spec, plan, size)
    extra = {"reading": reading} if entry.kind == "folder" else {}
    images, labels, classes, skipped = LOADERS[entry.kind](entry, loader_spec, seed, **extra)
    content = folder_fingerprint(spec.path or "") if entry.kind == "folder" else _content_hash(images, labels)

    def fit(im, y):  # stored at the model's side, then data.limit: the loaded samples and a part read elsewhere
        return limited(store_images(im, plan, size, spec.cache_mb), y, spec.limit, seed)

    images, labels = fit(images, labels)
    parts = make_splits(entry, spec, seed, (images, labels, classes), _readers(entry, loader_spec, seed, fit, reading))
    train, val, test = parts.train, parts.val, parts.test
    skipped = [*skipped, *parts.skipped]
    whole = isinstance(train.images, torch.Tensor | CachedImages)  # measured from a sample of rows: no copy of the set
    stats_src = train.images if whole else train.images.sample_tensor(2048, seed)
    mean, std, preprocessing = statistics(plan, stats_src, size)
    info = DataInfo(
        name=spec.name,
        class_names=classes,
        channels=int(stats_src.shape[1]),
        image_size=size,
        mean=mean,
        std=std,
        num_train=len(train),
        num_val=len(val),
        skipped=len(skipped),
        skipped_files=skipped[:20],
        preprocessing=preprocessing,
        class_counts=torch.bincount(train.labels, minlength=len(classes)).tolist(),
        num_test=len(parts.test or ()),
        test_source=parts.test_source,
        fingerprint=content,
    )
    return DataBundle(info, train, val, test)


def load_every(
    spec: DataSpec,
    side: int,
    interpolation: str,
    mode: str | None = None,
    seed: int = 0,
    check: Callable[[list[str]], object] | None = None,
) -> tuple[Loaded, str]:
    """Every image of a registered dataset, unsplit, with its fingerprint (as load_data records it): an image folder
    decoded at `side` (shorter side, then the centred square) in `mode` (L or RGB; None: as its files are), read from
    its test/ folder when it is laid out as train/ [val/] test/; other sets as their loader gives them (their own
    side: the caller resizes). `check(class names)` may refuse (raise) before an image folder is decoded. Used to score
    a finished run's export on other data (core/export_scores.py)."""
    entry = catalog.dataset(spec.name)
    check = check or (lambda classes: None)
    if entry.kind == "folder":
        part = "test" if "test" in folder_parts(spec.path or "") else None
        check(folder_classes(spec.path or "", part))
        args = (spec.path or "", side, spec.max_bad_fraction, spec.cache_mb, interpolation)
        loaded = load_imagefolder(*args, part=part, mode=mode, reading=Reading(disk_cache=False))
        return loaded, folder_fingerprint(spec.path or "")
    loaded = LOADERS[entry.kind](entry, spec, seed)
    check(loaded[2])
    return loaded, _content_hash(loaded[0], loaded[1])


def _content_hash(images: torch.Tensor, labels: torch.Tensor) -> str:
    """SHA-256 of a set loaded whole (its uint8 images, then its labels): what the data is."""
    h = hashlib.sha256()
    for t in (images, labels):
        h.update(str(tuple(t.shape)).encode())
        h.update(memoryview(t.contiguous().numpy()).cast("B"))
    return h.hexdigest()


# --- batched preprocessing on the device ------------------------------------------------


class Preprocess:
    """uint8 batch → float at the stored side, cropped to the input side (evaluation: the centre crop; training:
    the augmentation's crop) and normalised, all on the device."""

    def __init__(self, info: DataInfo, augment: AugmentSpec | None, device: torch.device, *, channels_last=False):
        self.mean = torch.tensor(info.mean, device=device).view(1, -1, 1, 1)
        self.std = torch.tensor(info.std, device=device).view(1, -1, 1, 1)
        self.mean255, self.std255 = 255.0 * self.mean, 255.0 * self.std  # uint8 → normalised in one copy
        self.augment = augment
        self.size = info.image_size
        # a run from before the preprocessing was recorded stored its images at the input side
        self.stored = int(info.preprocessing.get("resize", info.image_size))
        self.interpolation = str(info.preprocessing.get("interpolation", "bilinear"))
        self.channels_last = channels_last  # the model's memory format (spec.channels_last)

    def output_numel(self, x: torch.Tensor) -> int:
        """Elements of this batch once preprocessed (for memory budgets)."""
        return x.shape[0] * x.shape[1] * self.size * self.size

    def __call__(self, x: torch.Tensor, gen: torch.Generator | None = None) -> torch.Tensor:
        """A uint8 batch → this call's own normalised float batch (cropped before it becomes floats)."""
        if tuple(x.shape[-2:]) != (self.stored, self.stored):  # a set kept at its own side (core.preprocess_ops)
            x = resize_batch(as_float(x), self.stored, self.interpolation)
        if self.augment is not None and gen is not None:
            x = augment_batch(x, self.augment, gen, self.size, uint8_out=True)
        else:
            x = centre_crop(x, self.size)
        if x.dtype == torch.uint8:
            x = x.float().sub_(self.mean255).div_(self.std255)  # (x / 255 − mean) / std; x / 255 exactly when not
        else:
            x = x.sub_(self.mean).div_(self.std)  # in place: x is this call's own float copy
        return x.contiguous(memory_format=torch.channels_last) if self.channels_last else x
