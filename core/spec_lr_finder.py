"""The spec of the pre-flight LR range test (train.lr_finder; core/lr_finder.py runs it) and of the help an
unbalanced training split gets (train.class_weights, train.sampler; core/criterion.py and core/balanced.py).

Torch-free, like the other spec modules: the dashboard validates specs with it.
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field, model_validator

from core.spec_base import Section

ClassWeights = Literal["none", "inverse_frequency", "sqrt_inverse_frequency"]
Sampler = Literal["shuffle", "balanced"]

CLASS_WEIGHTS_HELP = (
    "Weights of the training loss per class, from the training split's class counts n_c (N samples, C classes): "
    "none; inverse_frequency: N / (C · n_c) (scikit-learn's 'balanced': every class adds the same total weight); "
    "sqrt_inverse_frequency: its square root, a milder correction. The loss is the weighted sum divided by the "
    "batch size × the split's mean sample weight (1 for inverse_frequency), so a global batch's loss is the same "
    "however train.accumulate or resources.gpus cut it; train/loss is weighted; val/loss stays the "
    "plain cross-entropy, comparable between runs with and without weights."
)
SAMPLER_HELP = (
    "The order of the training split each epoch: shuffle (every sample once); balanced: as many draws of every "
    "class (a class with few samples repeats them, a large one uses a different subset each epoch), the epoch "
    "keeping the split's size. Seeded by (seed, epoch), so a resumed run draws the same batches; on several "
    "processes each takes its shard of the same order. Use it or class_weights, not both."
)


class LrFinderSpec(Section):
    """The LR range test before the first epoch: the learning rate grows exponentially from start_lr to end_lr
    over `steps` optimizer steps on a copy of the model and optimizer (the run's own are untouched), and the
    suggested optim.lr is a tenth of the learning rate where the smoothed loss was lowest."""

    enabled: bool = Field(
        False,
        description="Run the LR range test in the pre-flight: its loss curve is shown on the Run page with a "
        "suggested optim.lr (the run itself still trains at optim.lr).",
    )
    start_lr: float = Field(1e-7, gt=0.0, le=1.0, description="LR range test: the learning rate of its first step.")
    end_lr: float = Field(
        10.0, gt=0.0, le=1000.0, description="LR range test: the learning rate of its last step (above start_lr)."
    )
    steps: int = Field(
        100,
        ge=10,
        le=500,
        description="LR range test: optimizer steps (batches of train.batch_size, cycling through the training "
        "split); it stops early once the loss is 4× its lowest.",
    )

    @model_validator(mode="after")
    def _rising(self) -> LrFinderSpec:
        if self.end_lr <= self.start_lr:
            raise ValueError(
                f"train.lr_finder.end_lr ({self.end_lr:g}) must be above train.lr_finder.start_lr ({self.start_lr:g})"
            )
        return self
