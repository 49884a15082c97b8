"""The sections of a run spec (data, model, optim, schedule, train, checkpoint, export, loader, resources), each a
validated pydantic model; core/config.py puts them together into RunSpec.

Torch-free, like core/config.py: the dashboard validates specs with it. Every default is documented where it is
declared; the form in the UI reads these descriptions as its help text.
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import AfterValidator, Field, field_validator, model_validator

from core import catalog
from core.catalog import MODEL_NAMES, MONITORS
from core.names import EXPORT_FORMATS
from core.spec_base import Section, never_test

# The data section (where images come from, their split, preprocessing and augmentation) is core/spec_data.py's.
from core.spec_data import AugmentSpec, DataSpec  # noqa: F401 - part of this module's API
from core.spec_lr_finder import CLASS_WEIGHTS_HELP, SAMPLER_HELP, ClassWeights, LrFinderSpec, Sampler
from core.spec_mix_ema import EmaSpec, MixSpec

Precision = Literal["fp32", "fp16", "bf16"]
# The catalog's models, or any timm model as timm/<name> (whether timm has it: checked where timm is installed)
ModelName = Annotated[str, AfterValidator(catalog.check_model_name)]


class ModelSpec(Section):
    """The network and how it is transferred."""

    name: ModelName = Field(
        "simple_cnn",
        description=f"Model: one of {', '.join(MODEL_NAMES)}; or any timm model as timm/<name> "
        "(a timm.list_models() name, optionally with its pretrained tag: timm/<name>.<tag>).",
    )
    pretrained: bool = Field(
        False,
        description="Start from the library's pretrained weights: torchvision's read from $TORCH_HOME/hub/checkpoints "
        "when offline; timm's from the Hugging Face cache ($HF_HUB_CACHE, else $HF_HOME/hub), never downloaded.",
    )
    weights_file: str | None = Field(
        None,
        max_length=4096,
        description="A state_dict to start from (.safetensors, or a "
        "torch file loaded with weights_only=True, e.g. a torchdeck run's best.pt).",
    )
    transfer: Literal["scratch", "feature_extract", "finetune", "finetune_last_n"] = Field(
        "scratch",
        description="scratch: train all from random init; feature_extract: freeze the backbone, train the head; "
        "finetune: train all; finetune_last_n: train the last N stages and the head.",
    )
    keep_head: bool = Field(
        False,
        description="Transfer from a plain state_dict (one without class names): keep its "
        "classifier head instead of a fresh one. A torchdeck checkpoint's head is kept only for the same classes.",
    )
    last_n: int = Field(
        1,
        ge=1,
        le=16,
        description="finetune_last_n: how many backbone stages (from the top) are trained. "
        f"Stages by family: {catalog.stages_in_words()}; any other timm model: one per feature_info module "
        "(the head, the last linear layer, is always trained).",
    )
    unfreeze_at_epoch: int | None = Field(
        None,
        ge=1,
        description="Progressive unfreezing: from this epoch (1-based) on, "
        "the whole backbone is trained (with unfreeze_every: the first further stage).",
    )
    unfreeze_every: int | None = Field(
        None,
        ge=1,
        le=10_000,
        description="Stage-wise unfreezing: every this many epochs one "
        "more backbone stage (from the top) is trained; starts at unfreeze_at_epoch, else after "
        "the first unfreeze_every epochs.",
    )
    backbone_lr_mult: float = Field(
        0.1,
        gt=0.0,
        le=10.0,
        description="Discriminative LR: backbone learning rate = optim.lr × this (the head uses optim.lr).",
    )
    lr_decay: float = Field(
        1.0,
        gt=0.0,
        le=1.0,
        description="Discriminative LR per stage: the top backbone stage uses "
        "optim.lr × backbone_lr_mult, each stage further down that × lr_decay once more; 1: off.",
    )
    dropout: float = Field(0.0, ge=0.0, lt=1.0, description="Dropout before the classification head.")
    hidden: int = Field(128, ge=8, le=8192, description="mlp/simple_cnn: width of the hidden fully connected layer.")
    gradient_checkpointing: bool = Field(
        False, description="Recompute stage activations in backward to save memory; slower."
    )

    @model_validator(mode="after")
    def _transfer_needs_weights(self) -> ModelSpec:
        if self.transfer in ("feature_extract", "finetune_last_n") and not (self.pretrained or self.weights_file):
            raise ValueError(
                f"model.transfer={self.transfer} freezes layers, which only makes sense with pretrained weights: "
                "set model.pretrained=true or model.weights_file, or use transfer=scratch"
            )
        return self


class OptimSpec(Section):
    """Optimizer. Weight decay skips norms and biases by default."""

    name: Literal["sgd", "adam", "adamw", "rmsprop"] = Field(
        "adam", description="Optimizer; Adam at lr 1e-3 is the usual start."
    )
    lr: float = Field(1e-3, gt=0.0, description="Learning rate of the head (and of the whole model from scratch).")
    weight_decay: float = Field(0.0, ge=0.0, le=1.0, description="L2 / decoupled weight decay.")
    momentum: float = Field(0.9, ge=0.0, lt=1.0, description="sgd/rmsprop: momentum.")
    nesterov: bool = Field(False, description="sgd: Nesterov momentum.")
    betas: tuple[float, float] = Field((0.9, 0.999), description="adam/adamw: beta1, beta2.")
    decay_norm_and_bias: bool = Field(
        False, description="Also apply weight decay to norm layers and biases (usually worse)."
    )

    @field_validator("betas")
    @classmethod
    def _betas_in_range(cls, v: tuple[float, float]) -> tuple[float, float]:
        if not all(0.0 <= b < 1.0 for b in v):
            raise ValueError("betas must both be in [0, 1)")
        return v

    @model_validator(mode="after")
    def _nesterov_needs_momentum(self) -> OptimSpec:
        if self.nesterov and (self.name != "sgd" or self.momentum == 0.0):
            raise ValueError("optim.nesterov needs optim.name=sgd and optim.momentum > 0")
        return self


class ScheduleSpec(Section):
    """Learning-rate schedule. All but plateau are applied per optimizer step."""

    name: Literal["none", "step", "multistep", "cosine", "plateau", "onecycle"] = Field(
        "none",
        description="none: constant; step/multistep: decay by gamma at epochs; cosine: to min_lr; "
        "plateau: decay when the monitored metric stalls; onecycle: up to optim.lr then down.",
    )
    warmup_epochs: float = Field(
        0.0,
        ge=0.0,
        le=10_000.0,
        description="Linear warmup from 0 over this many epochs "
        "(not for plateau/onecycle; a transfer run's fresh head skips it).",
    )
    step_size: int = Field(10, ge=1, le=10_000, description="step: decay every this many epochs.")
    milestones: list[int] = Field(
        default_factory=list, max_length=100, description="multistep: epochs at which to decay."
    )
    gamma: float = Field(0.1, gt=0.0, le=1.0, description="step/multistep/plateau: decay factor.")
    min_lr: float = Field(0.0, ge=0.0, description="cosine: final learning rate; plateau: lower bound.")
    patience: int = Field(2, ge=0, le=10_000, description="plateau: epochs without improvement before decaying.")
    pct_start: float = Field(0.3, gt=0.0, lt=1.0, description="onecycle: fraction of steps spent increasing the LR.")

    @field_validator("milestones")
    @classmethod
    def _sorted_positive(cls, v: list[int]) -> list[int]:
        if any(m < 1 or m > 10_000 for m in v) or v != sorted(set(v)):
            raise ValueError("milestones must be increasing epoch numbers between 1 and 10,000")
        return v


class GradClipSpec(Section):
    """Gradient clipping before the optimizer step."""

    mode: Literal["none", "norm", "value"] = Field(
        "norm", description="norm: clip_grad_norm_; value: clip_grad_value_; none."
    )
    max: float = Field(1.0, gt=0.0, description="Max total norm (mode=norm) or max absolute value (mode=value).")


class EarlyStoppingSpec(Section):
    """Stop when the monitored metric stops improving and keep the best weights."""

    enabled: bool = Field(True, description="Stop early when the monitored metric stops improving.")
    monitor: Annotated[Literal[MONITORS], never_test("train.early_stopping.monitor")] = Field(
        "val/loss", description="Metric to watch (a validation or training metric: never the test split's)."
    )
    mode: Literal["auto", "min", "max"] = Field("auto", description="auto: min for losses, max for accuracies and F1.")
    patience: int = Field(5, ge=1, le=10_000, description="Epochs without improvement before stopping.")
    min_delta: float = Field(0.0, ge=0.0, description="Smallest change that counts as an improvement.")

    @property
    def resolved_mode(self) -> Literal["min", "max"]:
        if self.mode != "auto":
            return self.mode
        return catalog.better(self.monitor)


class TrainSpec(Section):
    """The loop: epochs, batches, precision and stability."""

    epochs: int = Field(10, ge=1, le=10_000, description="Maximum number of epochs.")
    batch_size: int = Field(64, ge=1, le=65_536, description="Samples per optimizer micro-batch.")
    accumulate: int = Field(
        1, ge=1, le=1024, description="Gradient accumulation: optimizer step every N micro-batches."
    )
    precision: Precision = Field("fp32", description="fp32; fp16 (CUDA, with GradScaler); bf16 (CPU or CUDA autocast).")
    grad_clip: GradClipSpec = Field(default_factory=GradClipSpec, description="Gradient clipping.")
    label_smoothing: float = Field(0.0, ge=0.0, lt=1.0, description="Cross-entropy label smoothing.")
    early_stopping: EarlyStoppingSpec = Field(default_factory=EarlyStoppingSpec, description="Early stopping.")
    steps_per_epoch: int | None = Field(
        None,
        ge=1,
        le=100_000_000,
        description="Cap on training batches per epoch (quick trials); none: the whole split.",
    )
    log_every: int = Field(
        10, ge=1, le=1_000_000, description="Log train/loss, lr, grad_norm, throughput, data-wait every N steps."
    )
    diag_every: int = Field(
        50, ge=1, le=1_000_000, description="Per-layer gradient norms and update/parameter ratios every N steps."
    )
    overfit_check: bool = Field(False, description="Before training, check that the model can overfit one batch.")
    overfit_steps: int = Field(50, ge=5, le=1000, description="Steps of the overfit-one-batch check.")
    detect_anomaly: bool = Field(
        True, description="On a non-finite loss, replay the batch under anomaly detection to name the first bad op."
    )
    mix: MixSpec = Field(default_factory=MixSpec, description="Mixup / cutmix of training batches.")
    ema: EmaSpec = Field(default_factory=EmaSpec, description="Exponential moving average of the weights.")
    class_weights: ClassWeights = Field("none", description=CLASS_WEIGHTS_HELP)
    sampler: Sampler = Field("shuffle", description=SAMPLER_HELP)
    lr_finder: LrFinderSpec = Field(default_factory=LrFinderSpec, description="LR range test in the pre-flight.")

    @model_validator(mode="after")
    def _one_correction(self) -> TrainSpec:
        if self.sampler == "balanced" and self.class_weights != "none":
            raise ValueError(
                f"train.sampler=balanced and train.class_weights={self.class_weights} both correct for unbalanced "
                "classes (together they over-correct): use one of them"
            )
        return self


class CheckpointSpec(Section):
    """Checkpoints: last and best, enough to resume exactly."""

    save_last: bool = Field(True, description="Save last.pt at the end of every epoch (needed for resume).")
    save_best: bool = Field(True, description="Save best.pt whenever the monitored metric improves.")


class ExportSpec(Section):
    """Exports produced and verified against the trained model at the end."""

    formats: list[Literal["torchscript", "onnx", "pt2"]] = Field(
        default_factory=lambda: list(EXPORT_FORMATS), description="Formats to export and verify; empty for none."
    )
    checkpoint: Literal["best", "last"] = Field(
        "best",
        description="Which weights the end-of-run export uses: best (the best epoch's, when best.pt was "
        "saved) or last (the final epoch's).",
    )
    atol: float = Field(1e-4, gt=0.0, description="Max absolute logit difference allowed against the eager model.")
    parity_samples: int = Field(256, ge=1, le=4096, description="Validation samples used for the parity check.")
    opset: int | None = Field(None, ge=13, le=23, description="ONNX opset; none uses the exporter's default.")

    @field_validator("formats")
    @classmethod
    def _unique(cls, v: list[str]) -> list[str]:
        return list(dict.fromkeys(v))


class LoaderSpec(Section):
    """DataLoader settings."""

    num_workers: int | None = Field(
        None,
        ge=0,
        le=64,
        description="Threads that decode an image folder at load (and processes, with the image cache off, per batch); "
        "none: one per CPU core, at most 16. Decoded images (in memory or in the image cache) are gathered a batch "
        "at a time without loader processes unless this asks for some.",
    )
    pin_memory: bool | None = Field(None, description="Pinned host memory; none: on when training on CUDA.")
    device_cache_mb: int = Field(
        1024,
        ge=0,
        le=262_144,
        description="Datasets up to this size (MB, as float32) are moved to the device once; 0 disables it.",
    )


class ResourcesSpec(Section):
    gpus: int = Field(
        1,
        ge=1,
        le=16,
        description="Processes of one run on one host (DistributedDataParallel): one per GPU, or gloo processes on "
        "device cpu. train.batch_size stays the global batch, split evenly across them.",
    )
