"""The model factory: one builder per family, for the models core/catalog.py describes.

`build_model(spec, num_classes, in_channels, image_size)` returns a `Classifier`:
an input adapter (channel repeat / resize for small or grayscale inputs), a
backbone split into the catalog's named stages, and a head sized to the task. The
uniform `stages` list is what transfer learning (freeze / finetune_last_n / progressive
unfreezing), per-layer gradient norms and gradient checkpointing work on.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.checkpoint import checkpoint

from core import catalog
from core.catalog import ModelEntry, Stage
from core.checkpoint import read_weights
from core.spec_sections import ModelSpec
from core.timm_models import timm_net, timm_stages


class SimpleCNN(nn.Module):
    """The reference small CNN (docs/practices.md): two 3×3 convs with 2×2 pooling, fc→hidden→classes."""

    def __init__(
        self, in_channels: int, num_classes: int, image_size: int, widths: tuple[int, int], hidden: int, dropout: float
    ):
        super().__init__()
        c1, c2 = widths
        self.conv1 = nn.Sequential(nn.Conv2d(in_channels, c1, 3, padding=1), nn.ReLU(inplace=True), nn.MaxPool2d(2))
        self.conv2 = nn.Sequential(nn.Conv2d(c1, c2, 3, padding=1), nn.ReLU(inplace=True), nn.MaxPool2d(2))
        side = image_size // 4  # two 2×2 pools
        self.fc1 = nn.Sequential(
            nn.Flatten(), nn.Linear(c2 * side * side, hidden), nn.ReLU(inplace=True), nn.Dropout(dropout)
        )
        self.fc2 = nn.Linear(hidden, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(self.fc1(self.conv2(self.conv1(x))))


class MLP(nn.Module):
    def __init__(self, in_features: int, num_classes: int, hidden: int, dropout: float):
        super().__init__()
        self.fc1 = nn.Sequential(
            nn.Flatten(), nn.Linear(in_features, hidden), nn.ReLU(inplace=True), nn.Dropout(dropout)
        )
        self.fc2 = nn.Sequential(nn.Linear(hidden, hidden), nn.ReLU(inplace=True), nn.Dropout(dropout))
        self.head = nn.Linear(hidden, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.fc2(self.fc1(x)))


class InputAdapter(nn.Module):
    """Makes small or grayscale images acceptable to ImageNet models (repeat channels, upsample)."""

    def __init__(self, in_channels: int, want_channels: int, image_size: int, min_size: int):
        super().__init__()
        self.repeat = want_channels // in_channels if in_channels != want_channels else 1
        self.size = max(image_size, min_size) if image_size < min_size else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.repeat > 1:
            x = x.repeat(1, self.repeat, 1, 1)
        if self.size is not None:
            x = F.interpolate(x, size=(self.size, self.size), mode="bilinear", align_corners=False)
        return x


class _KeepNormStats:
    """Context for checkpointing's recomputation: it runs the stage's forward a second time, which
    would update BatchNorm running statistics twice per step. Restore them afterwards."""

    def __init__(self, module: nn.Module):
        self.norms = [
            m for m in module.modules() if isinstance(m, nn.modules.batchnorm._BatchNorm) and m.track_running_stats
        ]
        self.saved: list[list[torch.Tensor]] = []

    def _buffers(self, m: nn.Module) -> list[torch.Tensor]:
        return [b for b in (m.running_mean, m.running_var, m.num_batches_tracked) if b is not None]

    def __enter__(self) -> None:
        self.saved = [[b.clone() for b in self._buffers(m)] for m in self.norms]

    def __exit__(self, *exc: object) -> None:
        with torch.no_grad():
            for m, saved in zip(self.norms, self.saved, strict=True):
                for b, v in zip(self._buffers(m), saved, strict=True):
                    b.copy_(v)


class _Checkpointed(nn.Module):
    """Runs a stage under activation checkpointing while training.

    Transparent to state_dict: keys are the wrapped stage's own (no ".inner."), so weights move
    freely between runs with and without checkpointing."""

    def __init__(self, inner: nn.Module):
        super().__init__()
        self.inner = inner
        self.register_state_dict_post_hook(_drop_inner_keys)
        self.register_load_state_dict_pre_hook(_add_inner_keys)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.training and torch.is_grad_enabled():
            return self._checkpointed(x)
        return self.inner(x)

    # jit.unused keeps the model scriptable (export's fallback); no annotations: jit cannot read postponed ones here
    @torch.jit.unused
    def _checkpointed(self, x):  # noqa: ANN001, ANN202
        keep = lambda: (contextlib.nullcontext(), _KeepNormStats(self.inner))  # noqa: E731
        return checkpoint(self.inner, x, use_reentrant=False, context_fn=keep)


def _drop_inner_keys(module: nn.Module, state: dict, prefix: str, local_metadata: dict) -> None:
    inner = prefix + "inner."
    for k in [k for k in state if k.startswith(inner)]:  # the subtree's keys are the last ones: order kept
        state[prefix + k[len(inner) :]] = state.pop(k)
    meta = getattr(state, "_metadata", None)  # module versions, keyed by module path
    if meta is not None:
        for k in [k for k in meta if k.startswith(inner) or k == inner[:-1]]:
            meta[prefix[:-1] if k == inner[:-1] else prefix + k[len(inner) :]] = meta.pop(k)


def _add_inner_keys(module: nn.Module, state: dict, prefix: str, *_: object) -> None:
    inner = prefix + "inner."
    for k in [k for k in state if k.startswith(prefix) and not k.startswith(inner)]:
        state[inner + k[len(prefix) :]] = state.pop(k)


class Classifier(nn.Module):
    """adapter → backbone → head, with the backbone's stages named for transfer learning."""

    def __init__(self, name: str, adapter: nn.Module, net: nn.Module, stages: tuple[Stage, ...], head_path: str):
        super().__init__()
        self.arch = name
        self.adapter = adapter
        self.net = net
        self.stage_specs = stages
        self.head_path = head_path
        self.weights_report: dict[str, list[str]] | None = None  # set when loaded from model.weights_file
        self.head_report: dict | None = None  # with weights_file: whether its head was loaded or left fresh, and why

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(self.adapter(x))

    def stages(self) -> list[tuple[str, list[nn.Module]]]:
        """Backbone stages bottom→top, then the head: (name, modules), as the catalog lists their module paths."""
        out = [(s.name, [self.net.get_submodule(p) for p in s.modules]) for s in self.stage_specs]
        out.append(("head", [self.net.get_submodule(self.head_path)]))
        return out

    def head_parameters(self) -> list[nn.Parameter]:
        return list(self.net.get_submodule(self.head_path).parameters())

    def param_groups_by_stage(self) -> dict[str, list[nn.Parameter]]:
        """Every trainable-or-not parameter assigned to exactly one stage (leftovers go to 'other')."""
        seen: set[int] = set()
        groups: dict[str, list[nn.Parameter]] = {}
        for name, mods in self.stages():
            ps = [p for m in mods for p in m.parameters() if id(p) not in seen]
            seen.update(id(p) for p in ps)
            groups[name] = ps
        rest = [p for p in self.parameters() if id(p) not in seen]
        if rest:
            groups["other"] = rest
        return groups


