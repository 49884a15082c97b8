"""Batches of a split for the training loop: a split held on the device and sliced there, or a DataLoader over host
memory or lazily decoded files. Each epoch's order comes from (seed, epoch) alone; on several ranks each yields
its shard of every global batch (core/shards.py)."""

from __future__ import annotations

import math
import queue
import random
import threading
from collections.abc import Iterator
from dataclasses import dataclass, replace

import numpy as np
import torch
from torch.utils.data import DataLoader, Dataset

from core.balanced import BalancedSampler, balanced_order
from core.cached_images import CachedImages, take_rows
from core.data import Split
from core.decode import processes
from core.shards import ShardSampler, shard_scale
from core.spec_sections import LoaderSpec


def epoch_generator(seed: int, epoch: int, device: torch.device) -> torch.Generator:
    """A generator derived from (seed, epoch): the order and augmentation of epoch k do not
    depend on what ran before, so a resumed run sees exactly the same batches."""
    return torch.Generator(device=device).manual_seed(seed * 100_003 + epoch)


@dataclass(frozen=True)
class Order:
    """How a split is cut into batches (make_batches's arguments but the split and the loader): batches of
    `batch_size` in the order (seed, epoch) gives, shuffled or not, on `device`; with `world` > 1, rank `rank`'s
    shard of every global batch; `balanced` (with `shuffle`): train.sampler=balanced's order (core/balanced.py)."""

    batch_size: int
    shuffle: bool
    device: torch.device
    seed: int
    rank: int = 0
    world: int = 1
    balanced: bool = False


class _Batches:
    """What both kinds share: the epoch that seeds the order, and, as one rank's shard of `samples` in global
    batches of batch_size · world, how many batches every rank yields and each micro-batch's share of the loss."""

    def __init__(self, labels: torch.Tensor, order: Order) -> None:
        self.samples, self.epoch, self.labels = len(labels), 0, labels
        self.batch_size, self.shuffle, self.device = order.batch_size, order.shuffle, order.device
        self.seed, self.rank, self.world = order.seed, order.rank, order.world
        self.balanced = order.balanced and order.shuffle

    def permutation(self, gen: torch.Generator) -> torch.Tensor:
        """The epoch's order of the whole split (on the CPU): a shuffle, or the balanced sampler's draw."""
        return balanced_order(self.labels, gen) if self.balanced else torch.randperm(self.samples, generator=gen)

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def __len__(self) -> int:
        step = self.batch_size * self.world
        return (self.samples + step - 1) // step

    def loss_scale(self, i: int, local_n: int) -> float:
        return shard_scale(self.samples, self.batch_size, self.world, i, local_n)


class DeviceBatches(_Batches):
    """A whole split held on the device: batches are index slices, no copies per step.

    With `world` > 1 this is rank `rank`'s shard: positions rank, rank + world, … of the order a single
    process would use, cut into batches of `batch_size` (the per-rank batch). Batch k of every rank then
    holds exactly the samples of global batch k of a single process with batch batch_size · world, and
    every rank yields the same number of batches (an empty one when a last partial batch has fewer
    samples than there are ranks), so the ranks' collectives stay paired."""

    def __init__(self, split: Split, order: Order):
        assert isinstance(split.images, torch.Tensor)
        super().__init__(split.labels, order)
        self.x = split.images.to(order.device)
        self.y = split.labels.to(order.device)

    def __iter__(self) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        n = len(self.y)
        if self.world > 1:
            order = (
                self.permutation(epoch_generator(self.seed, self.epoch, torch.device("cpu")))
                if self.shuffle
                else torch.arange(n)
            )
            mine = order[self.rank :: self.world].to(self.device)
            for k in range(len(self)):
                idx = mine[k * self.batch_size : (k + 1) * self.batch_size]
                yield take_rows(self.x, idx), self.y[idx]
        elif self.shuffle:  # only the training split is shuffled
            order = self.permutation(epoch_generator(self.seed, self.epoch, torch.device("cpu"))).to(self.device)
            for i in range(0, n, self.batch_size):
                idx = order[i : i + self.batch_size]
                yield take_rows(self.x, idx), self.y[idx]
        else:
            for i in range(0, n, self.batch_size):
                yield self.x[i : i + self.batch_size], self.y[i : i + self.batch_size]


