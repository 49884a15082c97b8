"""timm's models (`model.name: timm/<name>`): built with timm's own API, their pretrained weights read offline.

- `timm_net` is core/models.py's builder for every timm model: `timm.create_model(name, num_classes=…)`, the head
  found by `get_classifier()`, the stages by `feature_info` (`timm_stages`: each feature module with what runs
  before it; what runs after the last one, such as a final norm, joins the top stage).
- Pretrained weights come from the local Hugging Face cache ($HF_HUB_CACHE, else $HF_HOME/hub, else
  ~/.cache/huggingface/hub) and nowhere else: the file is looked up there and handed to timm, so nothing is ever
  downloaded at run time (`pretrained_file` says where to put a missing one).
- `preprocessing` is the weights' own (timm's pretrained_cfg), as core/catalog.py's Preprocessing; `footprint`
  sizes a model the catalog does not list, without allocating its weights (on the meta device).

timm is imported lazily, here only: it imports torch, and the schema must not.
"""

from __future__ import annotations

import difflib
import math
import os
from pathlib import Path
from typing import Any

import torch
from torch import nn

from core import catalog
from core.catalog import Footprint, ModelEntry, Preprocessing, Stage

WEIGHT_FILES = ("model.safetensors", "pytorch_model.bin")  # what a timm repository on the Hub holds, in order


def _timm() -> Any:
    import timm

    return timm


def check_name(name: str) -> str:
    """The timm model behind `timm/<name>` (a pretrained tag allowed: `<arch>.<tag>`), or a ValueError naming the
    closest names timm knows."""
    timm, arch = _timm(), catalog.timm_arch(name)
    base, _, tag = arch.partition(".")
    known = timm.list_models()
    if base not in known:
        close = difflib.get_close_matches(base, known, n=5)
        hint = f"; closest: {', '.join(catalog.TIMM_PREFIX + c for c in close)}" if close else ""
        raise ValueError(
            f"unknown timm model {arch!r} (model.name={name}): timm {timm.__version__} has no such model{hint}. "
            "Any name of timm.list_models() works, spelt timm/<name>"
        )
    if tag and arch not in timm.list_models(base, pretrained=True):
        tags = [m.partition(".")[2] for m in timm.list_models(base, pretrained=True)]
        raise ValueError(f"timm has no pretrained weights {arch!r}; {base}'s are: {', '.join(tags) or 'none'}")
    return arch


def check_model(name: str) -> None:
    """Refuse a `timm/<name>` that timm does not have (ValueError, naming the closest); the schema checked the
    rest. The worker's pre-flight calls it before reading any data; a run's memory check before it starts."""
    if catalog.model(name).library == "timm":
        check_name(name)


def hub_cache() -> Path:
    """Where the Hugging Face hub keeps its downloads on this machine (read from the environment each time)."""
    if os.environ.get("HF_HUB_CACHE"):
        return Path(os.environ["HF_HUB_CACHE"])
    home = os.environ.get("HF_HOME") or os.path.join(os.path.expanduser("~"), ".cache", "huggingface")
    return Path(home) / "hub"


def _hub_id(arch: str) -> str:
    cfg = _timm().models.get_pretrained_cfg(arch)
    if cfg is None or not cfg.hf_hub_id:
        raise ValueError(f"timm has no pretrained weights on the Hugging Face hub for {arch}: use model.weights_file")
    return cfg.hf_hub_id


def pretrained_file(name: str) -> Path:
    """The cached weights file of `timm/<name>`'s pretrained weights; FileNotFoundError saying where to put it."""
    from huggingface_hub import try_to_load_from_cache

    repo, cache = _hub_id(check_name(name)), hub_cache()
    for filename in WEIGHT_FILES:
        found = try_to_load_from_cache(repo, filename, cache_dir=cache)
        if isinstance(found, str) and Path(found).is_file():
            return Path(found)
    raise FileNotFoundError(
        f"the pretrained weights of {name} ({repo}, {WEIGHT_FILES[0]}) are not in the Hugging Face cache {cache}, "
        "and torchdeck does not download them at run time. On a machine with internet: "
        f"`hf download {repo} {WEIGHT_FILES[0]}` (or run timm.create_model('{catalog.timm_arch(name)}', "
        "pretrained=True)), then copy its hub cache folder "
        f"models--{repo.replace('/', '--')} into {cache} (HF_HUB_CACHE or HF_HOME/hub sets where); "
        "or set model.weights_file to the file, or model.pretrained=false."
    )


def preprocessing(name: str) -> Preprocessing:
    """The pretrained weights' preprocessing from timm's pretrained_cfg: crop side, the resize before the crop
    (timm's floor(crop / crop_pct)), mean, std and interpolation."""
    cfg = _timm().models.get_pretrained_cfg(check_name(name))
    if cfg is None:
        raise ValueError(f"timm has no pretrained configuration for {name}")
    side = int(cfg.input_size[-1])
    mean, std = (tuple(float(v) for v in cfg.mean), tuple(float(v) for v in cfg.std))
    return Preprocessing(side, math.floor(side / cfg.crop_pct), mean, std, cfg.interpolation or "bilinear")


