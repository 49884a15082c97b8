"""What the New run form shows, and in which words: each field's label (and unit), whether it matters for
the choices made (dataset, model, transfer mode, optimizer, schedule, clipping), and whether it is a rarely
changed one that waits under "Advanced". Plain functions, no Streamlit and no torch: which models have pretrained
weights or a hidden layer, and which datasets read files, come from core/catalog.py (torch-free)."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from core import catalog

# The choices that decide which fields matter; the form shows them first, where a change takes effect at once.
CHOOSERS: tuple[str, ...] = (
    "data.name",
    "model.name",
    "model.transfer",
    "optim.name",
    "schedule.name",
    "train.grad_clip.mode",
)

LABELS: dict[str, str] = {
    "name": "Run name",
    "data.name": "Dataset",
    "data.path": "Data folder or .zip",
    "data.download": "Download the dataset",
    "data.val_fraction": "Validation fraction",
    "data.test_split": "Held-out test split",
    "data.test_fraction": "Test fraction",
    "data.test_path": "Test folder or .zip (same classes)",
    "data.image_size": "Input size",
    "data.limit": "Use at most (samples)",
    "data.normalize": "Normalise (mean/std)",
    "data.preprocess.source": "Preprocessing from",
    "data.preprocess.mean": "Mean per channel",
    "data.preprocess.std": "Standard deviation per channel",
    "data.preprocess.resize_ratio": "Resize before the crop (× input size)",
    "data.preprocess.interpolation": "Resize interpolation",
    "data.augment.random_crop": "Random crop",
    "data.augment.crop_padding": "Crop padding",
    "data.augment.hflip": "Random horizontal flip",
    "data.augment.color_jitter": "Colour jitter strength",
    "data.augment.random_resized_crop": "Random resized crop",
    "data.augment.rrc_scale": "Crop area (fraction of the image, min and max)",
    "data.augment.rrc_ratio": "Crop aspect ratio (min and max)",
    "data.augment.policy": "Automatic augmentation",
    "data.augment.magnitude": "RandAugment strength",
    "data.augment.num_ops": "RandAugment operations per image",
    "data.augment.random_erasing": "Random erasing probability",
    "data.num_classes": "Number of classes",
    "data.num_samples": "Number of samples",
    "data.channels": "Channels",
    "data.size": "Image size",
    "data.noise": "Noise",
    "data.max_bad_fraction": "Unreadable images allowed (fraction)",
    "data.cache_mb": "Decode into memory up to",
    "data.disk_cache": "Keep decoded images in this machine's image cache",
    "model.name": "Model",
    "model.pretrained": "Start from pretrained weights",
    "model.weights_file": "Start from a weights file",
    "model.transfer": "Transfer learning",
    "model.keep_head": "Keep the weights file's classifier head",
    "model.last_n": "Backbone stages to train",
    "model.unfreeze_at_epoch": "Unfreeze the whole backbone at epoch",
    "model.unfreeze_every": "Unfreeze one more stage every",
    "model.backbone_lr_mult": "Backbone learning-rate multiplier",
    "model.lr_decay": "Learning-rate factor per stage further from the head",
    "model.dropout": "Dropout before the head",
    "model.hidden": "Hidden layer width",
    "model.gradient_checkpointing": "Gradient checkpointing (less memory, slower)",
    "optim.name": "Optimizer",
    "optim.lr": "Learning rate",
    "optim.weight_decay": "Weight decay",
    "optim.momentum": "Momentum",
    "optim.nesterov": "Nesterov momentum",
    "optim.betas": "Adam betas",
    "optim.decay_norm_and_bias": "Weight decay on norms and biases too",
    "schedule.name": "Learning-rate schedule",
    "schedule.warmup_epochs": "Warmup",
    "schedule.step_size": "Decay every",
    "schedule.milestones": "Decay at epochs",
    "schedule.gamma": "Decay factor",
    "schedule.min_lr": "Lowest learning rate",
    "schedule.patience": "Wait before decaying",
    "schedule.pct_start": "Share of steps spent warming up",
    "train.epochs": "Epochs (at most)",
    "train.batch_size": "Batch size",
    "train.accumulate": "Accumulate gradients over (batches)",
    "train.precision": "Precision",
    "train.grad_clip.mode": "Clip gradients by",
    "train.grad_clip.max": "Max norm",
    "train.label_smoothing": "Label smoothing",
    "train.early_stopping.enabled": "Stop early",
    "train.early_stopping.monitor": "Watch metric",
    "train.early_stopping.mode": "Better is",
    "train.early_stopping.patience": "Wait before stopping",
    "train.early_stopping.min_delta": "Smallest improvement",
    "train.steps_per_epoch": "Batches per epoch (at most)",
    "train.log_every": "Log every (steps)",
    "train.diag_every": "Layer diagnostics every (steps)",
    "train.overfit_check": "Check first that one batch can be overfit",
    "train.overfit_steps": "Overfit check length (steps)",
    "train.detect_anomaly": "Name the operation behind a non-finite loss",
    "train.mix.mixup_alpha": "Mixup alpha",
    "train.mix.cutmix_alpha": "Cutmix alpha",
    "train.mix.prob": "Share of batches mixed",
    "train.mix.switch_prob": "Share of mixed batches that use cutmix",
    "train.ema.enabled": "Moving average of the weights (EMA)",
    "train.ema.decay": "EMA decay per step",
    "train.ema.warmup": "EMA warmup",
    "train.class_weights": "Class weights in the training loss",
    "train.sampler": "Order of the training samples",
    "train.lr_finder.enabled": "LR range test before training",
    "train.lr_finder.start_lr": "LR range test: first learning rate",
    "train.lr_finder.end_lr": "LR range test: last learning rate",
    "train.lr_finder.steps": "LR range test: steps",
    "checkpoint.save_last": "Save the last checkpoint every epoch",
    "checkpoint.save_best": "Save the best checkpoint",
    "export.formats": "Export formats",
    "export.checkpoint": "Export the weights of",
    "export.atol": "Largest logit difference allowed",
    "export.parity_samples": "Samples for the parity check",
    "export.opset": "ONNX opset",
    "loader.num_workers": "Loader processes",
    "loader.pin_memory": "Pinned host memory",
    "loader.device_cache_mb": "Keep on the device up to",
    "resources.gpus": "GPUs (processes) for this run",
    "seed": "Seed",
    "deterministic": "Deterministic algorithms (slower)",
    "device": "Device",
    "compile": "torch.compile the model",
    "channels_last": "channels_last memory format",
}

UNITS: dict[str, str] = {
    "data.image_size": "px",
    "data.augment.crop_padding": "px",
    "data.size": "px",
    "data.cache_mb": "MB",
    "loader.device_cache_mb": "MB",
    "schedule.warmup_epochs": "epochs",
    "model.unfreeze_every": "epochs",
    "schedule.step_size": "epochs",
    "schedule.patience": "epochs",
    "train.early_stopping.patience": "epochs",
}

_ADVANCED_PREFIXES = ("loader.", "checkpoint.")
_ADVANCED: frozenset[str] = frozenset(
    {
        "data.max_bad_fraction",
        "data.cache_mb",
        "data.disk_cache",
        "data.normalize",
        "data.preprocess.mean",
        "data.preprocess.std",
        "data.preprocess.resize_ratio",
        "data.preprocess.interpolation",
        "model.gradient_checkpointing",
        "model.keep_head",
        "model.lr_decay",
        "optim.decay_norm_and_bias",
        "train.early_stopping.mode",
        "train.early_stopping.min_delta",
        "train.diag_every",
        "train.overfit_check",
        "train.overfit_steps",
        "train.detect_anomaly",
        "data.augment.rrc_ratio",
        "train.ema.warmup",
        "train.lr_finder.start_lr",
        "train.lr_finder.end_lr",
        "train.lr_finder.steps",
        "export.atol",
        "export.parity_samples",
        "export.opset",
        "deterministic",
        "compile",
        "channels_last",
        # Most runs use one GPU; more asks for a worker owning that many (torchdeck worker --gpus ... --multi-gpu).
        "resources.gpus",
    }
)


def label(path: str) -> str:
    """The field's label in words, with its unit in brackets where it has one."""
    text = LABELS.get(path) or path.split(".")[-1].replace("_", " ")
    unit = UNITS.get(path)
    return f"{text} ({unit})" if unit else text


