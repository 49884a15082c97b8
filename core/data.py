"""Datasets, the stratified split and the preprocessing; the batches the loop draws are in core/batches.py.

Every dataset becomes uint8 images (N, C, H, W) plus integer labels, decoded once. Small
sets live on the training device for the whole run; large image folders decode per item in
DataLoader workers. Normalisation (mean/std of
the training split) and augmentation (training split only) run as
batched tensor ops on the device, so they cost the same for every source.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

from core import catalog
from core.augment import augment_batch
from core.catalog import DatasetEntry

# DataError lives with the image-folder reader (which raises it) and is re-exported here.
from core.imagefolder import DataError, DataNotFoundError, LazyImages, load_imagefolder  # noqa: F401
from core.spec_sections import AugmentSpec, DataSpec


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

    @property
    def num_classes(self) -> int:
        return len(self.class_names)

    def to_dict(self) -> dict:
        return asdict(self)


@dataclass
class Split:
    images: torch.Tensor | LazyImages  # uint8 (N, C, H, W), or lazily decoded files
    labels: torch.Tensor  # int64 (N,)

    def __len__(self) -> int:
        return len(self.labels)


@dataclass
class DataBundle:
    info: DataInfo
    train: Split
    val: Split


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


def _torchvision(entry: DatasetEntry, spec: DataSpec, seed: int) -> Loaded:
    """A torchvision set's train split: torchdeck holds its own validation split out of it."""
    import torchvision

    root = Path(spec.path or os.environ.get("TORCHDECK_DATA", "data")).expanduser().resolve()
    cls = getattr(torchvision.datasets, entry.source)
    try:
        ds = cls(root=str(root), train=True, download=spec.download)
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


def _imagefolder(entry: DatasetEntry, spec: DataSpec, seed: int) -> Loaded:
    return load_imagefolder(spec.path or "", spec.image_size or entry.size, spec.max_bad_fraction, spec.cache_mb)


# One loader per kind of dataset (core/catalog.py's DatasetEntry.kind): (entry, spec, seed) -> Loaded.
LOADERS: dict[str, Callable[[DatasetEntry, DataSpec, int], Loaded]] = {
    "builtin": _digits,
    "generated": _synthetic,
    "torchvision": _torchvision,
    "folder": _imagefolder,
}


# --- split, statistics, resizing -----------------------------------------------------


def stratified_split(labels: torch.Tensor, val_fraction: float, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """Seeded split that keeps every class's proportion in both parts (each class ≥1 val sample when it has ≥2)."""
    rng = np.random.default_rng(seed)
    y = labels.numpy()
    train_idx, val_idx = [], []
    for c in np.unique(y):
        idx = rng.permutation(np.flatnonzero(y == c))
        n_val = int(round(len(idx) * val_fraction))
        n_val = min(max(n_val, 1 if len(idx) >= 2 else 0), len(idx) - 1) if len(idx) > 1 else 0
        val_idx.append(idx[:n_val])
        train_idx.append(idx[n_val:])
    return np.sort(np.concatenate(train_idx)), np.sort(np.concatenate(val_idx))


def channel_stats(images: torch.Tensor) -> tuple[list[float], list[float]]:
    """Per-channel mean/std of uint8 images scaled to [0, 1] (unbiased std, like torch.std).
    Sums in float64 over chunks: a whole float64 copy of CIFAR-10's train split would take ~1 GB."""
    c = images.shape[1]
    s, s2, n = torch.zeros(c, dtype=torch.float64), torch.zeros(c, dtype=torch.float64), 0
    for chunk in images.split(4096):
        x = chunk.to(torch.float64).div_(255.0).transpose(0, 1).reshape(c, -1)
        s += x.sum(1)
        s2 += (x * x).sum(1)
        n += x.shape[1]
    mean = s / n
    var = ((s2 - n * mean * mean) / max(1, n - 1)).clamp_min(0.0)
    std = var.sqrt().clamp_min(1e-6)
    return [float(v) for v in mean], [float(v) for v in std]


def resize_uint8(images: torch.Tensor, size: int) -> torch.Tensor:
    if images.shape[-1] == size and images.shape[-2] == size:
        return images
    out = []
    for chunk in images.split(1024):
        f = F.interpolate(chunk.float(), size=(size, size), mode="bilinear", align_corners=False, antialias=True)
        out.append(f.round().clamp(0, 255).to(torch.uint8))
    return torch.cat(out)


def _subset(images: torch.Tensor | LazyImages, labels: torch.Tensor, idx: np.ndarray) -> Split:
    t = torch.as_tensor(idx, dtype=torch.int64)
    return Split(images[t] if isinstance(images, torch.Tensor) else images.subset(idx), labels[t])


def load_data(spec: DataSpec, seed: int) -> DataBundle:
    """Load, (optionally) limit, split and measure a registered dataset."""
    entry = catalog.dataset(spec.name)
    images, labels, classes, skipped = LOADERS[entry.kind](entry, spec, seed)
    if isinstance(images, torch.Tensor) and spec.image_size:
        images = resize_uint8(images, spec.image_size)
    if spec.limit and spec.limit < len(labels):
        keep = np.sort(np.random.default_rng(seed).permutation(len(labels))[: spec.limit])
        sub = _subset(images, labels, keep)
        images, labels = sub.images, sub.labels
    tr, va = stratified_split(labels, spec.val_fraction, seed)
    if len(va) == 0 or len(tr) == 0:
        raise DataError(
            f"{spec.name}: {len(labels)} samples are too few to split with val_fraction={spec.val_fraction}"
        )
    train, val = _subset(images, labels, tr), _subset(images, labels, va)
    stats_src = train.images if isinstance(train.images, torch.Tensor) else train.images.sample_tensor(2048, seed)
    mean, std = channel_stats(stats_src) if spec.normalize else ([0.0] * stats_src.shape[1], [1.0] * stats_src.shape[1])
    info = DataInfo(
        name=spec.name,
        class_names=classes,
        channels=int(stats_src.shape[1]),
        image_size=int(stats_src.shape[-1]),
        mean=mean,
        std=std,
        num_train=len(train),
        num_val=len(val),
        skipped=len(skipped),
        skipped_files=skipped[:20],
    )
    return DataBundle(info, train, val)


# --- batched preprocessing on the device ------------------------------------------------


class Preprocess:
    """uint8 batch → float, augmented (train only) and normalised, all on the device."""

    def __init__(self, info: DataInfo, augment: AugmentSpec | None, device: torch.device):
        self.mean = torch.tensor(info.mean, device=device).view(1, -1, 1, 1)
        self.std = torch.tensor(info.std, device=device).view(1, -1, 1, 1)
        self.augment = augment

    def __call__(self, x: torch.Tensor, gen: torch.Generator | None = None) -> torch.Tensor:
        x = x.float().div_(255.0)
        if self.augment is not None and gen is not None:
            x = augment_batch(x, self.augment, gen)
        return x.sub_(self.mean).div_(self.std)  # in place: x is this call's own float copy
