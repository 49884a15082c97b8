"""The data section of a run spec: where the images come from, how they are split, preprocessed and augmented.
core/spec_sections.py re-exports it with the other sections; torch-free like them.
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field, model_validator

from core import catalog
from core.catalog import DATASET_NAMES
from core.spec_base import Section, registered

MAX_SYNTHETIC_BYTES = 4 << 30  # a synthetic set is generated in memory, as uint8 images
DatasetName = Annotated[str, registered("dataset", DATASET_NAMES)]


class AugmentSpec(Section):
    """Augmentation applied to the training split only; validation never sees it."""

    random_crop: bool = Field(False, description="Random crop of the original size after zero padding.")
    crop_padding: int = Field(4, ge=0, le=64, description="Padding in pixels added before the random crop.")
    hflip: bool = Field(
        False, description="Random horizontal flip with probability 0.5 (off by default: digits are not symmetric)."
    )
    color_jitter: float = Field(
        0.0, ge=0.0, le=1.0, description="Strength of random brightness/contrast jitter; 0 disables it."
    )


class DataSpec(Section):
    """Where the images come from and how they are split and normalised."""

    name: DatasetName = Field("digits", description=f"Dataset: one of {', '.join(DATASET_NAMES)}.")
    path: str | None = Field(
        None,
        max_length=4096,
        description="imagefolder: a folder or .zip with one sub-folder per class. "
        "mnist/fashion_mnist/cifar10: the root folder holding torchvision's files "
        "(default: $TORCHDECK_DATA or ./data).",
    )
    download: bool = Field(False, description="Let torchvision download mnist/fashion_mnist/cifar10 (needs internet).")
    val_fraction: float = Field(
        0.2, gt=0.0, lt=1.0, description="Fraction of the samples held out for validation (stratified, seeded)."
    )
    image_size: int | None = Field(
        None,
        ge=4,
        le=1024,
        description="Resize images to this square size; none keeps the dataset's size (imagefolder: 64).",
    )
    limit: int | None = Field(
        None, ge=2, le=100_000_000, description="Use at most this many samples (quick trials); none uses all."
    )
    normalize: bool = Field(True, description="Normalise with mean/std computed on the training split.")
    augment: AugmentSpec = Field(default_factory=AugmentSpec, description="Training-split augmentation.")
    # synthetic only
    num_classes: int = Field(10, ge=2, le=1000, description="synthetic: number of classes.")
    num_samples: int = Field(2000, ge=4, le=10_000_000, description="synthetic: number of samples.")
    channels: Literal[1, 3] = Field(3, description="synthetic: image channels (1 grayscale, 3 RGB).")
    size: int = Field(32, ge=4, le=512, description="synthetic: image height and width.")
    noise: float = Field(
        0.5, ge=0.0, le=10.0, description="synthetic: noise added to each class template (harder when larger)."
    )
    # imagefolder only
    max_bad_fraction: float = Field(
        0.05,
        ge=0.0,
        le=1.0,
        description="imagefolder: unreadable images are skipped and counted; "
        "above this fraction the dataset is refused.",
    )
    cache_mb: int = Field(
        2048,
        ge=0,
        le=262_144,
        description="Decode images once into memory when they fit in this many MB; larger sets decode per item.",
    )

    @model_validator(mode="after")
    def _path_when_needed(self) -> DataSpec:
        kind = catalog.dataset(self.name).kind
        if kind == "folder" and not self.path:
            raise ValueError("data.path is required for imagefolder: a folder or a .zip with one sub-folder per class")
        size = self.num_samples * self.channels * self.size * self.size
        if kind == "generated" and size > MAX_SYNTHETIC_BYTES:
            raise ValueError(
                f"data.num_samples × data.channels × data.size² is {size / 2**30:.1f} GB of images; at most "
                f"{MAX_SYNTHETIC_BYTES / 2**30:.0f} GB: lower data.num_samples or data.size"
            )
        return self
