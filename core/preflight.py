"""Checks before the first step: memory (data, and the model's training state: core/model_size.py, before
anything is allocated), output shape, a labelled sample grid, and optionally overfitting one batch."""

from __future__ import annotations

import copy
import time
from pathlib import Path

import numpy as np
import torch
from torch import nn

from core import catalog, decode, model_size, preprocessing, timm_models
from core.data import DataBundle, Preprocess, Split


class ShapeError(ValueError):
    pass


def _first(split: Split, n: int) -> tuple[torch.Tensor, torch.Tensor]:
    n = min(n, len(split))
    if isinstance(split.images, torch.Tensor):
        return split.images[:n], split.labels[:n]
    return torch.stack([split.images[i] for i in range(n)]), split.labels[:n]


def check_shapes(model: nn.Module, data: DataBundle, device: torch.device) -> dict:
    """Run a dummy batch of real samples through the model; compare with (batch, classes)."""
    info = data.info
    x, y = _first(data.train, 2)
    bad = y[(y < 0) | (y >= info.num_classes)]
    if len(bad):
        raise ShapeError(f"labels {bad.tolist()} are outside 0..{info.num_classes - 1}")
    x = Preprocess(info, None, device)(x.to(device))
    model.eval()
    with torch.inference_mode():
        out = model(x)
    expected = (x.shape[0], info.num_classes)
    if tuple(out.shape) != expected:
        raise ShapeError(
            f"model output shape {tuple(out.shape)} does not match the expected (batch, classes) = {expected} "
            f"for input {tuple(x.shape)}"
        )
    return {"input_shape": list(x.shape[1:]), "output_shape": list(out.shape[1:]), "num_classes": info.num_classes}


def sample_grid(data: DataBundle, path: Path, n: int = 32) -> Path:
    """A PNG grid of training samples with their class names written under each."""
    from PIL import Image, ImageDraw

    x, y = _first(data.train, n)
    names = data.info.class_names
    cell = max(48, min(128, x.shape[-1] * 4))
    cols = min(8, len(y))
    rows = (len(y) + cols - 1) // cols
    label_h = 14
    grid = Image.new("RGB", (cols * cell, rows * (cell + label_h)), "white")
    draw = ImageDraw.Draw(grid)
    for k in range(len(y)):
        arr = x[k].numpy()
        arr = np.repeat(arr, 3, axis=0) if arr.shape[0] == 1 else arr[:3]
        im = Image.fromarray(arr.transpose(1, 2, 0)).resize((cell - 4, cell - 4), Image.NEAREST)
        cx, cy = (k % cols) * cell, (k // cols) * (cell + label_h)
        grid.paste(im, (cx + 2, cy + 2))
        draw.text((cx + 3, cy + cell), str(names[int(y[k])])[:14], fill="black")
    path.parent.mkdir(parents=True, exist_ok=True)
    grid.save(path)
    return path


def overfit_one_batch(
    model: nn.Module,
    data: DataBundle,
    device: torch.device,
    steps: int,
    batch: int = 16,
    lr: float = 1e-3,
    budget_s: float | None = None,
) -> dict:
    """Train a copy of the model on one small batch (Adam at `lr`); a healthy model/loss/label setup memorises
    it. With `budget_s`, it stops after that many seconds: `steps` then says how many it took."""
    m = copy.deepcopy(model).to(device).train()
    x, y = _first(data.train, batch)
    x, y = Preprocess(data.info, None, device)(x.to(device)), y.to(device)
    opt = torch.optim.Adam([p for p in m.parameters() if p.requires_grad], lr=lr)
    crit = nn.CrossEntropyLoss()
    first = last = float("nan")
    deadline = None if budget_s is None else time.monotonic() + budget_s
    done = 0
    for i in range(steps):
        opt.zero_grad(set_to_none=True)
        loss = crit(m(x), y)
        loss.backward()
        opt.step()
        done = i + 1
        if i == 0:
            first = loss.item()
        if deadline is not None and time.monotonic() > deadline:
            break
    m.eval()
    with torch.inference_mode():
        logits = m(x)
        last = crit(logits, y).item()
        acc = (logits.argmax(1) == y).float().mean().item()
    passed = acc >= 0.99 or last < 0.1 * first
    return {
        "passed": passed,
        "initial_loss": first,
        "final_loss": last,
        "batch_acc": acc,
        "steps": done,
        "batch": len(y),
        "lr": lr,
    }


PROCESS_BYTES = 256 * 2**20  # a loader process of an image folder (Python, NumPy, PIL and a share)


def data_memory_bytes(spec) -> int | None:
    """Host memory the images of a generated dataset take before the first step (uint8, plus the float32
    copy normalised once when it fits the device cache); an image folder's decoding and loader processes; None
    when only reading the dataset tells."""
    data = spec.data
    if catalog.dataset(data.name).kind == "folder":
        # its size is known once its files are listed; its decoding (and loader) processes are known now
        return decode.processes(spec.loader.num_workers) * PROCESS_BYTES
    if data.name != "synthetic":
        return None
    try:  # pretrained weights' input size and resize (core/preprocessing.py); a checkpoint's is read at load
        plan = preprocessing.choose(data, spec.model)
    except preprocessing.PreprocessError:
        return None  # refused when the data loads, with the reason
    size = plan.image_size or data.size
    side, per_image = plan.stored(size), data.num_samples * data.channels
    raw = per_image * data.size * data.size
    stored = per_image * side * side  # kept resized when it shrinks or fits data.cache_mb (core/preprocess_ops.py)
    raw = stored if side <= data.size or stored <= data.cache_mb * 2**20 else raw
    as_float = per_image * size * size * 4
    return raw + (as_float if as_float <= spec.loader.device_cache_mb * 2**20 else 0)


def available_memory_bytes() -> int | None:
    """MemAvailable of this host (Linux), or None where it cannot be read."""
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        return None
    return None


def training_memory(spec) -> tuple[str, int | None]:
    """Where the model trains ("GPU" or "host") and how many bytes are free there (None: cannot tell)."""
    if spec.device != "cpu" and torch.cuda.is_available():
        try:
            return "GPU", int(torch.cuda.mem_get_info()[0])
        except RuntimeError:
            return "GPU", None
    return "host", available_memory_bytes()


def check_memory(spec) -> None:
    """Refuse, before allocating anything, a run whose data cannot fit in this host's available memory, or
    whose model cannot be trained in the memory free where it trains (its weights, gradients, optimizer state
    and a batch's activations, as core.model_size estimates them)."""
    need, have = data_memory_bytes(spec), available_memory_bytes()
    if need is not None and have is not None and need > 0.8 * have:
        raise MemoryError(
            f"the dataset needs about {need / 2**30:.1f} GB of memory and this host has "
            f"{have / 2**30:.1f} GB available: lower data.num_samples or data.size "
            "(or loader.device_cache_mb, which keeps a float32 copy; or loader.num_workers, the processes that "
            "decode an image folder)"
        )
    where, free = training_memory(spec)
    e = model_size.estimate(spec, None if model_size.sized(spec.model.name) else timm_models.footprint(spec.model.name))
    total = e.total_bytes + ((need or 0) if where == "host" else 0)
    if free is not None and total > free:
        with_data = " and the dataset" if where == "host" and need else ""
        raise MemoryError(
            f"training {spec.model.name} takes about {model_size.gib(total)} ({e.parameters:,} parameters with their "
            f"gradients and optimizer state, the activations of {e.batch:,} samples{with_data}) and this {where} has "
            f"{model_size.gib(free)} free: {model_size.levers(spec)}"
        )
