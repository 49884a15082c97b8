"""The photo recipe's augmentations on a batch, every sample with its own random parameters, all drawn from the
epoch's generator (core/augment.py calls them on float [0, 1] images on the device):

- `random_resized_crop`: torchvision's RandomResizedCrop rule (area fraction, log-uniform aspect ratio, ten tries
  then the centre), the crops resized in one call of torchvision.ops.roi_align (adaptive sampling averages the
  pixels of a shrunk box, like an antialiased resize); uint8 images on the CPU, each by torchvision's uint8 kernel
  before they become floats (cheaper there).
- `auto_augment`: TrivialAugment (TrivialAugmentWide) or RandAugment with torchvision's own operations and
  magnitudes. A v2 transform called on a batch tensor draws one operation for the whole batch; here each sample
  draws its own operation, strength and sign, and the samples that drew the same are transformed together by
  the transform's own table and operation (`_AUGMENTATION_SPACE`, `_apply_image_or_video_transform`: members of
  torchvision's pinned version, checked sample by sample against it in tests/core/test_photo_recipe.py).
- `random_erasing`: torchvision's RandomErasing rule (area 2–33 %, aspect 0.3–3.3, ten tries), batched as masks,
  the box filled with a random colour.
"""

from __future__ import annotations

import math

import torch
from torchvision.ops import roi_align
from torchvision.transforms import v2

from core.spec_sections import AugmentSpec

_TRIES = 10  # torchvision's tries before RandomResizedCrop falls back to the centre and RandomErasing gives up


