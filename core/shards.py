"""How a run on several processes cuts its batches: every rank takes positions rank, rank + world, … of
the order a single process would use, so the ranks' batch k together are exactly a single process's
global batch k (core.data's loaders use these when `world` > 1)."""

from __future__ import annotations

from collections.abc import Iterator

import torch
from torch.utils.data import Sampler


def shard_scale(n: int, batch_size: int, world: int, i: int, local_n: int) -> float:
    """What a rank multiplies its micro-batch's mean loss by so that DDP's average of the ranks' gradients is
    the gradient of the mean over the whole global batch i, also when the ranks' shares are unequal (the
    last, partial batch): local_n · world / global_n; exactly 1.0 for a single process and for full batches."""
    if world == 1:
        return 1.0
    global_n = min(batch_size * world, n - i * batch_size * world)
    return local_n * world / global_n


class ShardSampler(Sampler[int]):
    """Rank `rank`'s positions (rank, rank + world, …) of the permutation a single process's shuffling
    DataLoader draws from the same generator (drawn at the same moment: after the loader's base seed)."""

    def __init__(self, n: int, rank: int, world: int, shuffle: bool, gen: torch.Generator):
        self.n, self.rank, self.world, self.shuffle, self.gen = n, rank, world, shuffle, gen

    def __len__(self) -> int:
        return len(range(self.rank, self.n, self.world))

    def __iter__(self) -> Iterator[int]:
        order = torch.randperm(self.n, generator=self.gen) if self.shuffle else torch.arange(self.n)
        yield from order[self.rank :: self.world].tolist()
