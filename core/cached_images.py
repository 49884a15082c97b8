"""Images served from an entry of the on-disk image cache (core/image_cache.py): a memory-mapped uint8 array."""

from __future__ import annotations

import math
import mmap
import os
import warnings
from pathlib import Path

import numpy as np
import torch


def take_rows(x: torch.Tensor, idx: torch.Tensor) -> torch.Tensor:
    """x[idx] along the first dimension. On the CPU by NumPy's take, one block copy per row: torch's own indexing of
    uint8 images copies value by value there, several times slower (an epoch of 224-px photos spent most of its time
    in it)."""
    if x.device.type != "cpu" or not x.is_contiguous():
        return x[idx.to(x.device)]
    return torch.from_numpy(np.take(x.numpy(), idx.cpu().numpy(), axis=0))


def _allocate(shape: tuple[int, ...]) -> np.ndarray:
    """An uninitialised uint8 array; a large one in transparent huge pages where the kernel offers them (a fault per
    2 MB rather than per 4 KB as it is first written: filling 1 GB took 1.2 s rather than 1.7 s here)."""
    nbytes = math.prod(shape)
    if nbytes < 64 * 2**20 or not hasattr(mmap, "MADV_HUGEPAGE"):
        return np.empty(shape, dtype=np.uint8)
    block = mmap.mmap(-1, nbytes)
    try:
        block.madvise(mmap.MADV_HUGEPAGE)
    except OSError:  # not offered here: ordinary pages
        pass
    return np.frombuffer(block, dtype=np.uint8).reshape(shape)  # the array keeps the mapping alive


class CachedImages:
    """Images served from a memory-mapped array (an entry of the cache): indexable like a uint8 (N, C, H, W) tensor
    through `rows` (the readable files, then any subset); `take` gathers a batch in one copy. `held`: the set fits
    data.cache_mb, so its pages stay in memory (the kernel's page cache, shared by every run and process reading the
    entry: no private copy to make at start-up, none to hold twice); `in_memory` copies it out for a device that
    holds it whole."""

    def __init__(self, path: Path, shape: tuple[int, ...], rows: np.ndarray, mode: str, *, held: bool = False):
        self.path, self.full_shape, self.rows, self.mode = Path(path), tuple(shape), rows.astype(np.int64), mode
        self.held = held  # small enough to be held in memory (data.cache_mb): its pages stay in the page cache
        self.shape = (len(self.rows), *self.full_shape[1:])
        self._array: torch.Tensor | None = None

    def __getstate__(self) -> dict:
        return {**self.__dict__, "_array": None}

    def _all(self) -> torch.Tensor:
        if self._array is None:
            mm = np.memmap(self.path, dtype=np.uint8, mode="r", shape=self.full_shape)
            with warnings.catch_warnings():  # a read-only mapping: nothing writes through it (torch warns, once)
                warnings.simplefilter("ignore", UserWarning)
                self._array = torch.from_numpy(mm)
        return self._array

    def __len__(self) -> int:
        return len(self.rows)

    def __getitem__(self, i: int) -> torch.Tensor:
        return self._all()[int(self.rows[int(i)])].clone()

    def take(self, idx: torch.Tensor) -> torch.Tensor:
        """The images at positions `idx` (a batch), in that order: a held set's gathered straight from its pages;
        a larger one's read in file order (the disk's), then put in place."""
        rows = self.rows[idx.cpu().numpy()]
        if self.held:
            return torch.from_numpy(np.take(self._all().numpy(), rows, axis=0))
        order = np.argsort(rows, kind="stable")
        out = np.empty((len(rows), *self.shape[1:]), dtype=np.uint8)
        out[order] = np.take(self._all().numpy(), rows[order], axis=0)
        return torch.from_numpy(out)

    def subset(self, idx: np.ndarray) -> CachedImages:
        rows = self.rows[np.asarray(idx, dtype=np.int64)]
        return CachedImages(self.path, self.full_shape, rows, self.mode, held=self.held)

    def sample_tensor(self, n: int, seed: int) -> torch.Tensor:
        idx = np.random.default_rng(seed).permutation(len(self))[:n]
        return self.take(torch.as_tensor(idx))

    def in_memory(self) -> torch.Tensor:
        """All of it as an ordinary tensor (a set that fits in memory): each image read from the file in file order
        straight into its place, by the file's reads rather than through the mapping (whose pages would each fault
        in: twice the time here)."""
        out = _allocate(self.shape)
        per = math.prod(self.full_shape[1:])
        fd = os.open(self.path, os.O_RDONLY)
        try:
            for pos in np.argsort(self.rows, kind="stable").tolist():
                view, offset = memoryview(out[pos]).cast("B"), int(self.rows[pos]) * per
                while view.nbytes:  # a read may return less than asked
                    got = os.preadv(fd, [view], offset)
                    if got == 0:
                        raise OSError(f"{self.path} ends before image row {self.rows[pos]}")
                    view, offset = view[got:], offset + got
        finally:
            os.close(fd)
        return torch.from_numpy(out)
