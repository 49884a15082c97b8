"""How large a run's model is, and how much memory training it takes, from the spec alone.

Torch-free: the schema (core/config.py) refuses, at validation, a spec whose model no machine can train
(the dashboard, the CLI and every submit path validate with it), and the pre-flight (core/preflight.py)
compares the same estimate with the memory of the host or GPU before anything is allocated.

- Parameters are exact for the catalog's models (core/catalog.py; a test checks each against torch): the
  small models' layers are written out here, family by family; a torchvision or listed timm model is its backbone
  (the catalog's footprint) plus a head sized to the task; any other timm model is measured by the pre-flight
  (core.timm_models.footprint), the schema cannot refuse it. Only an image folder's number of classes is unknown
  before it is read: FOLDER_CLASSES is assumed (the head is a small part of any model).
- Training keeps the weights, a gradient of each trainable one, the optimizer's state (Adam: two values a
  weight; SGD with momentum, RMSprop: one each), and the activations of a batch for the backward pass. Those
  are per input pixel for the convolutional models (measured with torch at 224 px, float32, three channels;
  within 20 % at 32 px), about half under fp16/bf16 autocast, and about a third with gradient
  checkpointing. An estimate, meant to tell a runnable spec from an impossible one.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from core import catalog, preprocessing

MAX_PARAMETERS = 2_000_000_000  # 7.5 GiB of float32 weights: 80 times the largest registered torchvision model
MAX_TRAINING_BYTES = 1 << 40  # 1 TiB a process: more than any accelerator, and most hosts, hold
FOLDER_CLASSES = 1000  # an image folder's classes, unknown until it is read
FLOAT = 4

OPTIMIZER_STATES = {"adam": 2, "adamw": 2}  # values kept per trainable weight; sgd and rmsprop: see below


@dataclass(frozen=True)
class Task:
    channels: int
    size: int  # the images' side as the model receives them
    classes: int
    size_field: str  # the field that sets `size`: data.image_size or data.size


@dataclass(frozen=True)
class Estimate:
    parameters: int
    trainable: int
    state_bytes: int  # weights, gradients and optimizer state
    activation_bytes: int  # of one process's micro-batch
    batch: int  # samples a process holds at once

    @property
    def total_bytes(self) -> int:
        return self.state_bytes + self.activation_bytes


def task_of(spec: Any) -> Task:
    """The input and output shape the model is built for, as far as the spec says."""
    data, entry = spec.data, catalog.dataset(spec.data.name)
    if entry.kind == "generated":
        channels, size, classes = data.channels, data.size, data.num_classes
    else:  # the catalog gives every other kind's shape; a folder's classes are unknown until it is read
        channels, size, classes = entry.channels, entry.size, entry.classes or FOLDER_CLASSES
    # pretrained weights bring their input size (core/preprocessing.py); a checkpoint's is known once it is read
    weights = None if data.image_size or data.preprocess.source == "dataset" else preprocessing.of_weights(spec.model)
    field = "data.image_size" if data.image_size or weights or entry.kind != "generated" else "data.size"
    return Task(channels, data.image_size or (weights.image_size if weights else size), classes, field)


def sized(name: str) -> bool:
    """Whether the spec alone sizes the model: all but a timm model the catalog does not list, whose size
    core.timm_models.footprint measures where timm is installed (the pre-flight passes it as `footprint`)."""
    m = catalog.model(name)
    return m.footprint is not None or m.library != "timm"


def _footprint(name: str, given: catalog.Footprint | None) -> catalog.Footprint | None:
    if not sized(name) and given is None:
        raise ValueError(f"{name}'s size is unknown until timm builds it: pass its measured footprint")
    return given or catalog.model(name).footprint


def parameters(name: str, hidden: int, task: Task, footprint: catalog.Footprint | None = None) -> int:
    """The model's parameter count (core.models.build_model's, exactly; a timm model's the catalog does not list:
    from its measured `footprint`)."""
    m, fp = catalog.model(name), _footprint(name, footprint)
    c, k, h = task.channels, task.classes, hidden
    s = max(task.size, m.min_size)
    if fp is not None:
        return fp.backbone_parameters + (fp.head_features + 1) * k
    if m.family == "mlp":
        return (c * s * s + 1) * h + (h + 1) * h + (h + 1) * k
    c1, c2 = m.widths  # simple_cnn
    side = s // 4
    return (c * 9 + 1) * c1 + (c1 * 9 + 1) * c2 + (c2 * side * side + 1) * h + (h + 1) * k


def activations_per_sample(name: str, hidden: int, task: Task, footprint: catalog.Footprint | None = None) -> int:
    """Bytes kept for the backward pass per sample (float32, no checkpointing)."""
    m, fp = catalog.model(name), _footprint(name, footprint)
    s = max(task.size, m.min_size)
    if fp is not None:
        return fp.activation_bytes_per_pixel * s * s
    if m.family == "mlp":
        return FLOAT * (task.channels * s * s + 6 * hidden)
    c1, c2 = m.widths  # simple_cnn: input; conv1's output, pool indices (int64) and output; conv2's, pool's; fc1's
    return s * s * (16 * task.channels + 28 * c1 + 7 * c2) // 4 + FLOAT * 3 * hidden


def _trainable(spec: Any, total: int, task: Task, footprint: catalog.Footprint | None) -> int:
    footprint = _footprint(spec.model.name, footprint)
    if spec.model.transfer != "feature_extract" or footprint is None:
        return total  # finetune_last_n: counted whole (an upper bound)
    return (footprint.head_features + 1) * task.classes


def _optimizer_states(optim: Any) -> int:
    if optim.name in OPTIMIZER_STATES:
        return OPTIMIZER_STATES[optim.name]
    with_momentum = 1 if optim.momentum > 0 else 0
    return with_momentum + (1 if optim.name == "rmsprop" else 0)  # rmsprop: its square average


def estimate(spec: Any, footprint: catalog.Footprint | None = None) -> Estimate:
    """What training this spec's model takes, per process (a run of resources.gpus processes splits the batch);
    `footprint`: the measured one of a model the spec alone does not size (see `sized`)."""
    task = task_of(spec)
    name, hidden = spec.model.name, spec.model.hidden
    total = parameters(name, hidden, task, footprint)
    trainable = _trainable(spec, total, task, footprint)
    gradients = trainable * (2 if spec.resources.gpus > 1 else 1)  # DDP keeps its buckets besides the gradients
    state = FLOAT * (total + gradients + trainable * _optimizer_states(spec.optim))
    batch = max(1, spec.train.batch_size // spec.resources.gpus)
    per_sample = activations_per_sample(name, hidden, task, footprint)
    if spec.train.precision != "fp32":
        per_sample //= 2
    if spec.model.gradient_checkpointing:
        per_sample //= 3
    return Estimate(total, trainable, state, per_sample * batch, batch)


def levers(spec: Any) -> str:
    """The fields that shrink this spec's training memory, for messages."""
    hidden = " or model.hidden" if spec.model.name in catalog.HIDDEN_MODELS else ""
    return f"lower train.batch_size, {task_of(spec).size_field}{hidden}, or set model.gradient_checkpointing"


