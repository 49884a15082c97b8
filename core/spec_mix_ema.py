"""Two parts of the train section that change what the loop optimises and what it keeps: mixup / cutmix
(train.mix) and an exponential moving average of the weights (train.ema). core/spec_sections.py puts them into
TrainSpec; torch-free like every spec module (the dashboard validates specs with it)."""

from __future__ import annotations

from pydantic import Field

from core.spec_base import Section


class MixSpec(Section):
    """Mixup and cutmix: a training batch mixed with itself, the labels mixed in the same proportion."""

    mixup_alpha: float = Field(
        0.0,
        ge=0.0,
        le=10.0,
        description="Mixup: each picked batch is blended with itself shifted by one sample, in a proportion drawn "
        "from Beta(alpha, alpha), and so are its labels; 0 turns mixup off (0.2 is the usual start).",
    )
    cutmix_alpha: float = Field(
        0.0,
        ge=0.0,
        le=10.0,
        description="Cutmix: a box of each picked batch is replaced by the same box of the batch shifted by one "
        "sample, its area drawn from Beta(alpha, alpha); the labels are mixed by area. 0 turns cutmix off "
        "(1.0 is the usual value).",
    )
    prob: float = Field(
        1.0,
        ge=0.0,
        le=1.0,
        description="Probability that a training batch is mixed at all (with mixup and/or cutmix on). On a mixed "
        "batch, train/acc counts a prediction right when it names the class with the larger share of the mix.",
    )
    switch_prob: float = Field(
        0.5,
        ge=0.0,
        le=1.0,
        description="With both mixup and cutmix on: probability that a mixed batch uses cutmix rather than mixup.",
    )

    @property
    def enabled(self) -> bool:
        return self.prob > 0 and (self.mixup_alpha > 0 or self.cutmix_alpha > 0)


class EmaSpec(Section):
    """An exponential moving average of the weights, evaluated every epoch beside the trained weights."""

    enabled: bool = Field(
        False,
        description="Keep an exponential moving average (EMA) of the weights and buffers, updated after every "
        "optimizer step and evaluated after every epoch (val/loss_ema, val/acc_ema, ...). When it scores better on "
        "the early-stopping monitor (a val/ metric) than the trained weights, the EMA weights are the ones that "
        "epoch counts for (early stopping, the best checkpoint) and the ones exported. The plateau schedule and a "
        "sweep's objective and pruning follow the trained weights' figures (val/acc, not val/acc_ema).",
    )
    decay: float = Field(
        0.999,
        gt=0.0,
        lt=1.0,
        description="EMA decay per optimizer step: ema = decay × ema + (1 − decay) × weights. The average spans "
        "about 1 / (1 − decay) steps (0.999: the last ~1,000 steps); choose it against the steps a run takes.",
    )
    warmup: bool = Field(
        True,
        description="Use min(decay, (1 + n) / (10 + n)) at update n, so the average follows the weights "
        "closely in the first steps instead of remembering the random initialisation.",
    )