def _replace(root: nn.Module, path: str, new: nn.Module) -> None:
    parent_path, _, attr = path.rpartition(".")
    parent = root.get_submodule(parent_path) if parent_path else root
    setattr(parent, attr, new)


def pretrained_weights_path(name: str) -> Path:
    """Where torchvision's weights API looks for (and downloads) the catalog's weights of model `name`."""
    weights = catalog.model(name).weights
    if weights is None:
        raise ValueError(f"model {name} has no pretrained weights")
    return Path(torch.hub.get_dir()) / "checkpoints" / weights.file


def _pretrained(entry: ModelEntry, name: str) -> object:
    """torchvision's weights object the catalog names, after checking it is the file the catalog says."""
    import torchvision

    assert entry.weights is not None
    weights = torchvision.models.get_model_weights(entry.builder)[entry.weights.name]
    if Path(weights.url).name != entry.weights.file:  # a torchvision upgrade changed them: the catalog must follow
        raise RuntimeError(
            f"core/catalog.py says {name}'s {entry.weights.name} weights are {entry.weights.file}, "
            f"but this torchvision's are {Path(weights.url).name}: update the catalog"
        )
    return weights


def _torchvision_net(
    entry: ModelEntry, spec: ModelSpec, num_classes: int, in_channels: int, size: int
) -> tuple[nn.Module, str]:
    """Any torchvision classifier: its builder by name, the catalog's weights, the head replaced (a dropout
    before it when asked). Every torchvision family builds this way; only the catalog entries differ."""
    import torchvision

    # The weights API reads $TORCH_HOME/hub/checkpoints/<file> before downloading,
    # so a planted or previously cached file works offline.
    weights = _pretrained(entry, spec.name) if spec.pretrained else None
    try:
        net = torchvision.models.get_model(entry.builder, weights=weights)
    except Exception as e:  # noqa: BLE001 - turned into an actionable message
        if weights is None:
            raise
        where = pretrained_weights_path(spec.name)
        raise RuntimeError(
            f"could not load pretrained weights for {spec.name}: {where.name} is not in {where.parent} "
            f"and could not be downloaded ({e.__class__.__name__}: {e}). Offline, place the file {where.name} "
            f"in $TORCH_HOME/hub/checkpoints/ (here: {where.parent}; TORCH_HOME defaults to ~/.cache/torch), "
            "or set model.pretrained=false."
        ) from e
    old = net.get_submodule(entry.head)
    _replace(net, entry.head, nn.Linear(old.in_features, num_classes))  # head sized to the task
    head = _add_head_dropout(net, entry.head, spec.dropout) if spec.dropout > 0 else entry.head
    return net, head


