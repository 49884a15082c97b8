"""The multi-resolution rollup of metric series, computed at append time, before
the write transaction (numpy for the finest level, Python for the coarser ones).

Level `L` groups steps into buckets of `2**L` steps (`bucket = step >> L`).
Levels FINEST_LEVEL..COARSEST_LEVEL are kept, one level per power of two, so
that for any series some level has between half and all of the buckets a chart
asks for. Each new batch of points is aggregated once at the finest level and
each coarser level is merged from the one below, so the work is about 1.1
passes over the batch, not one pass per level. The rows are merged into
the stored ones by one upsert statement per few hundred rows (db.metrics).

Series of up to db.series.RAW_DOWNSAMPLE_LIMIT points are downsampled from the
raw points instead, which is why no finer level is kept: finer levels would
cost nearly as many writes as the points themselves.
"""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Iterable
from itertools import repeat
from math import isfinite
from operator import rshift
from typing import Any

import numpy as np

FINEST_LEVEL = 4
# 2**24 steps per bucket x ~1,000 buckets covers runs of 16 billion steps.
COARSEST_LEVEL = 24
LEVELS = tuple(range(FINEST_LEVEL, COARSEST_LEVEL + 1))
# One row per series: `step >> 63` is 0 for every non-negative 64-bit step.
WHOLE_SERIES_LEVEL = 63
MAX_STEP = 2**63 - 1

# An aggregate is a list, mutated in place while merging (cheaper than objects):
B, COUNT, NONFINITE, MIN_S, MIN_V, MAX_S, MAX_V, FIRST_S, FIRST_V, LAST_S, LAST_V = range(11)
ROW_COLUMNS = (
    "run_id",
    "level",
    "key",
    "bucket",
    "count",
    "nonfinite",
    "min_step",
    "min_value",
    "max_step",
    "max_value",
    "first_step",
    "first_value",
    "last_step",
    "last_value",
)


def bucket_points(steps: list[int], values: list[float], level: int) -> list[list[Any]]:
    """Aggregate one series' new points (`steps` sorted and unique) into buckets at `level`.

    Vectorised with numpy: this runs on every appended point, and with 16
    steps to a bucket at the finest level, min/max/index over Python slices
    bucket by bucket cost more than writing the points to SQLite.
    """
    if not isfinite(sum(values)) and not all(map(isfinite, values)):
        return _bucket_points_with_nonfinite(steps, values, level)
    n = len(steps)
    v = np.array(values, dtype=np.float64)
    starts = _bucket_starts(steps, level)
    lasts = np.append(starts[1:], n) - 1
    lows = np.minimum.reduceat(v, starts)
    highs = np.maximum.reduceat(v, starts)
    counts = lasts - starts + 1
    # Ties: the earliest point holding a bucket's extreme wins, as with list.index.
    low_at = _first_true(v == np.repeat(lows, counts), starts)
    high_at = _first_true(v == np.repeat(highs, counts), starts)
    at = steps.__getitem__  # steps stay Python ints: they may not fit numpy's int64 arithmetic
    first_steps = list(map(at, starts.tolist()))
    last_steps = list(map(at, lasts.tolist()))
    return list(
        map(
            list,
            zip(
                map(rshift, first_steps, repeat(level)),
                counts.tolist(),
                repeat(0),
                map(at, low_at.tolist()),
                lows.tolist(),
                map(at, high_at.tolist()),
                highs.tolist(),
                first_steps,
                v[starts].tolist(),
                last_steps,
                v[lasts].tolist(),
            ),
        )
    )


def _bucket_starts(steps: list[int], level: int) -> np.ndarray:
    """The index of each bucket's first point in `steps` (sorted, unique)."""
    n, width = len(steps), 1 << level
    if steps[-1] - steps[0] == n - 1:  # consecutive steps, the usual case: no need to look
        first_full = -steps[0] % width
        return np.concatenate(([0], np.arange(first_full or width, n, width)))
    buckets = np.array(steps, dtype=np.uint64) >> np.uint64(level)
    return np.concatenate(([0], np.flatnonzero(buckets[1:] != buckets[:-1]) + 1))


def _first_true(mask: np.ndarray, starts: np.ndarray) -> np.ndarray:
    """For each bucket (starting at `starts`), the index of its first true in `mask`;
    every bucket has one."""
    hits = np.flatnonzero(mask)
    return hits[np.searchsorted(hits, starts)]


def _bucket_points_with_nonfinite(steps: list[int], values: list[float], level: int) -> list[list[Any]]:
    out: list[list[Any]] = []
    n, i = len(steps), 0
    while i < n:
        bucket = steps[i] >> level
        j = bisect_left(steps, (bucket + 1) << level, i)
        chunk = values[i:j]
        agg = [bucket, j - i, 0, None, None, None, None, steps[i], _stored(chunk[0]), steps[j - 1], _stored(chunk[-1])]
        finite = [v for v in chunk if isfinite(v)]
        agg[NONFINITE] = len(chunk) - len(finite)
        if finite:
            low, high = min(finite), max(finite)
            agg[MIN_S], agg[MIN_V] = steps[i + chunk.index(low)], low
            agg[MAX_S], agg[MAX_V] = steps[i + chunk.index(high)], high
        out.append(agg)
        i = j
    return out


def _stored(value: float) -> float | None:
    """NaN is stored as NULL (SQLite cannot store NaN; Postgres then agrees)."""
    return None if value != value else value


def coarsen(aggs: list[list[Any]], shift: int) -> list[list[Any]]:
    """Merge bucket aggregates (in bucket order) into buckets `2**shift` times wider."""
    out: list[list[Any]] = []
    current = -1
    target: list[Any] = []
    for later in aggs:
        bucket = later[B] >> shift
        if bucket != current:
            current = bucket
            target = later.copy()
            target[B] = bucket
            out.append(target)
            continue
        # Fold `later` (whose steps all come after `target`'s) into `target`;
        # inlined, as this runs for every bucket of every level.
        target[COUNT] += later[COUNT]
        target[NONFINITE] += later[NONFINITE]
        low, high = later[MIN_V], later[MAX_V]
        if low is not None and (target[MIN_V] is None or low < target[MIN_V]):
            target[MIN_S], target[MIN_V] = later[MIN_S], low
        if high is not None and (target[MAX_V] is None or high > target[MAX_V]):
            target[MAX_S], target[MAX_V] = later[MAX_S], high
        target[LAST_S], target[LAST_V] = later[LAST_S], later[LAST_V]
    return out


def rollup_rows(series: Iterable[tuple[str, list[int], list[float]]]) -> list[tuple[Any, ...]]:
    """Rollup rows, in ROW_COLUMNS order less the run id, for new points; an
    upsert merges them into stored rows.

    `series` yields (key, steps sorted and unique, values). Rows come out
    ordered by (key, level, bucket) so concurrent writers lock rows in the same order.
    """
    rows: list[tuple[Any, ...]] = []
    for key, steps, values in sorted(series, key=lambda item: item[0]):
        if not steps:
            continue
        aggs = bucket_points(steps, values, FINEST_LEVEL)
        for level in LEVELS:
            if level > FINEST_LEVEL:
                aggs = coarsen(aggs, 1)
            rows += [(level, key, *agg) for agg in aggs]
        whole = coarsen(aggs, WHOLE_SERIES_LEVEL - COARSEST_LEVEL)
        rows += [(WHOLE_SERIES_LEVEL, key, *agg) for agg in whole]
    return rows