def _create(arch: str, num_classes: int, in_channels: int, size: int, **kw: Any) -> nn.Module:
    """timm.create_model; a model made for one input size (a ViT) given another takes it through
    dynamic_img_size (its position embedding resampled in the forward: the same weights at any size, though a
    TorchScript trace would freeze the size, so the export scripts it), else is built for `size`, else refused
    naming the size it takes."""
    timm = _timm()
    cfg = timm.models.get_pretrained_cfg(arch)
    base = {"num_classes": num_classes, "in_chans": in_channels, **kw}
    if cfg is None or not cfg.fixed_input_size or cfg.input_size[-1] == size:
        return timm.create_model(arch, **base)
    for extra in ({"dynamic_img_size": True}, {"img_size": size}):
        try:
            return timm.create_model(arch, **base, **extra)
        except TypeError:
            continue
    side = cfg.input_size[-1]
    raise ValueError(f"timm model {arch} takes only {side}×{side} inputs: set data.image_size={side}")


def head_path(net: nn.Module) -> str:
    """The module path of the classifier timm's get_classifier() returns."""
    head = net.get_classifier()
    found = next((path for path, m in net.named_modules() if m is head and path), None)
    if found is None or not isinstance(head, nn.Linear):
        raise ValueError(f"{type(net).__name__}'s classifier is {type(head).__name__}, not one linear layer")
    return found


def _units(net: nn.Module, head: str, features: list[str]) -> list[tuple[str, bool]]:
    """The network's modules in order, as (path, holds weights): containers of a feature module or of the head
    are opened; the head is left out."""
    out: list[tuple[str, bool]] = []

    def walk(module: nn.Module, prefix: str) -> None:
        for name, child in module.named_children():
            path = prefix + name
            if path == head:
                continue
            if head.startswith(path + ".") or any(f.startswith(path + ".") for f in features):
                walk(child, path + ".")
            else:
                out.append((path, any(True for _ in child.parameters())))

    walk(net, "")
    return out


def timm_stages(net: nn.Module, head: str) -> tuple[Stage, ...]:
    """The backbone stages by timm's feature_info: each feature module with the modules that run before it (the
    first one thus holds the stem: named `stem` when its feature module is a top-level one), the modules after
    the last one (a final norm, a conv head) with the top stage. Parameters outside modules (a ViT's class token
    and position embedding) follow the whole backbone."""
    features = [f["module"] for f in net.feature_info]
    stages: list[tuple[str, list[str]]] = []
    pending: list[str] = []
    for path, weighted in _units(net, head, features):
        if weighted:
            pending.append(path)
        if path in features and pending:
            stages.append((path, pending))
            pending = []
    if pending:
        stages[-1][1].extend(pending)
    if stages and "." not in stages[0][0]:
        stages[0] = ("stem", stages[0][1])
    return tuple(Stage(n, tuple(mods)) for n, mods in stages)


def timm_net(entry: ModelEntry, spec: Any, num_classes: int, in_channels: int, size: int) -> tuple[nn.Module, str]:
    """core/models.py's builder for every timm model: random init, or the pretrained weights from the local hub
    cache (timm adapts them: a new head for the task's classes, the first convolution to its channels)."""
    from core.models import _add_head_dropout

    arch = check_name(spec.name)
    if spec.pretrained:
        overlay = {"file": str(pretrained_file(spec.name))}
        net = _create(arch, num_classes, in_channels, size, pretrained=True, pretrained_cfg_overlay=overlay)
    else:
        net = _create(arch, num_classes, in_channels, size)
    head = head_path(net)
    return net, (_add_head_dropout(net, head, spec.dropout) if spec.dropout > 0 else head)


def _saved_bytes(net: nn.Module, x: torch.Tensor) -> int:
    """Bytes of the distinct tensors autograd keeps for backward, the weights left out; views of one tensor
    count once (by their base: meta tensors have no data pointer to tell)."""
    weights = {id(p) for p in net.parameters()}
    kept: dict[int, int] = {}
    bases: list[torch.Tensor] = []  # held, so that no id is reused while measuring

    def pack(t: torch.Tensor) -> torch.Tensor:
        base = t._base if t._base is not None else t
        if id(base) not in weights and id(t) not in weights:
            bases.append(base)
            kept[id(base)] = max(kept.get(id(base), 0), base.numel() * base.element_size())
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        net(x)
    return sum(kept.values())


def footprint(name: str, side: int = 112) -> Footprint:
    """The Footprint of `timm/<name>` (core/model_size.py), measured without allocating it: on the meta device,
    its parameters without the head, the head's input features, and autograd's kept bytes per input pixel (at
    112 px, as for the catalog's timm models: within 20 % from 32 to 224 px)."""
    arch = check_name(name)
    with torch.device("meta"):
        net = _create(arch, 1, 3, side).train()
        head = net.get_submodule(head_path(net))
        backbone = sum(p.numel() for p in net.parameters()) - sum(p.numel() for p in head.parameters())
        per_pixel = _saved_bytes(net, torch.empty(2, 3, side, side, requires_grad=False)) // (2 * side * side)
    return Footprint(backbone, head.in_features, per_pixel)
