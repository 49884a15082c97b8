"""A batch of metric points on its way to the store: one run's points validated column by column, and the
rows planned for those not stored yet. Its own module because both sides use it: db.metrics plans a batch,
db.bulk writes its rows, and neither needs to import the other for the type.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from itertools import compress
from math import isfinite
from typing import Any


@dataclass
class Columns:
    """One key's points, validated, column by column: steps sorted and unique,
    the other fields in step order. NaN stays NaN here (NULL once stored)."""

    key: str
    steps: list[int]
    values: list[float]
    epochs: list[int | None]
    walls: list[float]
    finite: bool  # every value is finite: the common case, written the fast way

    def __len__(self) -> int:
        return len(self.steps)

    def select(self, keep: Sequence[bool]) -> Columns:
        """The points where `keep` is true."""
        values = list(compress(self.values, keep))
        return Columns(
            self.key,
            list(compress(self.steps, keep)),
            values,
            list(compress(self.epochs, keep)),
            list(compress(self.walls, keep)),
            self.finite or all(map(isfinite, values)),
        )


@dataclass
class Batch:
    """Validated points of one run, and the rows to write for those not stored yet."""

    run_id: str
    series: list[Columns]
    new: list[Columns] = field(default_factory=list)
    rollups: list[tuple[Any, ...]] = field(default_factory=list)  # ROW_COLUMNS but run_id
    # The stored steps `new` leaves out: a batch retried after a rollback is planned again.
    planned_without: dict[str, set[int]] = field(default_factory=dict)
