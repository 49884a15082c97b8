"""Compare grouped: the runs of one seed group (runs that differ only by seed), of one sweep or with one tag
drawn as one mean curve with a ± std band, and summarised as one row per group, its figures as mean ± std (n)."""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np
import pandas as pd
import plotly.graph_objects as go

from app.present import figures, test_scores
from app.present import text as f
from app.present.seed_groups import add_band, band, mean_std, mean_std_text
from app.ui.compare_view import best_value, objective, stored, whole_x, x_mapper, x_title, x_values
from app.ui.run_charts import per_epoch
from app.ui.run_units import statuses_text
from db.types import RunRecord

GROUP_BY = ("none", "seed group", "sweep", "tag")
URL_VALUES = {"seed group": "seed", "sweep": "sweep", "tag": "tag"}  # `?group=` of the Compare page's URL
# A band of runs whose points lie at different x (downsampled per-step series) is drawn on at most this many
# common x, each run interpolated within its own range.
BAND_POINTS = 400


@dataclass(frozen=True)
class Group:
    label: str
    runs: tuple[RunRecord, ...]

    @property
    def legend(self) -> str:
        return f"{self.label} ×{len(self.runs)}" if len(self.runs) > 1 else self.label


def _keys(r: RunRecord, by: str, sweep_names: Mapping[str, str]) -> list[tuple[str, str]]:
    """(group key, label) of each group the run belongs to; a run outside any is a group of its own."""
    if by == "seed group" and r.group_id:
        return [(f"g:{r.group_id}", r.name)]
    if by == "sweep" and r.sweep_id:
        return [(f"s:{r.sweep_id}", f"sweep {sweep_names.get(r.sweep_id, r.sweep_id)}")]
    if by == "tag":
        return [(f"t:{t}", f"tag {t}") for t in r.tags] or [("t:", "no tag")]
    return [(f"r:{r.id}", r.name)]


def groups_of(runs: Sequence[RunRecord], by: str, sweep_names: Mapping[str, str] | None = None) -> list[Group]:
    """The runs' groups in the order they first appear (a run with two tags is in both tags' groups)."""
    found: dict[str, tuple[str, list[RunRecord]]] = {}
    for r in runs:
        for key, label in _keys(r, by, sweep_names or {}):
            found.setdefault(key, (label, []))[1].append(r)
    labels = Counter(label for label, _ in found.values())
    return [
        Group(f"{label} ({members[0].id[:6]})" if labels[label] > 1 else label, tuple(members))
        for label, members in found.values()
    ]


def labels_by_run(groups: Sequence[Group]) -> dict[str, str]:
    """Run id -> its group's label (`tag a; tag b` for a run in two tags' groups)."""
    out: dict[str, list[str]] = {}
    for g in groups:
        for r in g.runs:
            out.setdefault(r.id, []).append(g.label)
    return {run_id: "; ".join(labels) for run_id, labels in out.items()}


def aligned(
    curves: Mapping[str, tuple[Sequence[float], Sequence[float]]], points: int = BAND_POINTS
) -> dict[str, tuple[list[float], list[float]]]:
    """The curves unchanged when they share their x (per-epoch metrics of runs of one spec); else each
    interpolated onto common x within its own range (finite points only), so that the band is a mean of runs."""
    grids = {tuple(float(x) for x in xs) for xs, _ in curves.values()}
    if len(grids) <= 1:
        return {k: (list(xs), list(ys)) for k, (xs, ys) in curves.items()}
    common = sorted({x for grid in grids for x in grid})
    if len(common) > points:
        common = np.linspace(common[0], common[-1], points).tolist()
    out = {}
    for k, (xs, ys) in curves.items():
        x, y = np.asarray(xs, dtype=float), np.asarray(ys, dtype=float)
        keep = np.isfinite(x) & np.isfinite(y)
        x, y = x[keep], y[keep]
        if len(x):
            grid = [g for g in common if x[0] <= g <= x[-1]]
            out[k] = (grid, np.interp(grid, x, y).tolist())
    return out