def option_label(path: str, value: Any) -> str:
    """A choice as the form lists it: a timm model with its family (`timm/convnextv2_atto · ConvNeXt-V2`, the
    catalog listing each family's together); any other value as itself."""
    entry = catalog.MODELS.get(value) if path == "model.name" and isinstance(value, str) else None
    return f"{value} · {entry.label}" if entry is not None and entry.label else str(value)


def choice_options(path: str, options: tuple[Any, ...], current: Any) -> list[Any]:
    """The choices a select box offers: the schema's, and a spec's own timm model when it is one the form does not
    list (YAML takes any timm name), so that loading that spec keeps its model instead of the first choice."""
    out = list(options)
    if path == "model.name" and isinstance(current, str) and current.startswith(catalog.TIMM_PREFIX):
        out += [current] if current not in out else []
    return out


def advanced(path: str) -> bool:
    """A rarely changed field: shown under its section's "Advanced"."""
    return path in _ADVANCED or path.startswith(_ADVANCED_PREFIXES)


def _has_weights(v: Mapping[str, Any]) -> bool:
    """The model has pretrained weights: the catalog says, or timm will (any timm model a spec names)."""
    name = v.get("model.name")
    return name in catalog.PRETRAINED_MODELS or str(name or "").startswith(catalog.TIMM_PREFIX)


def _transferring(v: Mapping[str, Any]) -> bool:
    return _has_weights(v) or bool(v.get("model.weights_file"))


