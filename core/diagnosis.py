"""Online diagnosis: the troubleshooting table of docs/practices.md turned into events with advice.

Each finding is emitted once per cause as an event of kind "diagnosis" whose data holds
a stable `code`, the evidence and the `advice`, so the dashboard can show and filter them.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from core.events import Sink

ADVICE = {
    "non_finite_loss": "The loss became NaN/Inf: lower the learning rate (try 10× smaller), keep gradient clipping on "
    "(train.grad_clip.mode=norm), check the data for NaN or wrong scaling; with fp16 try bf16 or fp32.",
    "exploding_gradients": "Gradient norms are orders of magnitude above the other layers: lower the learning rate, "
    "clip gradients by norm (max 1.0), add normalisation layers, check the initialisation.",
    "vanishing_gradients": "Gradients below 1e-10 reach these layers: use ReLU-family activations, residual "
    "connections or normalisation, a better initialisation, or a larger learning rate for them.",
    "loss_not_decreasing": "The training loss is not going down: the learning rate may be too low (or far too high), "
    "labels may not match the images (look at the sample grid), or the model needs more epochs.",
    "overfitting": "Training accuracy keeps rising while validation falls behind: add augmentation "
    "(random crop, flip), dropout or weight decay, use a smaller model or more data; "
    "early stopping keeps the best epoch.",
    "data_bound": "Steps spend most of their time waiting for data, so the device idles: keep an image folder "
    "decoded (data.disk_cache on; data.cache_mb large enough to hold it in memory), raise loader.num_workers where "
    "images are decoded per batch, cache the dataset on the device (loader.device_cache_mb), pre-resize images.",
    "out_of_memory": "The device ran out of memory: lower train.batch_size (use train.accumulate to keep the "
    "effective batch), enable mixed precision (bf16/fp16), or model.gradient_checkpointing.",
    "class_imbalance": "Some classes have far fewer training samples than others: weight the loss "
    "(train.class_weights=inverse_frequency, or sqrt_inverse_frequency for a milder correction) or draw classes "
    "evenly (train.sampler=balanced), and judge the run by val/balanced_acc or val/f1_macro (as early stopping's "
    "monitor and a sweep's objective): val/acc rewards a model that neglects the rare classes.",
    "overfit_check_failed": "The model could not overfit a single batch: the model, the loss or the labels are broken "
    "(check the sample grid and the output shape) or the learning rate is far off.",
}


@dataclass
class _Epoch:
    train_loss: float
    train_acc: float
    val_loss: float
    val_acc: float
    data_wait: float


class Diagnoser:
    """Watches metrics as they are produced; emits each finding once."""

    def __init__(self, sink: Sink, vanish_threshold: float = 1e-10, explode_ratio: float = 1e3):
        self.sink = sink
        self.vanish, self.explode = vanish_threshold, explode_ratio
        self.history: list[_Epoch] = []
        self.emitted: set[str] = set()

    def emit(self, code: str, level: str, message: str, *, at_step: int, **data: object) -> None:
        """One finding, once per cause; `at_step` is the global step it belongs to (see core.events.Sink)."""
        key = f"{code}:{data.get('where', '')}"
        if key in self.emitted:
            return
        self.emitted.add(key)
        self.sink.event("diagnosis", level, message, {"code": code, "advice": ADVICE[code], **data}, step=at_step)

    def layer_norms(self, step: int, norms: dict[str, float]) -> None:
        """exploding = far above the other layers; vanishing = below 1e-10."""
        finite = {k: v for k, v in norms.items() if math.isfinite(v)}
        if len(finite) >= 2:
            for k, v in finite.items():
                others = sorted(x for j, x in finite.items() if j != k)
                median = others[len(others) // 2]
                if median > 0 and v > self.explode * median and v > 10.0:
                    self.emit(
                        "exploding_gradients",
                        "warning",
                        f"gradient norm of {k} is {v:.3g}, "
                        f"{v / median:.0f}× the median of the other layers (step {step})",
                        at_step=step,
                        where=k,
                        step=step,
                        value=v,
                    )
        for k, v in finite.items():
            if v < self.vanish:
                self.emit(
                    "vanishing_gradients",
                    "warning",
                    f"gradient norm of {k} is {v:.2e} (< {self.vanish:g}) at step {step}",
                    at_step=step,
                    where=k,
                    step=step,
                    value=v,
                )

    def epoch(self, epoch: int, m: dict[str, float], step: int) -> None:
        """End-of-epoch findings; `step` is the global step the epoch ended at."""
        self.history.append(
            _Epoch(
                m.get("train/epoch_loss", math.nan),
                m.get("train/acc", math.nan),
                m.get("val/loss", math.nan),
                m.get("val/acc", math.nan),
                m.get("data_wait_epoch", 0.0),
            )
        )
        h = self.history
        if len(h) >= 3 and h[-1].train_loss >= 0.99 * h[0].train_loss:
            self.emit(
                "loss_not_decreasing",
                "warning",
                f"training loss went from {h[0].train_loss:.4g} to {h[-1].train_loss:.4g} over {len(h)} epochs",
                at_step=step,
                epoch=epoch,
            )
        if len(h) >= 3:
            gaps = [e.train_acc - e.val_acc for e in h[-3:]]
            val_rising = h[-1].val_loss > h[-2].val_loss > h[-3].val_loss and h[-1].train_loss < h[-3].train_loss
            if (gaps[0] < gaps[1] < gaps[2] and gaps[2] > 0.1) or (val_rising and gaps[2] > 0.05):
                self.emit(
                    "overfitting",
                    "warning",
                    f"train/val accuracy gap grew to {gaps[2]:.1%} (val loss {h[-1].val_loss:.4g}) at epoch {epoch}",
                    at_step=step,
                    epoch=epoch,
                )
        if h[-1].data_wait > 0.5:
            self.emit(
                "data_bound",
                "warning",
                f"{h[-1].data_wait:.0%} of step time waited for data in epoch {epoch}",
                at_step=step,
                epoch=epoch,
                value=h[-1].data_wait,
            )