def _add_head_dropout(net: nn.Module, head_path: str, p: float) -> str:
    """Dropout right before the head; reuses the model's own dropout layer when it has one there
    (mobilenet, efficientnet). Returns the head's (possibly new) path."""
    parent_path, _, attr = head_path.rpartition(".")
    parent = net.get_submodule(parent_path) if parent_path else net
    if isinstance(parent, nn.Sequential) and attr.isdigit() and int(attr) > 0:
        before = parent[int(attr) - 1]
        if isinstance(before, nn.Dropout):
            before.p = p
            return head_path
    _replace(net, head_path, nn.Sequential(nn.Dropout(p), net.get_submodule(head_path)))
    return f"{head_path}.1"


def _mlp(entry: ModelEntry, spec: ModelSpec, num_classes: int, in_channels: int, size: int) -> tuple[nn.Module, str]:
    return MLP(in_channels * size * size, num_classes, spec.hidden, spec.dropout), entry.head


def _simple_cnn(
    entry: ModelEntry, spec: ModelSpec, num_classes: int, in_channels: int, size: int
) -> tuple[nn.Module, str]:
    c1, c2 = entry.widths
    return SimpleCNN(in_channels, num_classes, size, (c1, c2), spec.hidden, spec.dropout), entry.head


# (catalog entry, spec, classes, input channels, input side) -> (the network, its head's module path)
Builder = Callable[[ModelEntry, ModelSpec, int, int, int], tuple[nn.Module, str]]
# One builder per family (core/catalog.py's ModelEntry.family); torchvision's families share one.
BUILDERS: dict[str, Builder] = {
    "mlp": _mlp,
    "simple_cnn": _simple_cnn,
    **dict.fromkeys(("resnet", "regnet", "mobilenet", "efficientnet", "convnext"), _torchvision_net),
    # timm's: the families the catalog lists and any other timm model (core/timm_models.py)
    **dict.fromkeys(
        {m.family for m in catalog.MODELS.values() if m.library == "timm"} | {catalog.TIMM_FAMILY}, timm_net
    ),
}


def build_model(
    spec: ModelSpec, num_classes: int, in_channels: int, image_size: int, class_names: list[str] | None = None
) -> Classifier:
    """Create a catalog model for `num_classes` classes on `in_channels`×`image_size`² inputs.
    With `spec.weights_file`, the load report (missing / unexpected / shape_mismatch keys) is kept
    in `model.weights_report`, and whether the file's head was used (see head_plan: `class_names`
    are the task's) in `model.head_report`."""
    entry = catalog.model(spec.name)
    if spec.pretrained and entry.weights is None and entry.family != catalog.TIMM_FAMILY:  # timm knows its own
        raise ValueError(f"model {spec.name} has no pretrained weights; use model.weights_file or pretrained=false")
    channels = entry.input_channels or in_channels
    adapter = InputAdapter(in_channels, channels, image_size, entry.min_size)
    net, head_path = BUILDERS[entry.family](entry, spec, num_classes, channels, max(image_size, entry.min_size))
    stages = entry.stages or timm_stages(net, head_path)  # a timm model the catalog does not list: timm's
    model = Classifier(spec.name, adapter, net, stages, head_path)
    if spec.weights_file:
        model.weights_report = load_weights_file(model, spec.weights_file, spec, class_names)
    if spec.gradient_checkpointing:
        for stage in stages:
            if len(stage.modules) == 1:  # a stage of several modules (resnet's stem) has no one forward to wrap
                _replace(model.net, stage.modules[0], _Checkpointed(model.net.get_submodule(stage.modules[0])))
    return model