def _is(path: str, *names: str) -> Callable[[Mapping[str, Any]], bool]:
    return lambda v: v.get(path) in names


# field -> when it matters; a field not listed always does.
_RULES: dict[str, Callable[[Mapping[str, Any]], bool]] = {
    "data.path": _is("data.name", *catalog.datasets_of("folder", "torchvision")),
    "data.download": _is("data.name", *catalog.datasets_of("torchvision")),
    **{
        f"data.{k}": _is("data.name", *catalog.datasets_of("generated"))
        for k in ("num_classes", "num_samples", "channels", "size", "noise")
    },
    "data.max_bad_fraction": _is("data.name", *catalog.datasets_of("folder")),
    "data.test_fraction": lambda v: (
        v.get("data.test_split") == "fraction"
        or (v.get("data.test_split") == "auto" and v.get("data.name") not in catalog.datasets_of("torchvision"))
    ),
    "data.test_path": lambda v: (
        v.get("data.name") in catalog.datasets_of("folder") and v.get("data.test_split") in ("auto", "path")
    ),
    "data.cache_mb": _is("data.name", *catalog.datasets_of("folder")),
    "data.disk_cache": _is("data.name", *catalog.datasets_of("folder")),
    "model.hidden": _is("model.name", *catalog.HIDDEN_MODELS),
    "model.pretrained": _has_weights,
    "model.transfer": _transferring,
    "model.backbone_lr_mult": _transferring,
    "model.last_n": lambda v: _transferring(v) and v.get("model.transfer") == "finetune_last_n",
    "model.unfreeze_at_epoch": lambda v: (
        _transferring(v) and v.get("model.transfer") in ("feature_extract", "finetune_last_n")
    ),
    "model.unfreeze_every": lambda v: (
        _transferring(v) and v.get("model.transfer") in ("feature_extract", "finetune_last_n")
    ),
    "model.lr_decay": _transferring,
    "model.keep_head": lambda v: bool(v.get("model.weights_file")) and v.get("model.transfer") != "scratch",
    "optim.momentum": _is("optim.name", "sgd", "rmsprop"),
    "optim.nesterov": _is("optim.name", "sgd"),
    "optim.betas": _is("optim.name", "adam", "adamw"),
    "schedule.warmup_epochs": _is("schedule.name", "none", "step", "multistep", "cosine"),
    "schedule.step_size": _is("schedule.name", "step"),
    "schedule.milestones": _is("schedule.name", "multistep"),
    "schedule.gamma": _is("schedule.name", "step", "multistep", "plateau"),
    "schedule.min_lr": _is("schedule.name", "cosine", "plateau"),
    "schedule.patience": _is("schedule.name", "plateau"),
    "schedule.pct_start": _is("schedule.name", "onecycle"),
    "train.grad_clip.max": lambda v: v.get("train.grad_clip.mode") != "none",
    "data.augment.crop_padding": lambda v: bool(v.get("data.augment.random_crop")),
    "data.augment.rrc_scale": lambda v: bool(v.get("data.augment.random_resized_crop")),
    "data.augment.rrc_ratio": lambda v: bool(v.get("data.augment.random_resized_crop")),
    "data.augment.magnitude": _is("data.augment.policy", "randaugment"),
    "data.augment.num_ops": _is("data.augment.policy", "randaugment"),
    "train.mix.prob": lambda v: bool(v.get("train.mix.mixup_alpha") or v.get("train.mix.cutmix_alpha")),
    "train.mix.switch_prob": lambda v: bool(v.get("train.mix.mixup_alpha") and v.get("train.mix.cutmix_alpha")),
    "train.ema.decay": lambda v: bool(v.get("train.ema.enabled")),
    "train.ema.warmup": lambda v: bool(v.get("train.ema.enabled")),
    **{
        f"train.lr_finder.{k}": lambda v: bool(v.get("train.lr_finder.enabled"))
        for k in ("start_lr", "end_lr", "steps")
    },
}


def relevant(path: str, values: Mapping[str, Any]) -> bool:
    """Whether the field matters given the form's values ({dotted field: value})."""
    rule = _RULES.get(path)
    return rule is None or bool(rule(values))


def relevant_any(path: str, values: Mapping[str, Any], alternatives: Mapping[str, list[Any]]) -> bool:
    """relevant() for the values, or for any of the alternatives a swept chooser will also try."""
    if relevant(path, values):
        return True
    return any(
        relevant(path, {**values, chooser: option}) for chooser, options in alternatives.items() for option in options
    )


def choices_in_words(values: Mapping[str, Any]) -> str:
    """The choices that decide the form, as a short phrase: "digits · simple_cnn · adam · no schedule"."""
    schedule = values.get("schedule.name")
    parts = [
        values.get("data.name"),
        values.get("model.name"),
        values.get("optim.name"),
        "no schedule" if schedule == "none" else f"{schedule} schedule",
    ]
    if values.get("train.grad_clip.mode") == "none":
        parts.append("no clipping")
    return " · ".join(str(p) for p in parts)
