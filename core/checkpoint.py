"""Checkpoints that resume exactly and early stopping with its state.

A checkpoint holds state_dicts only (never pickled objects) plus plain Python data, so it
loads with `torch.load(weights_only=True)`.
"""

from __future__ import annotations

import math
import os
import random
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torchvision


class EarlyStopping:
    """Tracks the best value of the monitored metric; says when to stop."""

    def __init__(self, mode: str, patience: int, min_delta: float, enabled: bool = True):
        self.mode, self.patience, self.min_delta, self.enabled = mode, patience, min_delta, enabled
        self.best: float | None = None
        self.best_epoch = 0
        self.bad_epochs = 0

    def improved(self, value: float) -> bool:
        if not math.isfinite(value):
            return False
        if self.best is None:
            return True
        if self.mode == "min":
            return value < self.best - self.min_delta
        return value > self.best + self.min_delta

    def update(self, value: float, epoch: int) -> bool:
        """Record an epoch's value; True when it is the new best."""
        if self.improved(value):
            self.best, self.best_epoch, self.bad_epochs = value, epoch, 0
            return True
        self.bad_epochs += 1
        return False

    @property
    def should_stop(self) -> bool:
        return self.enabled and self.bad_epochs >= self.patience

    def state_dict(self) -> dict:
        return {"best": self.best, "best_epoch": self.best_epoch, "bad_epochs": self.bad_epochs}

    def load_state_dict(self, s: dict) -> None:
        self.best, self.best_epoch, self.bad_epochs = s["best"], s["best_epoch"], s["bad_epochs"]


def rng_state() -> dict[str, Any]:
    state = {
        "torch": torch.get_rng_state(),
        "numpy": [np.random.get_state()[1].tolist(), *(float(v) for v in np.random.get_state()[2:])],
        "python": repr(random.getstate()),
    }
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: dict[str, Any]) -> None:
    import ast

    torch.set_rng_state(state["torch"])
    keys, pos, has_gauss, cached = state["numpy"]
    np.random.set_state(("MT19937", np.array(keys, dtype=np.uint32), int(pos), int(has_gauss), cached))
    random.setstate(ast.literal_eval(state["python"]))
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


def versions() -> dict[str, str]:
    from importlib.metadata import PackageNotFoundError, version

    try:
        td = version("torchdeck")
    except PackageNotFoundError:
        td = "dev"
    return {"torch": str(torch.__version__), "torchvision": str(torchvision.__version__), "torchdeck": td}


def save_checkpoint(path: Path, payload: dict[str, Any]) -> None:
    """Write atomically: a crash mid-write never leaves a truncated last.pt behind."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    torch.save({**payload, "versions": versions()}, tmp)
    os.replace(tmp, path)


def load_checkpoint(path: Path, device: torch.device | str = "cpu") -> dict[str, Any]:
    if not Path(path).is_file():
        raise FileNotFoundError(f"checkpoint not found: {path}")
    # weights_only: loading a checkpoint never runs pickled code (map_location given).
    return torch.load(path, map_location=device, weights_only=True)


def _class_names(value: Any) -> list[str] | None:
    """A list of class names, or None when `value` is not one."""
    if isinstance(value, list | tuple) and value and all(isinstance(c, str) for c in value):
        return list(value)
    return None


def _read_safetensors(p: Path) -> tuple[dict[str, torch.Tensor], list[str] | None]:
    import json

    from safetensors import safe_open
    from safetensors.torch import load_file

    try:
        state = load_file(str(p))
        with safe_open(str(p), "pt") as f:
            meta = f.metadata() or {}
    except Exception as e:  # noqa: BLE001
        raise ValueError(f"{p} is not a readable .safetensors file: {e}") from e
    try:
        names = _class_names(json.loads(meta["class_names"])) if "class_names" in meta else None
    except ValueError:
        names = None
    return state, names


def read_weights(path: Path) -> tuple[dict[str, torch.Tensor], list[str] | None]:
    """A flat {name: tensor} from a .safetensors or a weights-only torch file (no pickle code runs), and the
    class names the weights were trained on when the file says (a torchdeck checkpoint's data_info, or a
    safetensors `class_names` metadata entry holding a JSON list); None for a plain state_dict."""
    p = Path(path)
    if p.suffix == ".safetensors":
        return _read_safetensors(p)
    try:
        state = torch.load(p, map_location="cpu", weights_only=True)
    except Exception as e:  # noqa: BLE001
        raise ValueError(f"{p} is not a weights-only torch file (pickled objects are refused): {e}") from e
    names = None
    if isinstance(state, dict) and isinstance(state.get("data_info"), dict):  # a torchdeck checkpoint
        names = _class_names(state["data_info"].get("class_names"))
    for key in ("model", "state_dict"):  # a torchdeck / Lightning-style checkpoint
        if isinstance(state, dict) and isinstance(state.get(key), dict):
            state = state[key]
    if not isinstance(state, dict) or not state or not all(isinstance(v, torch.Tensor) for v in state.values()):
        raise ValueError(
            f"{p} does not hold a state_dict (a mapping of parameter names to tensors), got {type(state).__name__}"
        )
    return state, names


def read_data_info(path: str | Path) -> dict[str, Any] | None:
    """The data_info a torchdeck checkpoint records (its classes, input size, mean/std and preprocessing); None
    for any other weights file (a plain state_dict, a .safetensors) or one that cannot be read (loading the
    weights then says why). Memory-mapped where the file allows: the tensors are not read."""
    p = Path(path).expanduser()
    if p.suffix == ".safetensors" or not p.is_file():
        return None
    for mmap in (True, False):  # mmap needs torch's zip format; an older file is read whole
        try:
            state = torch.load(p, map_location="cpu", weights_only=True, mmap=mmap)
        except Exception:  # noqa: BLE001 - not a weights-only torch file: read_weights refuses it with the reason
            continue
        info = state.get("data_info") if isinstance(state, dict) else None
        return info if isinstance(info, dict) else None
    return None
