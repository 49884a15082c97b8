"""The torch side of the preprocessing core/preprocessing.py chooses: the plan for a run (reading a checkpoint's
record), images stored at the plan's side (shorter side resized, centre-cropped square), the split's statistics,
and the batched resize and centre crop core/data.py's Preprocess runs on the device.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F

from core import catalog, preprocessing
from core.cached_images import CachedImages, take_rows
from core.catalog import DatasetEntry
from core.checkpoint import read_data_info
from core.imagefolder import DataError, LazyImages
from core.preprocessing import Plan, PreprocessError
from core.spec_sections import DataSpec, ModelSpec


def plan_for(spec: DataSpec, model: ModelSpec | None) -> Plan:
    """The run's preprocessing plan; a model.weights_file that is a torchdeck checkpoint brings its own record,
    and a pretrained timm model the catalog does not list timm's pretrained_cfg."""
    info = read_data_info(model.weights_file) if model is not None and model.weights_file else None
    library = None
    if model is not None and model.pretrained and spec.preprocess.source != "dataset":
        entry = catalog.model(model.name)
        if entry.weights is None and entry.library == "timm":
            from core.timm_models import preprocessing as timm_preprocessing  # imports timm: only for such a model

            library = timm_preprocessing(model.name)
    try:
        return preprocessing.choose(spec, model, info, library)
    except PreprocessError as e:
        raise DataError(str(e)) from None


def input_size(plan: Plan, entry: DatasetEntry, spec: DataSpec) -> int:
    """The model's input side: the plan's (data.image_size or the weights'), else the dataset's own."""
    return plan.image_size or entry.size or spec.size


def for_loader(spec: DataSpec, plan: Plan, size: int) -> DataSpec:
    """The data spec a loader reads: an image folder decodes straight to the stored side with the plan's
    interpolation (the other loaders read their images as they are)."""
    pre = spec.preprocess.model_copy(update={"interpolation": plan.interpolation})
    return spec.model_copy(update={"image_size": plan.stored(size), "preprocess": pre})


def store(images: torch.Tensor | LazyImages, plan: Plan, size: int, cache_mb: int) -> torch.Tensor | LazyImages:
    """In-memory images at the stored side when they shrink or fit in `cache_mb` MB (decoded once); else kept
    as they are, and Preprocess resizes each batch on the device (CIFAR-10 at 256 px would take 10 GB)."""
    side = plan.stored(size)
    if not isinstance(images, torch.Tensor) or tuple(images.shape[-2:]) == (side, side):
        return images
    fits = images.shape[0] * images.shape[1] * side * side <= cache_mb * 2**20
    if not fits and side > min(images.shape[-2:]):
        return images
    out = [
        resize_batch(chunk.float(), side, plan.interpolation).round_().clamp_(0, 255).to(torch.uint8)
        for chunk in images.split(1024)
    ]
    return torch.cat(out)


def resize_batch(x: torch.Tensor, side: int, interpolation: str) -> torch.Tensor:
    """Float images (N, C, H, W): the shorter side resized to `side` (aspect kept, antialiased when shrinking,
    values kept in the input's range), then the centred side × side square."""
    h, w = x.shape[-2:]
    if (h, w) != (side, side):
        nh, nw = (max(side, int(side * h / w)), side) if w <= h else (side, max(side, int(side * w / h)))
        lo, hi = x.amin(), x.amax()
        if interpolation == "nearest":
            x = F.interpolate(x, size=(nh, nw), mode="nearest-exact")
        else:
            x = F.interpolate(x, size=(nh, nw), mode=interpolation, align_corners=False, antialias=True)
            x = x.clamp(lo, hi) if interpolation == "bicubic" else x  # bicubic overshoots
    return centre_crop(x, side)


def centre_crop(x: torch.Tensor, size: int) -> torch.Tensor:
    """The centred size × size square of a batch (N, C, H, W), offsets rounded as torchvision's center_crop."""
    h, w = x.shape[-2:]
    if (h, w) == (size, size):
        return x
    top, left = int(round((h - size) / 2.0)), int(round((w - size) / 2.0))
    return x[..., top : top + size, left : left + size]


STATS_VALUES = 2**28  # the training images' statistics are read from at most this many values (a seeded sample)


def channel_stats(images: torch.Tensor | CachedImages, seed: int = 0) -> tuple[list[float], list[float]]:
    """Per-channel mean/std of uint8 images scaled to [0, 1] (unbiased std, like torch.std), exact, from each
    channel's histogram of values: no float copy of the split, read a few rows at a time. A split of more than
    STATS_VALUES values (10,000 CIFAR images are 31 M; 10,000 photos at 256 px, 2 G) is measured on a seeded sample of
    its images of that size."""
    c, per_image = images.shape[1], max(1, math.prod(images.shape[1:])) if len(images) else 1
    step = max(1, 2**24 // per_image)
    if len(images) * per_image > STATS_VALUES:
        keep = np.sort(np.random.default_rng(seed).permutation(len(images))[: max(1, STATS_VALUES // per_image)])
        positions = torch.from_numpy(keep).split(step)
        chunks = (images.take(p) if isinstance(images, CachedImages) else take_rows(images, p) for p in positions)
    elif isinstance(images, CachedImages):
        chunks = (images.take(p) for p in torch.arange(len(images)).split(step))
    else:
        chunks = images.split(step)
    counts = torch.zeros(c, 256, dtype=torch.int64)  # per channel, how many pixels hold each value: exact sums
    for chunk in chunks:
        for k in range(c):
            counts[k] += torch.bincount(chunk[:, k].reshape(-1), minlength=256)
    values = torch.arange(256, dtype=torch.float64)
    n = int(counts[0].sum())
    s, s2 = counts.double() @ values, counts.double() @ values.square()
    mean = s / 255.0 / max(n, 1)
    var = ((s2 / 255.0**2 - n * mean * mean) / max(1, n - 1)).clamp_min(0.0)
    std = var.sqrt().clamp_min(1e-6)
    return [float(v) for v in mean], [float(v) for v in std]


def statistics(
    plan: Plan, train_images: torch.Tensor | CachedImages, size: int
) -> tuple[list[float], list[float], dict[str, Any]]:
    """mean, std and DataInfo.preprocessing for training images (N, C, H, W): the plan's statistics fitted to the
    channels, else the training split's, else (no normalisation) 0 and 1."""
    c = int(train_images.shape[1])
    if plan.mean is not None and plan.std is not None:
        spec = plan.stats_from == "spec"
        whose = "data.preprocess" if spec else f"the {plan.stats_from}'s"
        try:
            mean = preprocessing.per_channel(plan.mean, c, f"{whose}.mean" if spec else f"{whose} mean", not spec)
            std = preprocessing.per_channel(plan.std, c, f"{whose}.std" if spec else f"{whose} std", not spec)
        except PreprocessError as e:
            raise DataError(str(e)) from None
    elif plan.stats_from == "none":
        mean, std = [0.0] * c, [1.0] * c
    else:
        mean, std = channel_stats(train_images)
    return mean, std, preprocessing.record(plan, size, mean, std)
