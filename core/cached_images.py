"""Images served from an entry of the on-disk image cache (core/image_cache.py): a memory-mapped uint8 array."""

from __future__ import annotations

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


class CachedImages:
    """Images served from a memory-mapped array (an entry of the cache): indexable like a uint8 (N, C, H, W) tensor
    through `rows` (the readable files, then any subset); `take` gathers a batch in one copy."""

    def __init__(self, path: Path, shape: tuple[int, ...], rows: np.ndarray, mode: str):
        self.path, self.full_shape, self.rows, self.mode = Path(path), tuple(shape), rows.astype(np.int64), mode
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
        """The images at positions `idx` (a batch), in that order: read in file order, then put in place."""
        rows = self.rows[idx.cpu().numpy()]
        order = np.argsort(rows, kind="stable")
        out = np.empty((len(rows), *self.shape[1:]), dtype=np.uint8)
        out[order] = np.take(self._all().numpy(), rows[order], axis=0)
        return torch.from_numpy(out)

    def subset(self, idx: np.ndarray) -> CachedImages:
        return CachedImages(self.path, self.full_shape, self.rows[np.asarray(idx, dtype=np.int64)], self.mode)

    def sample_tensor(self, n: int, seed: int) -> torch.Tensor:
        idx = np.random.default_rng(seed).permutation(len(self))[:n]
        return self.take(torch.as_tensor(idx))

    def in_memory(self) -> torch.Tensor:
        """All of it as an ordinary tensor (a set that fits in memory: read once, sequentially)."""
        if len(self.rows) == self.full_shape[0] and (np.diff(self.rows) == 1).all():
            return self._all().clone()
        return self.take(torch.arange(len(self)))
