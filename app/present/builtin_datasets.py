"""The built-in datasets' previews for the Datasets page, as plain functions (no Streamlit, no torch):
a grid of digits samples with its class balance, what synthetic generates, and where the torchvision
sets are read from."""

from __future__ import annotations

import io
import os
from pathlib import Path

import numpy as np

from app.present.text import code_span
from core import catalog
from core.spec_sections import DataSpec


def is_torchvision(name: str) -> bool:
    """Whether `name` is one of torchvision's datasets (core/catalog.py), read from a folder under data.path."""
    entry = catalog.DATASETS.get(name)
    return entry is not None and entry.kind == "torchvision"


def digits_samples(per_class: int = 8, scale: int = 4, gap: int = 2) -> tuple[bytes, dict[str, int]]:
    """A PNG grid of the first `per_class` images of each digit (one row per class, 8×8 upscaled `scale`×,
    `gap` pixels between), and the images per class of all 1,797."""
    from PIL import Image
    from sklearn.datasets import load_digits

    d = load_digits()  # pixel values 0..16, 0 is the background
    classes = [str(c) for c in d.target_names]
    cell = 8 * scale
    grid = np.full((len(classes) * (cell + gap) - gap, per_class * (cell + gap) - gap), 255, dtype=np.uint8)
    for row, label in enumerate(d.target_names):
        for col, index in enumerate(np.flatnonzero(d.target == label)[:per_class]):
            ink = (255 - d.images[index] / 16.0 * 255).round().astype(np.uint8)  # dark digits on white
            big = np.kron(ink, np.ones((scale, scale), dtype=np.uint8))
            top, left = row * (cell + gap), col * (cell + gap)
            grid[top : top + cell, left : left + cell] = big
    buf = io.BytesIO()
    Image.fromarray(grid, mode="L").save(buf, format="PNG")
    counts = np.bincount(d.target, minlength=len(classes))
    return buf.getvalue(), {c: int(n) for c, n in zip(classes, counts, strict=True)}


def synthetic_counts(num_samples: int | None = None, num_classes: int | None = None) -> dict[str, int]:
    """Images per class that synthetic generates (labels are 0..n-1 repeated, then shuffled): the
    defaults of data.num_samples and data.num_classes unless given."""
    defaults = DataSpec(name="synthetic")
    n = defaults.num_samples if num_samples is None else num_samples
    k = defaults.num_classes if num_classes is None else num_classes
    return {f"class_{i}": n // k + (1 if i < n % k else 0) for i in range(k)}


def synthetic_description() -> str:
    """Markdown: what a run on synthetic gets."""
    d = DataSpec(name="synthetic")
    return (
        "**synthetic** has no stored images: each run generates its own from the spec. There are "
        f"`data.num_classes` classes (default {d.num_classes}), each a seeded smooth random pattern, and "
        f"`data.num_samples` images (default {d.num_samples:,}) of `data.size`×`data.size` pixels (default "
        f"{d.size}) with `data.channels` channels (default {d.channels}): the class pattern plus noise scaled "
        f"by `data.noise` (default {d.noise}). The same seed gives the same images; the classes are "
        "balanced, named `class_0`, `class_1`, …."
    )


def torchvision_folder(name: str) -> Path:
    """Where a torchvision dataset is looked for on this machine when a run gives no data.path."""
    return Path(os.environ.get("TORCHDECK_DATA") or "data") / catalog.dataset(name).folder


def torchvision_description(name: str) -> str:
    """Markdown: where a torchvision dataset is read from, and whether it is there on this machine."""
    folder = torchvision_folder(name)
    here = "It is there on this machine." if folder.exists() else "It is not there on this machine."
    return (
        f"**{name}** is read by torchvision from disk when present: under `data.path`, else under "
        f"`$TORCHDECK_DATA` (default `data`), here {code_span(folder)}. {here} Set `data.download: true` to "
        "let a worker with internet fetch it. Its images are not previewed here."
    )