def gib(n: float) -> str:
    return f"{n / 2**40:,.1f} TiB" if n >= 2**40 else f"{n / 2**30:,.1f} GiB"


def refusal(spec: Any) -> str | None:
    """Why no machine can train this spec's model (naming the fields to change), or None (also for a model the
    spec alone does not size: the pre-flight measures it)."""
    if not sized(spec.model.name):
        return None
    e, task, m = estimate(spec), task_of(spec), spec.model
    set_by_spec = spec.data.image_size or catalog.dataset(spec.data.name).kind == "generated"
    size = f"{task.size_field}={task.size}" if set_by_spec else f"{spec.data.name}'s {task.size}×{task.size} images"
    if e.parameters > MAX_PARAMETERS:
        hidden = m.name in catalog.HIDDEN_MODELS
        grows = f"model.hidden={m.hidden} with {size}" if hidden else f"{task.classes:,} classes"
        lower = f"lower model.hidden or {task.size_field}" if hidden else "use fewer classes"
        return (
            f"{grows} makes {m.name} a model of {e.parameters / 1e9:,.1f} billion parameters "
            f"({gib(FLOAT * e.parameters)} as float32; training takes about {gib(e.total_bytes)}); at most "
            f"{MAX_PARAMETERS / 1e9:.0f} billion: {lower}"
        )
    if e.total_bytes > MAX_TRAINING_BYTES:
        return (
            f"training {m.name} on {size} at train.batch_size={spec.train.batch_size} takes about "
            f"{gib(e.total_bytes)} a process (activations of {e.batch:,} samples: {gib(e.activation_bytes)}); "
            f"at most {gib(MAX_TRAINING_BYTES)}: lower train.batch_size or {task.size_field}, or set "
            "model.gradient_checkpointing or train.precision=bf16"
        )
    return None
