"""Seed groups on screen: runs that differ only by seed shown as one line with a band (mean ± std) on the
charts, and as `mean ± std (n)` in tables. Plain functions over numbers, and one Plotly helper."""

from __future__ import annotations

import math
import statistics
from collections.abc import Mapping, Sequence

import plotly.graph_objects as go


def mean_std(values: Sequence[float | None]) -> tuple[float | None, float | None, int]:
    """Mean and sample std of the finite values, and how many there were (std None below two)."""
    finite = [float(v) for v in values if v is not None and math.isfinite(v)]
    if not finite:
        return None, None, 0
    return statistics.fmean(finite), (statistics.stdev(finite) if len(finite) > 1 else None), len(finite)


def mean_std_text(values: Sequence[float | None], digits: int = 4) -> str:
    """`0.9712 ± 0.0031 (n=3)`; a single value alone; `–` for none."""
    mean, std, n = mean_std(values)
    if mean is None:
        return "–"
    if std is None:
        return f"{mean:.{digits}f}" + (" (n=1)" if len(values) > 1 else "")
    return f"{mean:.{digits}f} ± {std:.{digits}f} (n={n})"


def band(
    curves: Mapping[str, tuple[Sequence[float], Sequence[float]]],
) -> tuple[list[float], list[float], list[float], list[int]]:
    """Per x present in any run's curve (x, y pairs, e.g. epochs): the mean, the std (0 with one value) and n."""
    by_x: dict[float, list[float]] = {}
    for xs, ys in curves.values():
        for x, y in zip(xs, ys, strict=False):
            if y is not None and math.isfinite(y):
                by_x.setdefault(float(x), []).append(float(y))
    xs = sorted(by_x)
    means = [statistics.fmean(by_x[x]) for x in xs]
    stds = [statistics.stdev(by_x[x]) if len(by_x[x]) > 1 else 0.0 for x in xs]
    return xs, means, stds, [len(by_x[x]) for x in xs]


def add_band(
    fig: go.Figure,
    xs: Sequence[float],
    means: Sequence[float],
    stds: Sequence[float],
    *,
    name: str,
    color: str,
    legendgroup: str | None = None,
) -> None:
    """A mean line with a shaded ± std band, one legend entry for both."""
    group = legendgroup or name
    rgba = _rgba(color, 0.2)
    upper = [m + s for m, s in zip(means, stds, strict=True)]
    lower = [m - s for m, s in zip(means, stds, strict=True)]
    fig.add_trace(
        go.Scatter(
            x=list(xs) + list(xs)[::-1],
            y=upper + lower[::-1],
            mode="lines",
            fill="toself",
            fillcolor=rgba,
            line={"width": 0},
            hoverinfo="skip",
            showlegend=False,
            legendgroup=group,
            name=f"{name} ± std",
        )
    )
    fig.add_trace(
        go.Scatter(x=list(xs), y=list(means), mode="lines", name=name, legendgroup=group, line={"color": color})
    )


def _rgba(color: str, alpha: float) -> str:
    if color.startswith("#") and len(color) == 7:
        r, g, b = (int(color[i : i + 2], 16) for i in (1, 3, 5))
        return f"rgba({r},{g},{b},{alpha})"
    return color
