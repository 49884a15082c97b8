"""Which preprocessing a run uses: the input size, the resize before the centre crop, its interpolation and the
mean/std, chosen from the weights the model starts from (torchvision's published preprocessing through the
catalog, or the one a torchdeck checkpoint recorded) or from the dataset, each overridable by the spec
(data.image_size, data.preprocess.*). core/data.py's load_data applies the choice and records it in
DataInfo.preprocessing; the export metadata, the bundle's predict.py and the Run page read that record.

Torch-free: reading a checkpoint's record is the caller's (core/checkpoint.py read_data_info).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import PurePath
from typing import Any

from core import catalog
from core.spec_sections import DataSpec, ModelSpec

DEFAULT_INTERPOLATION = "bilinear"


class PreprocessError(ValueError):
    """A preprocessing the data cannot take (e.g. 3 mean values for grayscale images), naming the field."""


@dataclass(frozen=True)
class WeightsPreprocessing:
    """What pretrained weights expect: where they come from, and their input size, resize, mean/std."""

    source: str  # "weights" (a library's pretrained weights) or "checkpoint" (a torchdeck run's)
    label: str  # e.g. "torchvision resnet18 IMAGENET1K_V1", "torchdeck checkpoint best.pt"
    image_size: int
    resize: int
    mean: tuple[float, ...]
    std: tuple[float, ...]
    interpolation: str


@dataclass(frozen=True)
class Plan:
    """The preprocessing chosen for a run, before the data is read: None where the data decides (its own side,
    the training split's statistics)."""

    source: str  # "weights", "checkpoint" or "dataset": whose defaults apply
    weights: str  # the weights' label; "" for the dataset
    image_size: int | None  # the input side (the centre crop); None: the data's own side
    resize_ratio: float  # the stored (resized) side over the input side
    interpolation: str
    mean: tuple[float, ...] | None  # None: measured on the training split (or 0 without normalisation)
    std: tuple[float, ...] | None
    stats_from: str  # "weights", "checkpoint", "spec", "training split" or "none"
    overridden: tuple[str, ...]  # the spec fields that replaced the source's value

    def stored(self, image_size: int) -> int:
        """The side images are stored at: shorter side resized to it, centre-cropped square."""
        return max(image_size, round(image_size * self.resize_ratio))


def from_checkpoint(data_info: dict[str, Any] | None, label: str) -> WeightsPreprocessing | None:
    """The preprocessing a torchdeck checkpoint's data_info records; None when it does not say (a plain
    state_dict, or a data_info without size and statistics)."""
    if not isinstance(data_info, dict) or not all(k in data_info for k in ("image_size", "mean", "std")):
        return None
    size = int(data_info["image_size"])
    rec = data_info.get("preprocessing") or {}  # checkpoints before preprocessing was recorded: no margin
    return WeightsPreprocessing(
        "checkpoint",
        label,
        size,
        int(rec.get("resize", size)),
        tuple(float(v) for v in data_info["mean"]),
        tuple(float(v) for v in data_info["std"]),
        str(rec.get("interpolation", DEFAULT_INTERPOLATION)),
    )


def of_weights(
    model: ModelSpec | None,
    checkpoint_info: dict[str, Any] | None = None,
    library: catalog.Preprocessing | None = None,
) -> WeightsPreprocessing | None:
    """The preprocessing of the weights `model` starts from: a model.weights_file's recorded one (a torchdeck
    checkpoint, read by the caller into `checkpoint_info`), else for model.pretrained the catalog's, or
    `library`'s for a model the catalog does not list (a timm name: its pretrained_cfg, read by the caller);
    None when the model starts from no weights that say."""
    if model is None:
        return None
    # named by its last folders (e.g. <run>/checkpoints/best.pt): the record travels into exported files
    label = f"torchdeck checkpoint {'/'.join(PurePath(model.weights_file or '').parts[-3:])}"
    if model.weights_file and (found := from_checkpoint(checkpoint_info, label)):
        return found
    entry = catalog.model(model.name)
    p = entry.weights.preprocessing if entry.weights is not None else library
    if model.pretrained and p is not None:
        named = model.name if model.name.startswith(f"{entry.library}/") else f"{entry.library} {model.name}"
        return WeightsPreprocessing(
            "weights",
            f"{named} {entry.weights.name if entry.weights else 'pretrained'}",  # torchvision resnet18 IMAGENET1K_V1
            p.input_size,
            p.resize_size,
            tuple(p.mean),
            tuple(p.std),
            p.interpolation,
        )
    return None


def choose(
    data: DataSpec,
    model: ModelSpec | None,
    checkpoint_info: dict[str, Any] | None = None,
    library: catalog.Preprocessing | None = None,
) -> Plan:
    """The run's preprocessing: the weights' (data.preprocess.source auto or weights; `checkpoint_info` and
    `library` as of_weights takes them) or the dataset's, with data.image_size and data.preprocess.* replacing
    what they set."""
    pre = data.preprocess
    found = None if pre.source == "dataset" else of_weights(model, checkpoint_info, library)
    if pre.source == "weights" and found is None:
        raise PreprocessError(
            "data.preprocess.source is weights but the model starts from no pretrained weights that record their "
            "preprocessing: set model.pretrained, or a model.weights_file that is a torchdeck checkpoint"
        )
    overridden = [
        name
        for name, value in (
            ("data.image_size", data.image_size),
            ("data.preprocess.resize_ratio", pre.resize_ratio),
            ("data.preprocess.interpolation", pre.interpolation),
            ("data.preprocess.mean/std", pre.mean),
        )
        if value is not None
    ]
    ratio = pre.resize_ratio or (found.resize / found.image_size if found else 1.0)
    mean, std, stats_from = _statistics(data, found)
    return Plan(
        source=found.source if found else "dataset",
        weights=found.label if found else "",
        image_size=data.image_size or (found.image_size if found else None),
        resize_ratio=ratio,
        interpolation=pre.interpolation or (found.interpolation if found else DEFAULT_INTERPOLATION),
        mean=mean,
        std=std,
        stats_from=stats_from,
        overridden=tuple(overridden),
    )


def _statistics(
    data: DataSpec, found: WeightsPreprocessing | None
) -> tuple[tuple[float, ...] | None, tuple[float, ...] | None, str]:
    if not data.normalize:
        return None, None, "none"
    if data.preprocess.mean is not None and data.preprocess.std is not None:
        return tuple(data.preprocess.mean), tuple(data.preprocess.std), "spec"
    if found is not None:
        return found.mean, found.std, found.source
    return None, None, "training split"


def per_channel(values: tuple[float, ...], channels: int, field: str, average: bool) -> list[float]:
    """`values` for `channels` channels: one value repeated; three for grayscale averaged when `average` (the
    weights' RGB statistics on grayscale images repeated to RGB by the model), else refused naming `field`."""
    if len(values) == channels:
        return [float(v) for v in values]
    if len(values) == 1:
        return [float(values[0])] * channels
    if channels == 1 and average:
        return [sum(values) / len(values)]
    raise PreprocessError(
        f"{field} has {len(values)} values but the images have {channels} channel(s): give 1 or {channels}"
    )


def record(plan: Plan, image_size: int, mean: list[float], std: list[float]) -> dict[str, Any]:
    """DataInfo.preprocessing: what was used, as plain data (checkpoints, events, export metadata)."""
    return {
        "source": plan.source,
        "weights": plan.weights,
        "image_size": image_size,
        "resize": plan.stored(image_size),
        "crop": "centre",
        "interpolation": plan.interpolation,
        "mean": list(mean),
        "std": list(std),
        "stats_from": plan.stats_from,
        "overridden": list(plan.overridden),
    }


def describe(rec: dict[str, Any]) -> str:
    """One sentence for people: which preprocessing a run used (the Run page, logs)."""
    if not rec:
        return "not recorded (a run from before torchdeck recorded its preprocessing)"
    size, resize = rec.get("image_size"), rec.get("resize", rec.get("image_size"))
    whose = {
        "weights": f"the pretrained weights' ({rec.get('weights')})",
        "checkpoint": f"the checkpoint's ({rec.get('weights')})",
    }.get(rec.get("source", ""), "the dataset's")
    stats = {
        "spec": "set in data.preprocess",
        "training split": "measured on the training split",
        "weights": "the weights'",
        "checkpoint": "the checkpoint's",
        "none": "none (data.normalize is false)",
    }.get(rec.get("stats_from", ""), "")
    mean = ", ".join(f"{v:.3f}" for v in rec.get("mean", []))
    std = ", ".join(f"{v:.3f}" for v in rec.get("std", []))
    text = (
        f"{whose}: shorter side resized to {resize} px ({rec.get('interpolation', DEFAULT_INTERPOLATION)}), centre "
        f"crop {size}×{size}; mean ({mean}), std ({std}): {stats}"
    )
    if rec.get("overridden"):
        text += f"; overridden by {', '.join(rec['overridden'])}"
    return text


def as_recorded(data: DataSpec, rec: dict[str, Any]) -> DataSpec:
    """`data` set to reproduce a recorded preprocessing exactly (an export from a checkpoint: the weights file
    the run started from may be gone by then); the caller restores the record itself."""
    size = int(rec["image_size"])
    pre = data.preprocess.model_copy(
        update={
            "source": "dataset",
            "mean": list(rec["mean"]),
            "std": list(rec["std"]),
            "resize_ratio": int(rec.get("resize", size)) / size,
            "interpolation": rec.get("interpolation", DEFAULT_INTERPOLATION),
        }
    )
    return data.model_copy(update={"image_size": size, "preprocess": pre})