def _align_keys(state: dict[str, torch.Tensor], own: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Accept Classifier keys ("net.layer1…"), bare torchvision keys ("layer1…") and DDP's "module."."""
    if all(k.startswith("module.") for k in state):
        state = {k[len("module.") :]: v for k, v in state.items()}
    if not any(k in own for k in state) and any(f"net.{k}" in own for k in state):
        state = {f"net.{k}": v for k, v in state.items()}
    return state


TRANSFER_MODES = ("feature_extract", "finetune", "finetune_last_n")


def _few(names: list[str], n: int = 5) -> str:
    return ", ".join(names[:n]) + (f", … ({len(names)} in all)" if len(names) > n else "")


def head_plan(
    spec: ModelSpec | None, file_classes: list[str] | None, task_classes: list[str] | None
) -> tuple[bool, str]:
    """Whether the weights file's classifier head is loaded (True) or the model keeps its fresh one, and why."""
    if file_classes is not None and task_classes is not None:
        if list(file_classes) != list(task_classes):
            return False, (
                f"the weights were trained on other classes ({_few(file_classes)}) than this task's "
                f"({_few(task_classes)})"
            )
        return True, "the weights were trained on this task's classes"
    if spec is not None and spec.transfer in TRANSFER_MODES and not spec.keep_head:
        return False, (
            f"model.transfer={spec.transfer} from weights without class names starts a fresh head "
            "(model.keep_head=true keeps the file's)"
        )
    if spec is not None and spec.keep_head:
        return True, "model.keep_head=true"
    return True, "model.transfer=scratch loads every tensor that fits"


def load_weights_file(
    model: Classifier, path: str, spec: ModelSpec | None = None, class_names: list[str] | None = None
) -> dict[str, list[str]]:
    """Load a user state_dict without executing pickle code; report key mismatches clearly.
    A file whose tensors mostly do not fit is refused: it was saved from another architecture.
    The head is loaded or left fresh as `head_plan` says; `model.head_report` says which and why."""
    p = Path(path)
    if not p.is_file():
        raise FileNotFoundError(f"model.weights_file not found: {p}")
    own = model.state_dict()
    raw, file_classes = read_weights(p)
    state = _align_keys(raw, own)
    head_keys = [k for k in own if k.startswith(f"net.{model.head_path}.")]
    keep, why = head_plan(spec, file_classes, class_names)
    dropped = [] if keep else [k for k in head_keys if k in state]
    state = {k: v for k, v in state.items() if k not in dropped}
    shape_bad = [k for k, v in state.items() if k in own and own[k].shape != v.shape]
    usable = {k: v for k, v in state.items() if k in own and k not in shape_bad}
    missing = [k for k in own if k not in usable and k not in dropped]
    unexpected = [k for k in state if k not in own]
    if 2 * len(usable) < len(state):
        raise ValueError(
            f"{p} does not fit the model {model.arch}: only {len(usable)} of its {len(state)} tensors match "
            f"({len(unexpected)} unexpected keys, e.g. {unexpected[:3]}; {len(shape_bad)} with another shape, "
            f"e.g. {shape_bad[:3]}). The file was saved from a different architecture."
        )
    if keep and any(k not in usable for k in head_keys):
        keep, why = (
            False,
            (
                "the file's head has another shape (another number of classes)"
                if any(k in shape_bad for k in head_keys)
                else "the file has no tensors for this model's head"
            ),
        )
    model.load_state_dict(usable, strict=False)
    model.head_report = {
        "head": "loaded" if keep else "fresh",
        "reason": why,
        "file_classes": file_classes or [],
        "dropped": dropped,
    }
    return {"missing": missing, "unexpected": unexpected, "shape_mismatch": shape_bad}


def count_parameters(model: nn.Module) -> tuple[int, int]:
    total = sum(p.numel() for p in model.parameters())
    trainable = sum(p.numel() for p in model.parameters() if p.requires_grad)
    return total, trainable


def wants_channels_last(choice: bool | None, device: torch.device, model: nn.Module) -> bool:
    """spec.channels_last, or by default: on CUDA for a model with convolutions."""
    if choice is not None:
        return choice
    return device.type == "cuda" and any(isinstance(m, nn.Conv2d) for m in model.modules())
