"""Model registry and factory.

`build_model(spec, num_classes, in_channels, image_size)` returns a `Classifier`:
an input adapter (channel repeat / resize for small or grayscale inputs), a
backbone split into named stages, and a head sized to the task. The uniform
`stages` list is what transfer learning (freeze / finetune_last_n / progressive
unfreezing), per-layer gradient norms and gradient checkpointing work on.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.checkpoint import checkpoint

from core.checkpoint import read_weights
from core.config import MODEL_NAMES, ModelSpec


class SimpleCNN(nn.Module):
    """The reference small CNN (docs/practices.md): two 3×3 convs with 2×2 pooling, fc→hidden→classes."""

    def __init__(self, in_channels: int, num_classes: int, image_size: int, widths: tuple[int, int], hidden: int, dropout: float):
        super().__init__()
        c1, c2 = widths
        self.conv1 = nn.Sequential(nn.Conv2d(in_channels, c1, 3, padding=1), nn.ReLU(inplace=True), nn.MaxPool2d(2))
        self.conv2 = nn.Sequential(nn.Conv2d(c1, c2, 3, padding=1), nn.ReLU(inplace=True), nn.MaxPool2d(2))
        side = image_size // 4  # two 2×2 pools
        self.fc1 = nn.Sequential(nn.Flatten(), nn.Linear(c2 * side * side, hidden), nn.ReLU(inplace=True), nn.Dropout(dropout))
        self.fc2 = nn.Linear(hidden, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(self.fc1(self.conv2(self.conv1(x))))


class MLP(nn.Module):
    def __init__(self, in_features: int, num_classes: int, hidden: int, dropout: float):
        super().__init__()
        self.fc1 = nn.Sequential(nn.Flatten(), nn.Linear(in_features, hidden), nn.ReLU(inplace=True), nn.Dropout(dropout))
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
        self.norms = [m for m in module.modules() if isinstance(m, nn.modules.batchnorm._BatchNorm) and m.track_running_stats]
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

    @torch.jit.unused  # keeps the model scriptable (export's fallback); no annotations: jit cannot read postponed ones here
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


@dataclass(frozen=True)
class ModelEntry:
    family: str  # "small" or a torchvision family
    tv_name: str | None  # torchvision.models name
    stage_names: Callable[[nn.Module], list[str]]  # backbone stages, bottom to top
    head_path: str  # attribute path of the classification head
    min_size: int = 32


def _resnet_stages(_: nn.Module) -> list[str]:
    return ["stem", "layer1", "layer2", "layer3", "layer4"]


def _features_stages(m: nn.Module) -> list[str]:
    return [f"features.{i}" for i in range(len(m.features))]


MODELS: dict[str, ModelEntry] = {
    "mlp": ModelEntry("small", None, lambda m: ["fc1", "fc2"], "head", min_size=1),
    "simple_cnn": ModelEntry("small", None, lambda m: ["conv1", "conv2", "fc1"], "fc2", min_size=4),
    "simple_cnn_wide": ModelEntry("small", None, lambda m: ["conv1", "conv2", "fc1"], "fc2", min_size=4),
    "resnet18": ModelEntry("resnet", "resnet18", _resnet_stages, "fc"),
    "resnet34": ModelEntry("resnet", "resnet34", _resnet_stages, "fc"),
    "resnet50": ModelEntry("resnet", "resnet50", _resnet_stages, "fc"),
    "mobilenet_v3_small": ModelEntry("mobilenet", "mobilenet_v3_small", _features_stages, "classifier.3"),
    "mobilenet_v3_large": ModelEntry("mobilenet", "mobilenet_v3_large", _features_stages, "classifier.3"),
    "efficientnet_b0": ModelEntry("efficientnet", "efficientnet_b0", _features_stages, "classifier.1"),
    "convnext_tiny": ModelEntry("convnext", "convnext_tiny", _features_stages, "classifier.2"),
}
assert tuple(MODELS) == MODEL_NAMES, "core.config.MODEL_NAMES and core.models.MODELS must list the same models"


class Classifier(nn.Module):
    """adapter → backbone → head, with the backbone's stages named for transfer learning."""

    def __init__(self, name: str, adapter: nn.Module, net: nn.Module, stage_paths: list[str], head_path: str):
        super().__init__()
        self.arch = name
        self.adapter = adapter
        self.net = net
        self.stage_paths = stage_paths
        self.head_path = head_path
        self.weights_report: dict[str, list[str]] | None = None  # set when loaded from model.weights_file
        self.head_report: dict | None = None  # with weights_file: whether its head was loaded or left fresh, and why

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(self.adapter(x))

    def stages(self) -> list[tuple[str, list[nn.Module]]]:
        """Backbone stages bottom→top, then the head: (name, modules)."""
        out = []
        for p in self.stage_paths:
            if p == "stem":  # resnet's stem is four modules, not one
                out.append(("stem", [self.net.conv1, self.net.bn1]))
            else:
                out.append((p, [self.net.get_submodule(p)]))
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


