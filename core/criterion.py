"""The training loss, built in one place: cross-entropy on raw logits with train.label_smoothing and, when
train.class_weights asks, per-class weights from the training split's class counts (DataInfo.class_counts).

Targets are class indices (N,) or probabilities (N, C) (mixup/cutmix's soft targets). One formula covers both,
with t the target distribution, t' = (1 - ε)·t + ε/C its smoothed form and w the class weights (all 1 without):

    loss = Σ_n Σ_c w_c · t'_nc · (−log softmax(logits)_nc)  /  (N · w̄)

with N the batch's samples and w̄ the mean sample weight over the whole training split (Σ_c n_c·w_c / Σ_c n_c:
exactly 1 for inverse_frequency). The denominator is a constant per sample, not the summed weights of the batch
at hand (torch's `cross_entropy(weight=…)`), so a global batch means the same loss however it is cut into
micro-batches (train.accumulate) or shards (resources.gpus): each part's loss is a plain mean that adds up. A
one-hot probability target gives the same value as its index. Without weights it is the plain mean. The validation loss
(core/evaluation.py) stays unweighted, so val/loss compares across runs whatever their weights.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.nn.functional as F

from core.spec_sections import TrainSpec


def class_weights(counts: Sequence[int], mode: str) -> torch.Tensor | None:
    """Per-class loss weights for the training split's class `counts` (N samples, C classes): None for `none`;
    inverse_frequency: N / (C · n_c), scikit-learn's "balanced" (each class then adds the same total weight, and
    a balanced split gets 1 everywhere); sqrt_inverse_frequency: its square root. A class without training
    samples is counted as one sample (its weight only matters under label smoothing)."""
    if mode == "none":
        return None
    n = torch.as_tensor(list(counts), dtype=torch.float64)
    if n.numel() == 0:
        raise ValueError("train.class_weights needs the training split's class counts; none were recorded")
    w = n.sum() / (n.numel() * n.clamp_min(1.0))
    if mode == "sqrt_inverse_frequency":
        w = w.sqrt()
    elif mode != "inverse_frequency":
        raise ValueError(
            f"unknown train.class_weights {mode!r}; known: none, inverse_frequency, sqrt_inverse_frequency"
        )
    return w.float()


class Criterion:
    """`criterion(logits, target)`: the training loss of a batch, for class indices (int64, (N,)) or
    probabilities (float, (N, C)); logits are taken in float32."""

    def __init__(self, weight: torch.Tensor | None, label_smoothing: float, mean_weight: float = 1.0) -> None:
        self.weight, self.smoothing, self.mean_weight = weight, label_smoothing, mean_weight

    def __call__(self, logits: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        logits = logits.float()
        if self.weight is None and not target.is_floating_point():
            return F.cross_entropy(logits, target, label_smoothing=self.smoothing)
        if not target.is_floating_point():
            target = F.one_hot(target, logits.shape[1]).float()
        return soft_cross_entropy(logits, target, self.weight, self.smoothing, self.mean_weight)


def soft_cross_entropy(
    logits: torch.Tensor,
    target: torch.Tensor,
    weight: torch.Tensor | None = None,
    label_smoothing: float = 0.0,
    mean_weight: float = 1.0,
) -> torch.Tensor:
    """The module's formula for probability targets (N, C): Σ_n Σ_c w_c t'_nc (−log p_nc) / (N · mean_weight)."""
    c = logits.shape[1]
    if target.shape != logits.shape:
        raise ValueError(f"probability targets must be (batch, classes) = {tuple(logits.shape)}, got {target.shape}")
    t = target.float()
    smoothed = t * (1.0 - label_smoothing) + label_smoothing / c if label_smoothing else t
    w = weight.to(logits.device) if weight is not None else None
    per_class = -logits.log_softmax(1) * smoothed
    if w is None:
        return per_class.sum() / len(t)
    return (per_class * w).sum() / (len(t) * mean_weight)


def build_criterion(train: TrainSpec, class_counts: Sequence[int], device: torch.device) -> Criterion:
    """The run's training criterion: train.label_smoothing, and train.class_weights from the class counts."""
    w = class_weights(class_counts, train.class_weights)
    if w is None:
        return Criterion(None, train.label_smoothing)
    n = torch.as_tensor(list(class_counts), dtype=torch.float64)
    mean_weight = float((n * w.double()).sum() / n.sum().clamp_min(1.0))
    return Criterion(w.to(device), train.label_smoothing, mean_weight)
