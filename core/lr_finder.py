"""The LR range test of the pre-flight (train.lr_finder): the learning rate grows exponentially from start_lr to
end_lr over `steps` optimizer steps on copies of the model and the optimizer, on batches of the training split,
and the loss of every step is recorded.

The suggested optim.lr is a tenth of the learning rate at which the smoothed loss was lowest: the lowest point is
where the step became too large, and a tenth of it still descends quickly (the steepest descent, also reported,
is noisier on a short test). The loss is smoothed by an exponential moving average (β = SMOOTHING, bias-corrected)
and the test stops once the smoothed loss exceeds STOP_FACTOR × its lowest value, or turns non-finite.

The run is untouched: its model, optimizer, scaler, batches and the global random streams (torch, CUDA, NumPy,
Python) are as they were, so a run trains identically with or without the test. Discriminative learning rates
keep their ratios: every parameter group's rate is its share of optim.lr times the test's rate. Batches are the
global train.batch_size (accumulated train.accumulate times per step, as in training), from the test's own
order (its epochs are numbered 0, -1, …, never a training epoch's), augmented as training augments.
"""

from __future__ import annotations

import copy
import json
import math
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import torch

from core.batches import epoch_generator, make_batches
from core.checkpoint import rng_state, set_rng_state
from core.criterion import build_criterion
from core.names import LR_FINDER
from core.optim import AmpStep, build_optimizer, set_train_mode
from core.trainer import Trainer, prepare

SMOOTHING = 0.98
STOP_FACTOR = 4.0
METHOD = "a tenth of the learning rate at the smoothed loss's minimum"
FILE = "lr_finder.json"


def learning_rates(start: float, end: float, steps: int) -> list[float]:
    """`steps` learning rates from start to end, evenly spaced on a log scale."""
    return [start * (end / start) ** (i / (steps - 1)) for i in range(steps)]


def smooth(losses: list[float], beta: float = SMOOTHING) -> list[float]:
    """The bias-corrected exponential moving average of `losses` (the first value is the first loss)."""
    avg, out = 0.0, []
    for i, v in enumerate(losses):
        avg = beta * avg + (1 - beta) * v
        out.append(avg / (1 - beta ** (i + 1)))
    return out


def suggest(lrs: list[float], smoothed: list[float]) -> dict[str, Any]:
    """The suggestion from a test's curve: `suggested_lr` (None when the loss never clearly fell: less than 5% below
    its start, or lowest within the first three steps), `min_loss_lr` and `steepest_lr`."""
    finite = [i for i, v in enumerate(smoothed) if math.isfinite(v)]
    if len(finite) < 4:
        return {"suggested_lr": None, "min_loss_lr": None, "steepest_lr": None}
    best = min(finite, key=smoothed.__getitem__)
    head = list(range(best + 1))
    slopes = np.gradient(np.asarray([smoothed[i] for i in head]), np.log([lrs[i] for i in head])) if best > 1 else None
    steepest = lrs[int(np.argmin(slopes))] if slopes is not None else None
    fell = best >= 3 and smoothed[best] < 0.95 * smoothed[0]
    return {"suggested_lr": lrs[best] / 10 if fell else None, "min_loss_lr": lrs[best], "steepest_lr": steepest}


def _stream(t: Trainer) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
    """Endless batches of the global batch size from the test's own epochs 0, -1, -2, …"""
    spec = t.spec
    batches = make_batches(
        t.data.train,
        spec.train.batch_size,
        True,
        t.device,
        spec.seed,
        spec.loader,
        balanced=spec.train.sampler == "balanced",
    )
    epoch = 0
    while True:
        batches.set_epoch(epoch)
        yield from batches
        epoch -= 1


def _sweep(t: Trainer) -> tuple[list[float], list[float], str | None]:
    """The test itself: (learning rates tried, their losses, why it stopped early or None)."""
    spec, cfg = t.spec, t.spec.train.lr_finder
    model = copy.deepcopy(t.model)
    set_train_mode(model)
    opt = build_optimizer(model, spec.optim, spec.model)
    shares = [g["lr"] / spec.optim.lr for g in opt.param_groups]
    params = [p for p in model.parameters() if p.requires_grad]
    amp, crit = AmpStep(spec.train, t.device.type), build_criterion(spec.train, t.data.info.class_counts, t.device)
    gen = epoch_generator(spec.seed + 1, 0, t.device) if t.pre_train.augment else None
    # rank 0 runs the test alone: the run's own control, never the one the ranks call together
    control = getattr(t.control, "inner", None) if t.ranks.world > 1 else t.control
    stream, tried, losses, stopped, lowest = _stream(t), [], [], None, math.inf
    for lr in learning_rates(cfg.start_lr, cfg.end_lr, cfg.steps):
        if control is not None and control.should_stop():
            stopped = "cancelled"
            break
        for group, share in zip(opt.param_groups, shares, strict=True):
            group["lr"] = lr * share
        loss_sum = torch.zeros((), device=t.device)
        for _ in range(spec.train.accumulate):
            x, y = next(stream)
            with amp.autocast():
                logits = model(prepare(t.pre_train, x, gen))
            loss = crit(logits, y)
            amp.backward(loss / spec.train.accumulate)
            loss_sum += loss.detach() / spec.train.accumulate
        amp.step(opt, params, want_norm=False)
        tried.append(lr)
        losses.append(loss_sum.item())
        current = smooth(losses)[-1]
        lowest = min(lowest, current)
        if not math.isfinite(current) or current > STOP_FACTOR * lowest:
            stopped = "diverged"
            break
    stream.close()  # a loader's worker processes end here, not whenever the generator is collected
    return tried, losses, stopped


def lr_range_test(t: Trainer) -> dict[str, Any]:
    """Run the test on copies (the run's state and random streams restored after); returns the curve and the
    suggestion, as the `lr_finder` event's data and lr_finder.json hold them."""
    state = rng_state()
    try:
        lrs, losses, stopped = _sweep(t)
    finally:
        set_rng_state(state)
    smoothed = smooth(losses)
    return {
        "code": "lr_finder",
        "lrs": [float(f"{v:.4g}") for v in lrs],
        "losses": [float(f"{v:.5g}") for v in losses],
        "smoothed": [float(f"{v:.5g}") for v in smoothed],
        **suggest(lrs, smoothed),
        "method": METHOD,
        "stopped": stopped,
        "optim_lr": t.spec.optim.lr,
        "start_lr": t.spec.train.lr_finder.start_lr,
        "end_lr": t.spec.train.lr_finder.end_lr,
    }


def report(t: Trainer, result: dict[str, Any], out: Path) -> None:
    """lr_finder.json as an artifact, and the pre-flight event with the suggestion (a warning when there is none)."""
    path = out / FILE
    path.write_text(json.dumps(result, indent=1, default=str))
    s, used = result["suggested_lr"], result["optim_lr"]
    t.sink.artifact(LR_FINDER, str(path), {"suggested_lr": s, "method": METHOD})
    if s is None:
        message = (
            f"LR range test: the loss did not clearly fall between {result['start_lr']:g} and {result['end_lr']:g} "
            f"in {len(result['lrs'])} steps: no learning rate suggested"
        )
        t.sink.event("preflight", "warning", message, result, step=0)
        return
    far = f" ({max(used / s, s / used):.0f}× away)" if max(used / s, s / used) >= 3 else ""
    message = (
        f"LR range test: suggested optim.lr {s:.2g} ({METHOD}, {result['min_loss_lr']:.2g}); "
        f"this run uses {used:g}{far}"
    )
    t.sink.event("preflight", "info", message, result, step=0)
