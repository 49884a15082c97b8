"""Training-split augmentation as batched tensor ops on the device: every sample's draw comes from the epoch's
generator, so a run is repeatable and a resumed one draws what the uninterrupted one would have.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from core.spec_sections import AugmentSpec


def augment_batch(x: torch.Tensor, aug: AugmentSpec, gen: torch.Generator) -> torch.Tensor:
    b, _, h, w = x.shape
    dev = x.device
    if aug.random_crop and aug.crop_padding > 0:
        p = aug.crop_padding
        padded = F.pad(x, (p, p, p, p))
        dy = torch.randint(0, 2 * p + 1, (b,), generator=gen, device=dev)
        dx = torch.randint(0, 2 * p + 1, (b,), generator=gen, device=dev)
        rows = (dy[:, None] + torch.arange(h, device=dev))[:, :, None]  # (B, H, 1)
        cols = (dx[:, None] + torch.arange(w, device=dev))[:, None, :]  # (B, 1, W)
        x = padded.permute(0, 2, 3, 1)[torch.arange(b, device=dev)[:, None, None], rows, cols].permute(0, 3, 1, 2)
    if aug.hflip:
        flip = torch.rand(b, generator=gen, device=dev) < 0.5
        x = torch.where(flip[:, None, None, None], x.flip(3), x)
    if aug.color_jitter > 0:
        s = aug.color_jitter
        bright = 1 + (torch.rand(b, 1, 1, 1, generator=gen, device=dev) * 2 - 1) * s
        contrast = 1 + (torch.rand(b, 1, 1, 1, generator=gen, device=dev) * 2 - 1) * s
        x = (x * bright).clamp(0, 1)
        m = x.mean(dim=(1, 2, 3), keepdim=True)  # contrast around the brightened image's own mean
        x = ((x - m) * contrast + m).clamp(0, 1)
    return x.contiguous()
