"""What the training loop counts between host syncs (the logging window and the epoch).

On several ranks each rank counts its own shard; the figures that are logged are sums over all
ranks (core.distributed), so the curve rank 0 records is the one a single process would record.
"""

from __future__ import annotations

import time

import torch

from core.distributed import SOLO, Ranks
from core.names import DATA_WAIT, DATA_WAIT_EPOCH, THROUGHPUT, TRAIN_ACC, TRAIN_EPOCH_LOSS, TRAIN_LOSS


class Tally:
    """What an epoch and the current logging window have accumulated, kept on the device: reading it back
    (`.item()`) is a host sync, done only at log steps and at the end of the epoch.

    `share` (see `add`) is the micro-batch loss this rank contributes to the global batch's mean, scaled
    so that the sum over ranks is `world` × that mean; for a single process it is the loss itself."""

    def __init__(self, device: torch.device, ranks: Ranks = SOLO) -> None:
        self.ranks = ranks
        self.loss, self.correct = torch.zeros((), device=device), torch.zeros((), device=device, dtype=torch.long)
        self.n, self.wait = 0, 0.0
        self.win_loss, self.win_batches, self.win_samples, self.win_wait = torch.zeros((), device=device), 0, 0, 0.0
        self.start = self.win_start = time.perf_counter()

    def add(
        self,
        loss: torch.Tensor,
        logits: torch.Tensor,
        y: torch.Tensor,
        waited: float,
        share: torch.Tensor | None = None,
    ) -> None:
        self.loss += loss.detach() * len(y)
        self.correct += (logits.detach().argmax(1) == y).sum()
        self.n += len(y)
        self.wait += waited
        self.win_loss += (loss if share is None else share).detach()
        self.win_batches += 1
        self.win_samples += len(y)
        self.win_wait += waited

    def window(self) -> dict[str, float]:
        """The logging window's figures, then a fresh window (every rank calls it at the same steps)."""
        now = time.perf_counter()
        span = max(now - self.win_start, 1e-9)
        win_loss, samples = self.ranks.sum_(self.win_loss, self.win_samples)
        if self.ranks.world > 1:
            win_loss = win_loss / self.ranks.world
        out = {
            TRAIN_LOSS: (win_loss / self.win_batches).item(),
            THROUGHPUT: samples / span,
            DATA_WAIT: self.win_wait / span,
        }
        self.win_loss.zero_()
        self.win_batches, self.win_samples, self.win_wait, self.win_start = 0, 0, 0.0, now
        return out

    def epoch(self) -> dict[str, float]:
        elapsed = max(time.perf_counter() - self.start, 1e-9)
        loss, correct, n = self.ranks.sum_(self.loss, self.correct, self.n)
        return {
            TRAIN_EPOCH_LOSS: (loss / max(n, 1)).item(),
            TRAIN_ACC: correct.item() / max(n, 1),
            DATA_WAIT_EPOCH: self.wait / elapsed,
        }