class GatherBatches(_Batches):
    """A split held as uint8 on the host (in memory, or memory-mapped from the on-disk image cache) that the device
    does not hold: each batch gathered by index in one copy, by a thread that keeps a few batches ready (pinned
    for a non-blocking copy to CUDA); no per-image Python. Batches are those DeviceBatches would yield."""

    AHEAD = 3

    def __init__(self, split: Split, order: Order, loader: LoaderSpec):
        super().__init__(split.labels, order)
        self.images = split.images
        self.pin = loader.pin_memory if loader.pin_memory is not None else order.device.type == "cuda"

    def _indices(self) -> Iterator[torch.Tensor]:
        n, b = self.samples, self.batch_size
        gen = epoch_generator(self.seed, self.epoch, torch.device("cpu"))
        order = self.permutation(gen) if self.shuffle else torch.arange(n)
        if self.world > 1:
            mine = order[self.rank :: self.world]
            for k in range(len(self)):
                yield mine[k * b : (k + 1) * b]
        else:
            for i in range(0, n, b):
                yield order[i : i + b]

    def _take(self, idx: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        x = self.images.take(idx) if isinstance(self.images, CachedImages) else take_rows(self.images, idx)
        y = self.labels[idx]
        return (x.pin_memory(), y.pin_memory()) if self.pin else (x, y)

    def _fill(self, ready: queue.Queue, stop: threading.Event) -> None:
        def put(item) -> bool:
            while not stop.is_set():
                try:
                    ready.put(item, timeout=0.1)
                    return True
                except queue.Full:
                    continue
            return False

        try:
            for idx in self._indices():
                if not put(self._take(idx)):
                    return
            put(None)
        except BaseException as e:  # noqa: BLE001 - raised again in the training loop's thread
            put(e)

    def __iter__(self) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        ready: queue.Queue = queue.Queue(maxsize=self.AHEAD)
        stop = threading.Event()
        filler = threading.Thread(target=self._fill, args=(ready, stop), daemon=True, name="gather-batches")
        filler.start()
        try:
            while (item := ready.get()) is not None:
                if isinstance(item, BaseException):
                    raise item
                x, y = item
                yield x.to(self.device, non_blocking=self.pin), y.to(self.device, non_blocking=self.pin)
        finally:
            stop.set()
            filler.join()


class _SplitDataset(Dataset):
    def __init__(self, split: Split):
        self.split = split

    def __len__(self) -> int:
        return len(self.split)

    def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        return self.split.images[i], self.split.labels[i]


def _seed_worker(worker_id: int) -> None:
    # every loader worker gets its own seed, derived from the loader's generator.
    s = torch.initial_seed() % 2**32
    np.random.seed(s)
    random.seed(s)


class HostBatches(_Batches):
    """A DataLoader over host memory or lazily decoded files; batches moved per step. With `world` > 1,
    rank `rank`'s shard of every global batch, as DeviceBatches describes."""

    def __init__(self, split: Split, order: Order, loader: LoaderSpec):
        super().__init__(split.labels, order)
        self.num_workers = default_num_workers(loader, split)
        self.pin = loader.pin_memory if loader.pin_memory is not None else order.device.type == "cuda"
        self.dataset = _SplitDataset(split)

    def __iter__(self) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        gen = epoch_generator(self.seed, self.epoch, torch.device("cpu"))
        shard = ShardSampler(len(self.dataset), self.rank, self.world, self.shuffle, gen) if self.world > 1 else None
        if self.balanced:
            shard = BalancedSampler(self.labels, self.rank, self.world, gen)
        dl = DataLoader(
            self.dataset,
            batch_size=self.batch_size,
            shuffle=self.shuffle and shard is None,
            sampler=shard,
            num_workers=self.num_workers,
            pin_memory=self.pin,
            worker_init_fn=_seed_worker,
            generator=gen,
            multiprocessing_context="spawn" if self.num_workers > 0 else None,
            persistent_workers=False,
        )
        done, x, y = 0, None, None
        for x, y in dl:
            done += 1
            yield x.to(self.device, non_blocking=self.pin), y.to(self.device, non_blocking=self.pin)
        for _ in range(done, len(self) if x is not None else 0):  # a rank's empty share of the last batch
            yield x[:0].to(self.device), y[:0].to(self.device)


def default_num_workers(loader: LoaderSpec, split: Split) -> int:
    """Loader processes of images decoded per batch: loader.num_workers, else one per core (at most 16)."""
    return processes(loader.num_workers)


def make_batches(
    split: Split,
    batch_size: int,
    shuffle: bool,
    device: torch.device,
    seed: int,
    loader: LoaderSpec,
    rank: int = 0,
    world: int = 1,
    balanced: bool = False,
):
    """Batches of `batch_size` (per rank: rank `rank`'s shard of every global batch when `world` > 1); `balanced`
    (a shuffled split only): every class drawn equally often (train.sampler=balanced, core/balanced.py). A split in
    memory that the device can hold (on the CPU: always) is sliced there; one held on the host for a GPU, or in
    the on-disk image cache, is gathered a batch at a time (decoded images need no loader processes); files
    decoded per batch go through a DataLoader of loader.num_workers processes."""
    images = split.images
    order = Order(batch_size, shuffle, device, seed, rank, world, balanced)
    # device_cache_mb is documented "as float32": 4 bytes per value, though the split is held as uint8.
    fits = math.prod(images.shape) * 4 <= loader.device_cache_mb * 2**20
    if isinstance(images, CachedImages) and images.held and fits and device.type != "cpu":
        split = replace(split, images=images.in_memory())  # copied to the device whole: batches sliced there
        images = split.images
    if isinstance(images, torch.Tensor):
        # on the CPU the split is where the model is already (device_cache_mb=0 still gathers per batch).
        fits = fits or (device.type == "cpu" and loader.device_cache_mb)
        return DeviceBatches(split, order) if fits else GatherBatches(split, order, loader)
    if isinstance(images, CachedImages):  # on the CPU, a held set is gathered from its pages (no copy of it)
        return GatherBatches(split, order, loader)
    return HostBatches(split, order, loader)
