"""Mixup and cutmix of training batches (train.mix), through torchvision's v2 MixUp and CutMix.

A batch is mixed with itself shifted by one sample (torchvision's pairing): mixup blends the images, cutmix pastes a
box; either way the labels become probabilities, λ of a sample's own class and 1 − λ of its partner's (cutmix's λ
is the area actually kept). The loss is the run's criterion on those probability targets (cross-entropy accepts
them; label smoothing then mixes each target with the uniform distribution, and class weights weigh each class's
term), i.e. λ · loss(own label) + (1 − λ) · loss(partner's label).

torchvision's transforms draw from torch's global generator; here every draw (mixed or not, which of the two, λ,
the box) comes from a generator of the run's seed and the epoch alone, so a resumed run mixes exactly as the
uninterrupted one would have, and the global streams (dropout's) are left as they were.

train/acc of a mixed batch counts a prediction right when it names the class with the larger share of the sample's
mixed target (its own class when λ ≥ 0.5).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torchvision.transforms import v2

from core.batches import epoch_generator
from core.spec_sections import MixSpec

MIX_STREAM = 2  # the mixing stream's offset from the run's seed (augmentation uses seed + 1 + 7919 · rank)


class Mixer:
    """One epoch's mixing: `mixer(x, y)` → (images, probability targets, the label each target leans to)."""

    def __init__(self, spec: MixSpec, num_classes: int, seed: int, epoch: int) -> None:
        self.spec, self.num_classes = spec, num_classes
        self.gen = epoch_generator(seed + MIX_STREAM, epoch, torch.device("cpu"))
        self.mixup = v2.MixUp(alpha=spec.mixup_alpha, num_classes=num_classes) if spec.mixup_alpha > 0 else None
        self.cutmix = v2.CutMix(alpha=spec.cutmix_alpha, num_classes=num_classes) if spec.cutmix_alpha > 0 else None

    def _choose(self) -> tuple[v2.Transform | None, int]:
        """This batch's transform (None: not mixed) and the seed of its own draws (λ, the box). Always three
        draws, whatever they decide, so the next batch's do not depend on them."""
        apply, switch = torch.rand(2, generator=self.gen).tolist()
        seed = int(torch.randint(2**62, (1,), generator=self.gen))
        if apply >= self.spec.prob:
            return None, seed
        if self.mixup is not None and self.cutmix is not None:
            return (self.cutmix if switch < self.spec.switch_prob else self.mixup), seed
        return self.mixup or self.cutmix, seed

    def __call__(self, x: torch.Tensor, y: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        chosen, seed = self._choose()
        if chosen is None or len(y) < 2:  # one-hot targets: the same loss as the labels, on the same footing
            return x, F.one_hot(y, self.num_classes).to(x.dtype), y
        with torch.random.fork_rng(devices=[]):  # torch's CPU stream, restored after; CUDA's untouched
            torch.default_generator.manual_seed(seed)
            mixed, target = chosen(x, y)
        return mixed, target, target.argmax(1)


def epoch_mixer(spec: MixSpec, num_classes: int, seed: int, epoch: int) -> Mixer | None:
    """The epoch's Mixer, or None when train.mix is off."""
    return Mixer(spec, num_classes, seed, epoch) if spec.enabled else None
