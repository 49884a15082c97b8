"""A split's images as one uint8 tensor, however load_data holds them (a tensor, or a set served from the image
cache's pages)."""

from __future__ import annotations

import torch

from core.cached_images import CachedImages


def whole(images) -> torch.Tensor:
    return images.in_memory() if isinstance(images, CachedImages) else images
