"""The `data.preprocess` section of a run spec: where the input size, the resize before the crop, the
interpolation and the normalisation come from, and the overrides of each. core/preprocessing.py applies it;
torch-free like every spec section.
"""

from __future__ import annotations

import math
from typing import Literal

from pydantic import Field, field_validator, model_validator

from core.spec_base import Section

INTERPOLATIONS = ("bilinear", "bicubic", "nearest")
Interpolation = Literal["bilinear", "bicubic", "nearest"]


class PreprocessSpec(Section):
    """How images become the model's input: the shorter side resized, a centre crop of the input size
    (data.image_size), then (x - mean) / std per channel. By default a model that starts from pretrained weights
    gets its weights' preprocessing, and any other model the dataset's."""

    source: Literal["auto", "weights", "dataset"] = Field(
        "auto",
        description="auto: the preprocessing of the weights the model starts from (model.pretrained, or a "
        "model.weights_file that is a torchdeck checkpoint: input size, resize before the crop, interpolation, "
        "mean/std) when there are any, else the dataset's; weights: the weights' (refused when the model starts from "
        "none); dataset: the dataset's own size and the training split's mean/std, even for pretrained weights.",
    )
    mean: list[float] | None = Field(
        None,
        min_length=1,
        max_length=3,
        description="Per-channel mean subtracted after scaling pixels to 0-1: 1 value (every channel) or 3 (RGB); "
        "none: the chosen source's (the weights', or the training split's).",
    )
    std: list[float] | None = Field(
        None,
        min_length=1,
        max_length=3,
        description="Per-channel standard deviation divided by after the mean: 1 value or 3 (RGB), each > 0; "
        "none: the chosen source's.",
    )
    resize_ratio: float | None = Field(
        None,
        ge=1.0,
        le=4.0,
        description="Images are stored with their shorter side resized to input size × this and centre-cropped "
        "square; evaluation then takes the centre crop of the input size (training: its crop). None: the weights' "
        "resize/crop (e.g. 256/224), or 1 (no margin) for the dataset.",
    )
    interpolation: Interpolation | None = Field(
        None,
        description="Interpolation of the resize: bilinear, bicubic or nearest; none: the weights' (else bilinear).",
    )

    @field_validator("mean", "std", mode="before")
    @classmethod
    def _empty_is_none(cls, values: object) -> object:
        return None if values == [] else values  # a list left empty (the form's text box): the source's

    @field_validator("mean", "std")
    @classmethod
    def _finite(cls, values: list[float] | None) -> list[float] | None:
        if values is not None and not all(math.isfinite(v) for v in values):
            raise ValueError("every value must be a finite number")
        if values is not None and len(values) == 2:
            raise ValueError("give 1 value (every channel) or 3 (one per RGB channel), not 2")
        return values

    @field_validator("std")
    @classmethod
    def _positive(cls, values: list[float] | None) -> list[float] | None:
        if values is not None and not all(v > 0 for v in values):
            raise ValueError("every standard deviation must be > 0")
        return values

    @model_validator(mode="after")
    def _both_or_neither(self) -> PreprocessSpec:
        if (self.mean is None) != (self.std is None):
            given, missing = ("mean", "std") if self.mean is not None else ("std", "mean")
            raise ValueError(f"data.preprocess.{given} is set but data.preprocess.{missing} is not: give both")
        if self.mean is not None and self.std is not None and len(self.mean) != len(self.std):
            raise ValueError(
                f"data.preprocess.mean has {len(self.mean)} value(s) and data.preprocess.std {len(self.std)}: "
                "give the same number (1 or 3)"
            )
        return self
