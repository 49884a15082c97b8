"""train.sampler=balanced: an epoch's order that draws every class equally often, from (seed, epoch) alone.

The epoch keeps the split's length n. Its positions are dealt to the K classes present in the training split
evenly (n // K each, n % K of them chosen at random one more) and shuffled; a class's positions are
filled from random permutations of its samples, one after another: a rare class repeats its samples (each
k or k + 1 times), a common one uses a different random subset each epoch. The same generator state gives the
same order, so a resumed run draws the same batches, and every rank of a run on several processes computes the
same order and takes its shard of it (core/batches.py)."""

from __future__ import annotations

from collections.abc import Iterator

import torch
from torch.utils.data import Sampler


def balanced_order(labels: torch.Tensor, gen: torch.Generator) -> torch.Tensor:
    """n indices into `labels` (int64, on the CPU) with every present class drawn n // K or n // K + 1 times."""
    labels = labels.cpu()
    n = len(labels)
    classes = torch.unique(labels)
    k = len(classes)
    if n == 0:
        return torch.zeros(0, dtype=torch.int64)
    extra = classes[torch.randperm(k, generator=gen)][: n % k]  # the classes drawn once more this epoch
    wanted = torch.full((k,), n // k, dtype=torch.int64)
    wanted[torch.searchsorted(classes, extra)] += 1
    slots = torch.repeat_interleave(classes, wanted)[torch.randperm(n, generator=gen)]  # each position's class
    # grouped by class once (sorting, not a mask per class: thousands of classes stay cheap)
    members_by_class = torch.argsort(labels, stable=True).split(torch.unique(labels, return_counts=True)[1].tolist())
    positions_by_class = torch.argsort(slots, stable=True).split(wanted.tolist())
    out = torch.empty(n, dtype=torch.int64)
    for members, positions in zip(members_by_class, positions_by_class, strict=True):
        rounds = -(-len(positions) // len(members))
        pool = torch.cat([members[torch.randperm(len(members), generator=gen)] for _ in range(rounds)])
        out[positions] = pool[: len(positions)]
    return out


class BalancedSampler(Sampler[int]):
    """A DataLoader's sampler of rank `rank`'s positions (rank, rank + world, …) of balanced_order, drawn from
    `gen` when iterated (after the loader's base seed, as core/shards.py's ShardSampler)."""

    def __init__(self, labels: torch.Tensor, rank: int, world: int, gen: torch.Generator) -> None:
        self.labels, self.rank, self.world, self.gen = labels, rank, world, gen

    def __len__(self) -> int:
        return len(range(self.rank, len(self.labels), self.world))

    def __iter__(self) -> Iterator[int]:
        yield from balanced_order(self.labels, self.gen)[self.rank :: self.world].tolist()