def pretrained_weights_path(tv_name: str) -> Path:
    """Where torchvision's weights API looks for (and downloads) `tv_name`'s default weights."""
    import torchvision

    url = torchvision.models.get_model_weights(tv_name).DEFAULT.url
    return Path(torch.hub.get_dir()) / "checkpoints" / Path(url).name


def _torchvision_net(entry: ModelEntry, spec: ModelSpec, num_classes: int) -> nn.Module:
    import torchvision

    assert entry.tv_name is not None
    weights = None
    if spec.pretrained:
        # The weights API reads $TORCH_HOME/hub/checkpoints/<file> before downloading,
        # so a planted or previously cached file works offline.
        weights = torchvision.models.get_model_weights(entry.tv_name).DEFAULT
    try:
        net = torchvision.models.get_model(entry.tv_name, weights=weights)
    except Exception as e:  # noqa: BLE001 - turned into an actionable message
        if weights is None:
            raise
        where = pretrained_weights_path(entry.tv_name)
        raise RuntimeError(
            f"could not load pretrained weights for {entry.tv_name}: {where.name} is not in {where.parent} "
            f"and could not be downloaded ({e.__class__.__name__}: {e}). Offline, place the file {where.name} "
            f"in $TORCH_HOME/hub/checkpoints/ (here: {where.parent}; TORCH_HOME defaults to ~/.cache/torch), "
            "or set model.pretrained=false."
        ) from e
    old = net.get_submodule(entry.head_path)
    _replace(net, entry.head_path, nn.Linear(old.in_features, num_classes))  # head sized to the task
    return net


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


def _small_net(spec: ModelSpec, num_classes: int, in_channels: int, size: int) -> nn.Module:
    if spec.pretrained:
        raise ValueError(f"model {spec.name} has no pretrained weights; use model.weights_file or pretrained=false")
    if spec.name == "mlp":
        return MLP(in_channels * size * size, num_classes, spec.hidden, spec.dropout)
    widths = (16, 32) if spec.name == "simple_cnn" else (32, 64)  # the two classic variants
    return SimpleCNN(in_channels, num_classes, size, widths, spec.hidden, spec.dropout)


def build_model(spec: ModelSpec, num_classes: int, in_channels: int, image_size: int,
                class_names: list[str] | None = None) -> Classifier:
    """Create a registered model for `num_classes` classes on `in_channels`×`image_size`² inputs.
    With `spec.weights_file`, the load report (missing / unexpected / shape_mismatch keys) is kept
    in `model.weights_report`, and whether the file's head was used (see head_plan: `class_names`
    are the task's) in `model.head_report`."""
    entry = MODELS[spec.name]
    head_path = entry.head_path
    if entry.family == "small":
        adapter: nn.Module = InputAdapter(in_channels, in_channels, image_size, entry.min_size)
        net = _small_net(spec, num_classes, in_channels, max(image_size, entry.min_size))
    else:
        adapter = InputAdapter(in_channels, 3, image_size, entry.min_size)
        net = _torchvision_net(entry, spec, num_classes)
        if spec.dropout > 0:
            head_path = _add_head_dropout(net, head_path, spec.dropout)
    model = Classifier(spec.name, adapter, net, entry.stage_names(net), head_path)
    if spec.weights_file:
        model.weights_report = load_weights_file(model, spec.weights_file, spec, class_names)
    if spec.gradient_checkpointing:
        for p in model.stage_paths:
            if p != "stem":  # stage names and state_dict keys stay the same (see _Checkpointed)
                _replace(model.net, p, _Checkpointed(model.net.get_submodule(p)))
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


def head_plan(spec: ModelSpec | None, file_classes: list[str] | None, task_classes: list[str] | None) -> tuple[bool, str]:
    """Whether the weights file's classifier head is loaded (True) or the model keeps its fresh one, and why."""
    if file_classes is not None and task_classes is not None:
        if list(file_classes) != list(task_classes):
            return False, (f"the weights were trained on other classes ({_few(file_classes)}) than this task's "
                           f"({_few(task_classes)})")
        return True, "the weights were trained on this task's classes"
    if spec is not None and spec.transfer in TRANSFER_MODES and not spec.keep_head:
        return False, (f"model.transfer={spec.transfer} from weights without class names starts a fresh head "
                       "(model.keep_head=true keeps the file's)")
    if spec is not None and spec.keep_head:
        return True, "model.keep_head=true"
    return True, "model.transfer=scratch loads every tensor that fits"


def load_weights_file(model: Classifier, path: str, spec: ModelSpec | None = None,
                      class_names: list[str] | None = None) -> dict[str, list[str]]:
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
        keep, why = False, ("the file's head has another shape (another number of classes)" if
                            any(k in shape_bad for k in head_keys) else "the file has no tensors for this model's head")
    model.load_state_dict(usable, strict=False)
    model.head_report = {"head": "loaded" if keep else "fresh", "reason": why,
                         "file_classes": file_classes or [], "dropped": dropped}
    return {"missing": missing, "unexpected": unexpected, "shape_mismatch": shape_bad}


def count_parameters(model: nn.Module) -> tuple[int, int]:
    total = sum(p.numel() for p in model.parameters())
    trainable = sum(p.numel() for p in model.parameters() if p.requires_grad)
    return total, trainable