def _first_fit(ok: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Per row of a (B, tries) mask: the index of the first True and whether there is one."""
    found = ok.any(1)
    first = torch.where(ok, torch.arange(ok.shape[1], 0, -1, device=ok.device), 0).argmax(1)
    return first, found


def _boxes(
    b: int, h: int, w: int, scale: tuple[float, float], ratio: tuple[float, float], gen: torch.Generator
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """`_TRIES` candidate boxes per sample: heights, widths (B, tries), as torchvision rounds them; and whether
    each fits in the image."""
    dev = gen.device
    area = h * w * (scale[0] + (scale[1] - scale[0]) * torch.rand(b, _TRIES, generator=gen, device=dev))
    lo, hi = math.log(ratio[0]), math.log(ratio[1])
    aspect = torch.exp(lo + (hi - lo) * torch.rand(b, _TRIES, generator=gen, device=dev))
    bw = torch.sqrt(area * aspect).round()
    bh = torch.sqrt(area / aspect).round()
    return bh, bw, (bw > 0) & (bw <= w) & (bh > 0) & (bh <= h)


def _place(extent: torch.Tensor, side: int, gen: torch.Generator) -> torch.Tensor:
    """A uniform offset in 0 .. side − extent for each box (torchvision's randint(0, side − extent + 1))."""
    u = torch.rand(extent.shape, generator=gen, device=gen.device)
    return torch.minimum((u * (side - extent + 1)).floor(), side - extent)


def random_resized_crop(
    x: torch.Tensor, size: int, scale: tuple[float, float], ratio: tuple[float, float], gen: torch.Generator
) -> torch.Tensor:
    """(B, C, H, W) → (B, C, size, size): per sample a box of area fraction in `scale` and aspect ratio in
    `ratio` (torchvision's RandomResizedCrop.get_params, ten tries, else its centre fallback), resized bilinearly;
    float [0, 1] out (uint8 images come in as they are stored), uint8 for uint8 images on the CPU."""
    b, _, h, w = x.shape
    bh, bw, ok = _boxes(b, h, w, scale, ratio, gen)
    first, found = _first_fit(ok)
    rows = torch.arange(b, device=x.device)
    bh, bw = bh[rows, first], bw[rows, first]
    # torchvision's fallback: the whole image, clamped to the ratio range, centred
    in_ratio = w / h
    fw = w if in_ratio <= ratio[1] else round(h * ratio[1])
    fh = h if in_ratio >= ratio[0] else round(w / ratio[0])
    bh = torch.where(found, bh, float(fh))
    bw = torch.where(found, bw, float(fw))
    top = torch.where(found, _place(bh, h, gen), float((h - fh) // 2))
    left = torch.where(found, _place(bw, w, gen), float((w - fw) // 2))
    if x.dtype == torch.uint8 and x.device.type == "cpu":
        return _resized_crops_uint8(x, torch.stack([top, left, bh, bw], 1), size)
    if x.dtype == torch.uint8:
        x = x.float().div_(255.0)
    boxes = torch.stack([rows.to(x.dtype), left.to(x.dtype), top.to(x.dtype), (left + bw).to(x.dtype)], 1)
    boxes = torch.cat([boxes, (top + bh).to(x.dtype)[:, None]], 1)
    # aligned=True: box edges are pixel edges; sampling_ratio=-1: ceil(box / size) samples per output pixel
    return roi_align(x, boxes, output_size=(size, size), spatial_scale=1.0, sampling_ratio=-1, aligned=True)


def _resized_crops_uint8(x: torch.Tensor, boxes: torch.Tensor, size: int) -> torch.Tensor:
    """uint8 images on the CPU: each box cropped and resized by torchvision's uint8 antialiased bilinear kernel (PIL's
    algorithm, vectorised), before any float copy of the batch: about three times roi_align's speed on floats there
    (benchmarks/bench_data.py). Returns uint8."""
    out = torch.empty((x.shape[0], x.shape[1], size, size), dtype=torch.uint8)
    for i, (top, left, h, w) in enumerate(boxes.long().tolist()):
        out[i] = v2.functional.resized_crop(x[i], top, left, h, w, [size, size], antialias=True)
    return out


def random_erasing(x: torch.Tensor, p: float, gen: torch.Generator) -> torch.Tensor:
    """With probability p per sample, a random box (area 2–33 %, aspect 0.3–3.3) filled with a random colour (a
    uniform value per channel: cheaper than per-pixel noise, which would draw a number for every pixel of the
    batch)."""
    b, c, h, w = x.shape
    dev = x.device
    bh, bw, ok = _boxes(b, h, w, (0.02, 0.33), (0.3, 3.3), gen)
    ok &= (bh < h) & (bw < w)  # torchvision's RandomErasing keeps boxes strictly inside
    first, found = _first_fit(ok)
    rows = torch.arange(b, device=dev)
    bh, bw = bh[rows, first], bw[rows, first]
    top, left = _place(bh, h, gen), _place(bw, w, gen)
    erase = found & (torch.rand(b, generator=gen, device=dev) < p)
    ys = torch.arange(h, device=dev, dtype=x.dtype)[None, :, None]
    xs = torch.arange(w, device=dev, dtype=x.dtype)[None, None, :]
    inside = (ys >= top[:, None, None]) & (ys < (top + bh)[:, None, None])
    inside = inside & (xs >= left[:, None, None]) & (xs < (left + bw)[:, None, None])
    mask = (inside & erase[:, None, None])[:, None]  # (B, 1, H, W)
    colour = torch.rand(b, c, 1, 1, generator=gen, device=dev, dtype=x.dtype)  # one per sample and channel
    return torch.where(mask, colour, x)


def _policy(aug: AugmentSpec) -> v2.TrivialAugmentWide | v2.RandAugment:
    if aug.policy == "trivial":
        return v2.TrivialAugmentWide()
    return v2.RandAugment(num_ops=aug.num_ops, magnitude=aug.magnitude)


def _draw(
    t: v2.TrivialAugmentWide | v2.RandAugment, aug: AugmentSpec, b: int, h: int, w: int, gen: torch.Generator
) -> list[tuple[int, float]]:
    """One layer's draws: per sample the index of its operation in the table and its signed strength (read on the
    host: the samples are grouped by them)."""
    space = list(t._AUGMENTATION_SPACE.values())
    bins = t.num_magnitude_bins
    op = torch.randint(len(space), (b,), generator=gen, device=gen.device)
    if aug.policy == "trivial":
        level = torch.randint(bins, (b,), generator=gen, device=gen.device)
    else:
        level = torch.full((b,), aug.magnitude, device=gen.device)
    negative = torch.rand(b, generator=gen, device=gen.device) < 0.5
    tables = [fn(bins, h, w) for fn, _ in space]
    drawn = []
    for o, lv, neg in torch.stack([op, level, negative.long()], 1).tolist():
        m = 0.0 if tables[o] is None else float(tables[o][lv])
        drawn.append((o, -m if space[o][1] and neg else m))
    return drawn


def auto_augment(x: torch.Tensor, aug: AugmentSpec, gen: torch.Generator) -> torch.Tensor:
    """TrivialAugment (one operation, a random strength of 31 bins, per sample) or RandAugment (num_ops
    operations at `magnitude`, per sample) with torchvision's operation table; signed strengths get a random sign.
    Per layer the draws are read on the host once and the samples sorted by them: each group of samples that
    drew the same operation and strength is one call of torchvision's operation on a slice."""
    t = _policy(aug)
    names = list(t._AUGMENTATION_SPACE)
    b, _, h, w = x.shape
    for _ in range(1 if aug.policy == "trivial" else aug.num_ops):
        drawn = _draw(t, aug, b, h, w, gen)
        order = sorted(range(b), key=drawn.__getitem__)
        back = [0] * b  # where each sample went in the sorted order
        for pos, i in enumerate(order):
            back[i] = pos
        perm, inverse = torch.as_tensor([order, back], device=x.device)  # one copy to the device per layer
        xs, ys, start = x[perm], torch.empty_like(x), 0
        while start < b:
            end = start + 1
            while end < b and drawn[order[end]] == drawn[order[start]]:
                end += 1
            o, m = drawn[order[start]]
            done = t._apply_image_or_video_transform(xs[start:end], names[o], m, t.interpolation, t._fill)
            ys[start:end] = done.clamp(0, 1)
            start = end
        x = ys[inverse]  # a gather: deterministic on every device
    return x