def refreshed(groups: Sequence[Group], runs: Sequence[RunRecord]) -> list[Group]:
    """The same groups with their runs as they are now (a live view); runs deleted meanwhile left out."""
    now = {r.id: r for r in runs}
    out = [Group(g.label, tuple(now[r.id] for r in g.runs if r.id in now)) for g in groups]
    return [g for g in out if g.runs]


def band_figures(
    groups: Sequence[Group], series: dict, keys: Sequence[str], xmode: str, smoothing: float, log_y: bool = False
) -> list[tuple[str, go.Figure]]:
    """Per metric, one mean line with a ± std band per group (smoothing applies to each run before the mean)."""
    mappers = {r.id: x_mapper(r, xmode) for g in groups for r in g.runs}
    out = []
    for key in keys:
        fig, drawn = None, []
        for i, g in enumerate(groups):
            curves = {}
            for r in g.runs:
                s = series.get(r.id, {}).get(key)
                if s is None or not s.steps:
                    continue
                ys = figures.smooth(list(s.values), smoothing) if smoothing > 0 and not per_epoch(key) else s.values
                curves[r.id] = (x_values(r, s, key, mappers[r.id], xmode), ys)
            xs, means, stds, _ = band(aligned(curves))
            if not xs:
                continue
            drawn += xs
            fig = fig or figures.line_figure(
                key,
                [],
                x_title=x_title(key, xmode),
                height=340,
                log_y=log_y,
                uirevision=f"compare:{key}:{xmode}:{log_y}:grouped",
                x_dates=xmode == "wall",
            )
            if xmode == "wall":
                xs = list(figures.as_dates(xs))
            add_band(fig, xs, means, stds, name=f.plot_text(g.legend), color=figures.PALETTE[i % len(figures.PALETTE)])
        if fig is not None:
            if whole_x(key, xmode):
                fig.update_xaxes(figures.whole_ticks(drawn))
            out.append((key, fig))
    return out


def group_summary(groups: Sequence[Group]) -> pd.DataFrame:
    """One row per group: the best and last objective, best val/acc, lowest val/loss, epochs and time as
    `mean ± std (n)` text, and the objective's mean, std and n as numbers (for the CSV)."""
    rows = []
    for g in groups:
        metric = objective(g.runs)
        best = [v for m, v in map(f.best, g.runs) if m == metric]
        last = [s.last_value for r in g.runs if (s := stored(r, metric)) is not None]
        (best_mean, best_std, n), (last_mean, last_std, _) = mean_std(best), mean_std(last)
        summaries = [r.summary or {} for r in g.runs]
        rows.append(
            {
                "group": g.label,
                "runs": len(g.runs),
                "status": statuses_text(g.runs),
                "objective": metric or "",
                "best": mean_std_text(best),
                "last": mean_std_text(last),
                "best val/acc": mean_std_text([best_value(r, "val/acc") for r in g.runs]),
                "lowest val/loss": mean_std_text([best_value(r, "val/loss") for r in g.runs]),
                "test/acc": mean_std_text(test_scores.mean_of(g.runs)),
                "epochs run": mean_std_text([s.get("epochs_run") for s in summaries], digits=1),
                "time (s)": mean_std_text(
                    [s.get("wall_time_s") or f.duration_s(r) for s, r in zip(summaries, g.runs, strict=True)], digits=1
                ),
                "best mean": best_mean,
                "best std": best_std,
                "n": n,
                "last mean": last_mean,
                "last std": last_std,
                "ids": " ".join(r.id for r in g.runs),
            }
        )
    return pd.DataFrame(rows, columns=SUMMARY_COLUMNS + NUMBER_COLUMNS)


SUMMARY_COLUMNS = [
    "group",
    "runs",
    "status",
    "objective",
    "best",
    "last",
    "best val/acc",
    "lowest val/loss",
    "test/acc",
    "epochs run",
    "time (s)",
]
NUMBER_COLUMNS = ["best mean", "best std", "n", "last mean", "last std", "ids"]  # in the CSV, not on screen
