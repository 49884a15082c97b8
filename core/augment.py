"""Training-split augmentation as batched tensor ops on the device: every sample's draw comes from the epoch's
generator, so a run is repeatable and a resumed one draws what the uninterrupted one would have.

The order: the crop (RandomResizedCrop, or the padded random crop then the centre crop to the input size), the
flip, the automatic policy (TrivialAugment / RandAugment), the colour jitter, random erasing. The photo recipe's
operations are core/photo_augment.py's.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from core.photo_augment import auto_augment, random_erasing, random_resized_crop
from core.preprocess_ops import centre_crop
from core.spec_sections import AugmentSpec


def augment_batch(
    x: torch.Tensor, aug: AugmentSpec, gen: torch.Generator, size: int | None = None, *, uint8_out: bool = False
) -> torch.Tensor:
    """uint8 or float [0, 1] images at the stored side → augmented float [0, 1] images of size × size (None: the
    stored side). uint8 ones stay uint8 through the crop and the flip (the smaller batch; on the CPU the crops are
    resized in uint8) and become floats before the first operation that needs them; `uint8_out`: returned as uint8
    when none did (the caller normalises them in one pass)."""
    b, _, h, w = x.shape
    dev = x.device
    size = size or min(h, w)
    if aug.random_resized_crop:
        x = random_resized_crop(x, size, aug.rrc_scale, aug.rrc_ratio, gen)
    else:
        x = centre_crop(_padded_crop(x, aug, gen), size)
    if aug.hflip:
        flip = torch.rand(b, generator=gen, device=dev) < 0.5
        if aug.random_resized_crop and dev.type == "cpu":  # the crops are this call's own: flipped where they lie
            for i in flip.nonzero().flatten().tolist():
                x[i] = x[i].flip(2)
        else:
            x = torch.where(flip[:, None, None, None], x.flip(3), x)
    if aug.policy != "none" or aug.color_jitter > 0 or aug.random_erasing > 0:
        x = as_float(x)
    if aug.policy != "none":
        x = auto_augment(x, aug, gen)
    if aug.color_jitter > 0:
        s = aug.color_jitter
        bright = 1 + (torch.rand(b, 1, 1, 1, generator=gen, device=dev) * 2 - 1) * s
        contrast = 1 + (torch.rand(b, 1, 1, 1, generator=gen, device=dev) * 2 - 1) * s
        x = (x * bright).clamp(0, 1)
        m = x.mean(dim=(1, 2, 3), keepdim=True)  # contrast around the brightened image's own mean
        x = ((x - m) * contrast + m).clamp(0, 1)
    if aug.random_erasing > 0:
        x = random_erasing(x, aug.random_erasing, gen)
    return x.contiguous() if uint8_out else as_float(x).contiguous()


def as_float(x: torch.Tensor) -> torch.Tensor:
    """Stored uint8 images as float [0, 1] (a new tensor); float ones as they are."""
    return x.float().div_(255.0) if x.dtype == torch.uint8 else x


def _padded_crop(x: torch.Tensor, aug: AugmentSpec, gen: torch.Generator) -> torch.Tensor:
    """A random crop of the original size after zero padding by crop_padding px, per sample."""
    if not (aug.random_crop and aug.crop_padding > 0):
        return x
    b, _, h, w = x.shape
    dev = x.device
    p = aug.crop_padding
    padded = F.pad(x, (p, p, p, p))
    dy = torch.randint(0, 2 * p + 1, (b,), generator=gen, device=dev)
    dx = torch.randint(0, 2 * p + 1, (b,), generator=gen, device=dev)
    rows = (dy[:, None] + torch.arange(h, device=dev))[:, :, None]  # (B, H, 1)
    cols = (dx[:, None] + torch.arange(w, device=dev))[:, None, :]  # (B, 1, W)
    return padded.permute(0, 2, 3, 1)[torch.arange(b, device=dev)[:, None, None], rows, cols].permute(0, 3, 1, 2)
