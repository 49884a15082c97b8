"""data.augment: the training-split augmentation (core/augment.py applies it); core/spec_data.py puts it into the
data section. Torch-free like every spec module."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, field_validator

from core.spec_base import Section

Policy = Literal["none", "trivial", "randaugment"]


class AugmentSpec(Section):
    """Augmentation applied to the training split only; validation never sees it. Every sample draws its own
    parameters."""

    random_crop: bool = Field(
        False,
        description="Random crop of the original size after zero padding (small images such as digits; "
        "photos want random_resized_crop instead, which replaces it).",
    )
    crop_padding: int = Field(4, ge=0, le=64, description="Padding in pixels added before the random crop.")
    random_resized_crop: bool = Field(
        False,
        description="RandomResizedCrop: each sample is a random box of the stored image (its area a random "
        "fraction in rrc_scale, its aspect ratio in rrc_ratio) resized to the input size. The standard crop "
        "for photos; it replaces random_crop and the centre crop.",
    )
    rrc_scale: tuple[float, float] = Field(
        (0.08, 1.0),
        description="random_resized_crop: the smallest and largest area of the box, as fractions of the image "
        "(0.08–1 is ImageNet's; fine-tuning on few photos often keeps more, e.g. 0.25–1).",
    )
    rrc_ratio: tuple[float, float] = Field(
        (3 / 4, 4 / 3), description="random_resized_crop: the smallest and largest aspect ratio (width / height)."
    )
    hflip: bool = Field(
        False, description="Random horizontal flip with probability 0.5 (off by default: digits are not symmetric)."
    )
    policy: Policy = Field(
        "none",
        description="Automatic augmentation after the crop and flip (torchvision's operations): trivial — "
        "TrivialAugment, one random operation at a random strength per sample, nothing to tune; randaugment — "
        "num_ops random operations per sample at the strength `magnitude`; none.",
    )
    magnitude: int = Field(
        9, ge=0, le=30, description="randaugment: strength of every operation, 0 (none) to 30 (strongest)."
    )
    num_ops: int = Field(2, ge=1, le=6, description="randaugment: operations applied one after another per sample.")
    color_jitter: float = Field(
        0.0, ge=0.0, le=1.0, description="Strength of random brightness/contrast jitter; 0 disables it."
    )
    random_erasing: float = Field(
        0.0,
        ge=0.0,
        le=1.0,
        description="Random erasing: probability that a sample gets a random box (2–33 % of its area, aspect "
        "0.3–3.3) filled with a random colour; 0 disables it (0.25 is the usual value).",
    )

    @field_validator("rrc_scale")
    @classmethod
    def _scale_range(cls, v: tuple[float, float]) -> tuple[float, float]:
        if not 0.0 < v[0] <= v[1] <= 1.0:
            raise ValueError("must be (min, max) with 0 < min ≤ max ≤ 1: fractions of the image's area")
        return v

    @field_validator("rrc_ratio")
    @classmethod
    def _ratio_range(cls, v: tuple[float, float]) -> tuple[float, float]:
        if not 0.0 < v[0] <= v[1] <= 10.0:
            raise ValueError("must be (min, max) with 0 < min ≤ max ≤ 10: aspect ratios, width / height")
        return v

    @property
    def active(self) -> bool:
        """Whether any augmentation is on (no augmentation: a device-resident split is normalised once)."""
        return (
            self.random_crop
            or self.random_resized_crop
            or self.hflip
            or self.policy != "none"
            or self.color_jitter > 0
            or self.random_erasing > 0
        )
