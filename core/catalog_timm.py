"""The timm models the New run form offers (core/catalog.py turns each into a MODELS entry `timm/<arch>`), by
family, as plain data copied from timm 1.0.31: the default pretrained weights' tag and preprocessing (its
pretrained_cfg: crop side, the resize before the crop = floor(crop / crop_pct), mean, std, interpolation), the
backbone stages as core.timm_models.timm_stages derives them from feature_info, the head's module path
(get_classifier()), and the size (backbone parameters, head features, and the activation bytes per pixel measured at
112 px: within 20 % from 32 to 224 px, where a figure taken at 224 px would miss the small sizes' fixed costs).
tests/core/test_timm_models.py checks every value against the installed timm, so they cannot drift.

Any other timm name works in YAML (`model.name: timm/<name>`); these are the ones the form lists. Torch-free.
"""

from __future__ import annotations

import re
from typing import Any

TIMM_PREFIX = "timm/"  # model.name: timm/<any timm.list_models() name>, a pretrained tag allowed (<arch>.<tag>)
TIMM_FAMILY = "timm"  # the family of a timm model the catalog does not list (core/models.py builds all timm ones)
TIMM_NAME = re.compile(r"[a-z0-9_]+(\.[a-z0-9_]+)?")  # how timm spells its names

IMAGENET = ((0.485, 0.456, 0.406), (0.229, 0.224, 0.225))
INCEPTION = ((0.5, 0.5, 0.5), (0.5, 0.5, 0.5))

_CONVNEXT = (("stages.0", ("stem", "stages.0")), *((f"stages.{i}", (f"stages.{i}",)) for i in (1, 2)))
_CONVNEXT_STAGES = (*_CONVNEXT, ("stages.3", ("stages.3", "head.norm")))
_REGNETY_STAGES = (("stem", ("stem",)), *((f"s{i}", (f"s{i}",)) for i in range(1, 5)))
_VIT_STAGES = (
    ("blocks.0", ("patch_embed", "blocks.0")),
    *((f"blocks.{i}", (f"blocks.{i}",)) for i in range(1, 11)),
    ("blocks.11", ("blocks.11", "norm")),
)

# arch: (family, label, weights tag, stages ((name, module paths), …), head, (crop, resize, (mean, std),
# interpolation), (backbone parameters, head features, activation bytes per pixel))
TIMM_CURATED: dict[str, tuple] = {
    "convnextv2_atto": (
        "convnextv2",
        "ConvNeXt-V2",
        "fcmae_ft_in1k",
        _CONVNEXT_STAGES,
        "head.fc",
        (224, 256, IMAGENET, "bicubic"),
        (3_387_400, 320, 954),
    ),
    "convnextv2_femto": (
        "convnextv2",
        "ConvNeXt-V2",
        "fcmae_ft_in1k",
        _CONVNEXT_STAGES,
        "head.fc",
        (224, 256, IMAGENET, "bicubic"),
        (4_848_240, 384, 1142),
    ),
    "tf_efficientnetv2_b0": (
        "efficientnetv2",
        "EfficientNetV2",
        "in1k",
        (
            ("blocks.0", ("conv_stem", "bn1", "blocks.0")),
            ("blocks.1", ("blocks.1",)),
            ("blocks.2", ("blocks.2",)),
            ("blocks.4", ("blocks.3", "blocks.4")),
            ("blocks.5", ("blocks.5", "conv_head", "bn2")),
        ),
        "classifier",
        (192, 219, IMAGENET, "bicubic"),
        (5_858_704, 1280, 1320),
    ),
    "regnety_002": (
        "regnety",
        "RegNetY",
        "pycls_in1k",
        _REGNETY_STAGES,
        "head.fc",
        (224, 256, IMAGENET, "bicubic"),
        (2_793_996, 368, 403),
    ),
    "regnety_004": (
        "regnety",
        "RegNetY",
        "tv2_in1k",
        _REGNETY_STAGES,
        "head.fc",
        (224, 232, IMAGENET, "bicubic"),
        (3_903_144, 440, 703),
    ),
    "mobilenetv4_conv_small": (
        "mobilenetv4",
        "MobileNetV4",
        "e2400_r224_in1k",
        (
            ("stem", ("conv_stem", "bn1")),
            ("blocks.0", ("blocks.0",)),
            ("blocks.1", ("blocks.1",)),
            ("blocks.2", ("blocks.2",)),
            ("blocks.4", ("blocks.3", "blocks.4", "conv_head", "norm_head")),
        ),
        "classifier",
        (224, 256, IMAGENET, "bicubic"),
        (2_493_024, 1280, 352),
    ),
    "vit_tiny_patch16_224": (
        "vit",
        "ViT",
        "augreg_in21k_ft_in1k",
        _VIT_STAGES,
        "head",
        (224, 248, INCEPTION, "bicubic"),
        (5_524_416, 192, 604),
    ),
    "deit_tiny_patch16_224": (
        "vit",
        "ViT",
        "fb_in1k",
        _VIT_STAGES,
        "head",
        (224, 248, IMAGENET, "bicubic"),
        (5_524_416, 192, 604),
    ),
}


def timm_arch(name: str) -> str:
    """timm's name of model `timm/<arch>`."""
    return name[len(TIMM_PREFIX) :]


def timm_entries() -> dict[str, Any]:
    """The curated models as core/catalog.py's entries `timm/<arch>`: their default pretrained weights (timm's name
    `<arch>.<tag>`, the hub file model.safetensors), stages, head and footprint. Called by core/catalog.py once
    its dataclasses exist (hence the import here)."""
    from core.catalog import Footprint, ModelEntry, Preprocessing, Stage, Weights

    out = {}
    for arch, (family, label, tag, stages, head, pre, size) in TIMM_CURATED.items():
        side, resize, (mean, std), interpolation = pre
        weights = Weights(f"{arch}.{tag}", "model.safetensors", Preprocessing(side, resize, mean, std, interpolation))
        stages = tuple(Stage(n, m) for n, m in stages)
        out[TIMM_PREFIX + arch] = ModelEntry(
            family, "timm", arch, stages, head, weights=weights, footprint=Footprint(*size), label=label
        )
    return out
