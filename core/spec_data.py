"""The data section of a run spec: where the images come from, how they are split, preprocessed and augmented.
core/spec_sections.py re-exports it with the other sections; torch-free like them.
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field, model_validator

from core import catalog
from core.catalog import DATASET_NAMES
from core.spec_augment import AugmentSpec  # data.augment, in its own module
from core.spec_base import Section, registered
from core.spec_preprocess import PreprocessSpec

MAX_SYNTHETIC_BYTES = 4 << 30  # a synthetic set is generated in memory, as uint8 images
DEFAULT_TEST_FRACTION = 0.1  # the test split carved from an image folder that has no test/ folder
TestSplit = Literal["auto", "official", "folder", "fraction", "path", "none"]
DatasetName = Annotated[str, registered("dataset", DATASET_NAMES)]


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
    test_split: TestSplit = Field(
        "auto",
        description="The held-out test split, scored once at the end with the exported weights (never used to "
        "select anything). official: the torchvision dataset's own test split; folder: an imagefolder's test/ "
        "folder (beside train/ and an optional val/); fraction: data.test_fraction of the samples (stratified, "
        "seeded, carved before validation); path: the image folder data.test_path; none: no test split. "
        "auto: official for mnist/fashion_mnist/cifar10; for imagefolder data.test_path when given, else its "
        "test/ folder when it has one, else the fraction; for digits and synthetic the fraction only when "
        "data.test_fraction is set. data.limit caps a test split read from elsewhere too.",
    )
    test_fraction: float | None = Field(
        None,
        ge=0.0,
        lt=1.0,
        description="Fraction of the samples held out for the test split when it is carved from the data "
        f"(stratified, seeded). None: {DEFAULT_TEST_FRACTION} for imagefolder and for test_split=fraction, "
        "0 (no test split) for digits and synthetic under auto.",
    )
    test_path: str | None = Field(
        None,
        max_length=4096,
        description="imagefolder: another folder or .zip with the same class sub-folders, used as the test split "
        "(test_split=path, or auto).",
    )
    image_size: int | None = Field(
        None,
        ge=4,
        le=1024,
        description="The model's input side: the centre crop (a training crop) of the images, stored with their "
        "shorter side resized to this × data.preprocess.resize_ratio; none: the pretrained weights' (e.g. 224), "
        "else the dataset's own size (imagefolder: 64).",
    )
    limit: int | None = Field(
        None, ge=2, le=100_000_000, description="Use at most this many samples (quick trials); none uses all."
    )
    normalize: bool = Field(
        True,
        description="Normalise with mean/std (the training split's, the pretrained weights' or "
        "data.preprocess.mean/std); false: pixels scaled to 0-1 only.",
    )
    preprocess: PreprocessSpec = Field(
        default_factory=PreprocessSpec,
        description="Resize, crop and normalisation: the pretrained weights' or the dataset's, and overrides.",
    )
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
        description="imagefolder: keep the decoded images in memory when they fit in this many MB; larger sets "
        "are served from the on-disk image cache (or decoded per batch when it is off).",
    )
    disk_cache: bool = Field(
        True,
        description="imagefolder: decode the images once into this machine's on-disk image cache "
        "($TORCHDECK_IMAGE_CACHE, else image-cache/ in the data folder), reused by later epochs and runs.",
    )

    @model_validator(mode="after")
    def _path_when_needed(self) -> DataSpec:
        kind = catalog.dataset(self.name).kind
        _preprocess_fits(self, kind)
        if kind == "folder" and not self.path:
            raise ValueError("data.path is required for imagefolder: a folder or a .zip with one sub-folder per class")
        size = self.num_samples * self.channels * self.size * self.size
        if kind == "generated" and size > MAX_SYNTHETIC_BYTES:
            raise ValueError(
                f"data.num_samples × data.channels × data.size² is {size / 2**30:.1f} GB of images; at most "
                f"{MAX_SYNTHETIC_BYTES / 2**30:.0f} GB: lower data.num_samples or data.size"
            )
        return self

    @model_validator(mode="after")
    def _test_split_fits(self) -> DataSpec:
        _test_split_fits(self, catalog.dataset(self.name).kind)
        return self

    @property
    def carved_test_fraction(self) -> float:
        """The fraction carved for the test split when it comes from the data itself (test_split fraction, or auto
        without an official split, a test/ folder or a test path): the field, else its documented default."""
        if self.test_fraction is not None:
            return self.test_fraction
        kind = catalog.dataset(self.name).kind
        return DEFAULT_TEST_FRACTION if self.test_split == "fraction" or kind == "folder" else 0.0


def _test_split_fits(data: DataSpec, kind: str) -> None:
    """Refuse a test split the dataset cannot have, and settings it would silently ignore."""
    split, fraction = data.test_split, data.test_fraction
    if split == "official" and kind != "torchvision":
        raise ValueError(
            f"data.test_split=official: {data.name} has no official test split (only "
            f"{', '.join(catalog.datasets_of('torchvision'))} do); use fraction, or none"
        )
    if split == "folder" and kind != "folder":
        raise ValueError("data.test_split=folder reads an imagefolder's test/ folder; data.name is " + data.name)
    if data.test_path is not None and kind != "folder":
        raise ValueError("data.test_path is an image folder with the same classes: only for data.name=imagefolder")
    if data.test_path is not None and split not in ("auto", "path"):
        raise ValueError(f"data.test_path is set but data.test_split={split} does not read it: use path (or auto)")
    if split == "path" and not data.test_path:
        raise ValueError("data.test_split=path needs data.test_path: a folder or .zip with the same class sub-folders")
    reads_fraction = split == "fraction" or (split == "auto" and kind in ("builtin", "generated", "folder"))
    if fraction is not None and fraction > 0 and not reads_fraction:
        why = "uses the official test split" if kind == "torchvision" else f"test_split={split}"
        raise ValueError(f"data.test_fraction is set but {data.name} {why}: set data.test_split=fraction to carve it")
    if split == "fraction" and fraction == 0:
        raise ValueError("data.test_split=fraction with data.test_fraction=0 holds nothing out: use none instead")
    # An imagefolder's default 0.1 applies only when the folder has no test/ folder, which is known at load
    # (core/splits.py checks it there); here only what the spec itself says.
    stated = split == "fraction" or (fraction is not None and kind != "folder") or (kind == "folder" and fraction)
    carved = data.carved_test_fraction if reads_fraction and stated else 0.0
    if data.val_fraction + carved >= 1:
        raise ValueError(
            f"data.val_fraction ({data.val_fraction}) + data.test_fraction ({carved}) is {data.val_fraction + carved:g}"
            ": together they must leave samples to train on (below 1)"
        )


def _preprocess_fits(data: DataSpec, kind: str) -> None:
    """data.preprocess.mean/std need normalisation on, and as many values as a synthetic set's channels (or 1)."""
    mean = data.preprocess.mean
    if mean is None:
        return
    if not data.normalize:
        raise ValueError("data.preprocess.mean/std are set but data.normalize is false: drop them or normalise")
    if kind == "generated" and len(mean) not in (1, data.channels):
        raise ValueError(
            f"data.preprocess.mean/std have {len(mean)} values but data.channels is {data.channels}: give 1 or "
            f"{data.channels}"
        )
