"""The Compare page's tables and figures, as plain functions of RunRecords and Series."""

from __future__ import annotations

import csv
import io
import json
import math
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import pandas as pd
import plotly.graph_objects as go

from app.present import external, figures, test_scores
from app.present import text as f
from app.present.form_schema import flatten
from app.ui import queries, run_units
from app.ui.run_charts import per_epoch
from core import catalog
from core.names import SYSTEM_PREFIX
from db import repo
from db.types import MetricSummary, RunRecord, Series

# The parallel coordinates' default axes: the first varying hyperparameters (the user may choose others).
DEFAULT_AXES = 8


def stored(r: RunRecord, key: str | None) -> MetricSummary | None:
    """The run's summary of a metric's per-epoch values: under the catalog's stored key (train/loss →
    train/epoch_loss), never a per-step series logged under the same name."""
    return r.metrics.get(catalog.stored_key(key)) if key else None


def best_value(r: RunRecord, key: str) -> float | None:
    """Best so far of a metric: the lowest or the highest, as the catalog says (a loss: the lowest)."""
    s = stored(r, key)
    if s is None:
        return None
    return s.min_value if catalog.better(key) == "min" else s.max_value


def objective(runs: Sequence[RunRecord]) -> str | None:
    """The metric most of the runs monitor (their summary's best; val/acc for runs without one)."""
    metrics = Counter(m for m, v in map(f.best, runs) if v is not None)
    return metrics.most_common(1)[0][0] if metrics else None


def objective_stats(r: RunRecord, key: str | None) -> dict[str, float | None]:
    """best (min for a loss, max otherwise), min, max and last of one metric over all its stored points."""
    s = stored(r, key)
    if s is None:
        return dict.fromkeys(OBJECTIVE_COLUMNS)
    last = s.last_value if s.last_value is not None and math.isfinite(s.last_value) else None
    return {"best": best_value(r, key), "min": s.min_value, "max": s.max_value, "last": last}


OBJECTIVE_COLUMNS = ("best", "min", "max", "last")


def summary_table(runs: Sequence[RunRecord], metric: str | None = None) -> pd.DataFrame:
    """One row per run; `best`, `min`, `max` and `last` are of `metric` (the objective: by default the one
    most of the runs monitor)."""
    metric = metric or objective(runs)
    rows = []
    for r in runs:
        summary = r.summary or {}
        best = summary.get("best") or {}
        spec = r.spec
        rows.append(
            {
                "run": r.name,
                "id": r.id,
                "status": r.status,
                "objective": metric or "",
                **objective_stats(r, metric),
                "best val/acc": best_value(r, "val/acc"),
                "lowest val/loss": best_value(r, "val/loss"),
                "test/acc": test_scores.value(r, "test/acc"),  # held out: scored once at the end, never selected on
                "test/loss": test_scores.value(r, "test/loss"),
                "monitored": f"{best['metric']} {best['value']:.4f}" if best.get("value") is not None else "",
                "best epoch": best.get("epoch"),
                "epochs run": summary.get("epochs_run"),
                "time (s)": summary.get("wall_time_s") or f.duration_s(r),
                "parameters": summary.get("parameters"),
                "model": (spec.get("model") or {}).get("name"),
                "data": (spec.get("data") or {}).get("name"),
                "lr": script_lr(r) if r.external else (spec.get("optim") or {}).get("lr"),
            }
        )
    return pd.DataFrame(rows)


def _cell(v: Any) -> str:
    return json.dumps(v) if isinstance(v, (list, dict, tuple)) else str(v)


def run_fields(r: RunRecord) -> dict[str, Any]:
    """A run's fields by dotted name: a spec's (`optim.lr`), or what a script logged (`params.lr`, `tags.team`,
    `source.script`: app/present/external.py)."""
    return external.fields(r.spec) if r.external else flatten(dict(r.spec))


def _every_field(flat: Sequence[Mapping[str, Any]]) -> list[str]:
    """The fields of all the runs, in the order they first come (a spec's fields, then a script's params)."""
    return list(dict.fromkeys(k for x in flat for k in x))


def script_lr(r: RunRecord) -> float | None:
    """The learning rate a script logged as a param (`lr` or `learning_rate`), when it reads as a number."""
    params = external.params(r.spec)
    value = external.number(params.get("lr", params.get("learning_rate")))
    return float(value) if isinstance(value, (int, float)) else None


def spec_diff(runs: Sequence[RunRecord], differences_only: bool = True) -> pd.DataFrame:
    """One row per field (a spec's, a script's param or tag), one column per run; a field a run does not have is
    shown as a dash."""
    flat = [run_fields(r) for r in runs]
    labels = _labels(runs)
    rows = []
    for field in _every_field(flat):
        values = [_cell(x[field]) if field in x else f.EMPTY for x in flat]
        if differences_only and len(set(values)) <= 1:
            continue
        rows.append({"field": field, **dict(zip(labels, values, strict=True))})
    return pd.DataFrame(rows, columns=["field", *labels])


def _labels(runs: Sequence[RunRecord]) -> list[str]:
    names = [r.name for r in runs]
    return [f"{r.name} ({r.id[:6]})" if names.count(r.name) > 1 else r.name for r in runs]


def varying_hyperparameters(runs: Sequence[RunRecord], limit: int | None = DEFAULT_AXES) -> dict[str, list[Any]]:
    """Spec fields that differ between the runs (the lr when none do), for the parallel coordinates: the first
    `limit` of them (all with None)."""
    flat = [run_fields(r) for r in runs]
    out: dict[str, list[Any]] = {}
    for field in _every_field(flat):
        if field.startswith(("tags.", "source.")):  # a script's tags and source are no hyperparameters
            continue
        values = [external.number(x.get(field)) for x in flat]
        if field != "name" and len({_cell(v) for v in values}) > 1:
            out[field] = [v if isinstance(v, (int, float)) and not isinstance(v, bool) else _cell(v) for v in values]
    if not out and flat:
        out["optim.lr"] = [x.get("optim.lr") for x in flat]
    return dict(list(out.items())[:limit])


def parallel(runs: Sequence[RunRecord], metric: str, fields: Sequence[str] | None = None) -> go.Figure:
    """Hyperparameters against the best of `metric`: the chosen `fields` (in their order), else the first
    DEFAULT_AXES varying ones."""
    if fields is None:
        params = varying_hyperparameters(runs)
    else:
        every = varying_hyperparameters(runs, limit=None)
        params = {k: every[k] for k in fields if k in every}
    values = [best_value(r, metric) for r in runs]
    return figures.parallel_figure(params, f"best {metric}", [v if v is not None else float("nan") for v in values])


def fresh_runs(run_ids: Sequence[str]) -> list[RunRecord]:
    """The runs as they are now (live views: never cached); the ones deleted meanwhile left out."""
    found = run_units.load(queries.engine(), list(run_ids))
    return [found[i] for i in run_ids if i in found]


def load_series(runs: Sequence[RunRecord], keys: Sequence[str], max_points: int) -> dict[str, dict[str, Series]]:
    """Each run's series, downsampled to at most `max_points`: a finished run's from the cache (it never
    changes), a running run's read afresh."""
    engine = queries.engine()
    out: dict[str, dict[str, Series]] = {}
    for r in runs:
        if r.finished:
            out[r.id] = {k: queries.final_series(r, k, max_points) for k in keys}
        else:
            out[r.id] = {k: repo.series(engine, r.id, k, max_points=max_points) for k in keys}
    return out


LEGEND_RUNS = 20  # more runs than this on a chart: no legend, hover a line for its run


def curve_figures(
    runs: Sequence[RunRecord], series: dict, keys: Sequence[str], xmode: str, smoothing: float, log_y: bool = False
) -> list[tuple[str, go.Figure]]:
    labels = _labels(runs)
    mappers = {r.id: x_mapper(r, xmode) for r in runs}
    out = []
    for key in keys:
        traces = []
        for i, (r, label) in enumerate(zip(runs, labels, strict=True)):
            s: Series | None = series.get(r.id, {}).get(key)
            if s is None or not s.steps:
                continue
            traces.append(
                figures.Trace(
                    label,
                    x_values(r, s, key, mappers[r.id], xmode),
                    s.values,
                    markers=per_epoch(key),
                    color=figures.PALETTE[i % len(figures.PALETTE)],
                )
            )
        if traces:
            fig = figures.line_figure(
                key,
                traces,
                x_title=x_title(key, xmode),
                smoothing=smoothing,
                uirevision=f"compare:{key}:{xmode}:{log_y}",
                height=340,
                log_y=log_y,
                x_dates=xmode == "wall",
                whole_x=whole_x(key, xmode),
            )
            if len(traces) > LEGEND_RUNS:  # a legend of 100 names would bury the chart: hover names the run
                fig.update_layout(showlegend=False, hovermode="closest")
            out.append((key, fig))
    return out


def whole_x(key: str, xmode: str) -> bool:
    """Whether the x-axis counts whole numbers (steps, epochs), to be ticked on them only."""
    return xmode in figures.WHOLE_X_MODES and not key.startswith(SYSTEM_PREFIX)


def x_title(key: str, xmode: str) -> str:
    if xmode == "wall":
        return figures.X_TITLES["wall"]
    return figures.X_TITLES["time" if key.startswith(SYSTEM_PREFIX) else xmode]


def x_values(r: RunRecord, s: Series, key: str, mapper, xmode: str = "step") -> list[float]:
    """A series' x: its steps mapped to the x-axis mode; a system metric's (its step is Unix seconds), seconds
    since the run started, or the clock time itself on a wall-time axis."""
    if key.startswith(SYSTEM_PREFIX):
        if xmode == "wall":
            return [float(t) for t in s.steps]
        start = r.started_at.timestamp() if r.started_at else s.steps[0]
        return [t - start for t in s.steps]
    return mapper(s.steps)


def x_mapper(r: RunRecord, xmode: str):
    """steps → x: the step, epoch, seconds since the run started ("time") or Unix seconds ("wall")."""
    if xmode == "step":
        return list
    anchors = queries.epoch_anchors(r.id)
    from app.ui.run_charts import steps_per_epoch

    spe = steps_per_epoch(r, anchors[-1][0] if anchors else None)
    started = r.started_at.timestamp() if r.started_at else None
    if xmode != "wall":
        return figures.step_mapper(anchors, xmode, started, spe)
    origin = started if started is not None else (anchors[0][2] if anchors else 0.0)
    relative = figures.step_mapper(anchors, "time", origin, spe)
    return lambda steps: [origin + x for x in relative(steps)]


def full_curves_csv(
    engine, runs: Sequence[RunRecord], keys: Sequence[str], groups: Mapping[str, str] | None = None
) -> bytes:
    """Every stored point of the chosen metrics (not the charts' downsampled series), one row each: run, key,
    step, epoch, value (NaN as nan), wall_time (Unix seconds); with `groups` (run id -> group label), the
    group of each run too. Built when the user clicks the download button, streamed from the database."""
    wanted = set(keys)
    buf = io.StringIO()
    out = csv.writer(buf, lineterminator="\n")
    out.writerow(
        ["run_id", "run", *(["group"] if groups is not None else []), "key", "step", "epoch", "value", "wall_time"]
    )
    for r in runs:
        extra = [groups.get(r.id, "")] if groups is not None else []
        for key, step, epoch, value, wall in repo.iter_points(engine, r.id):
            if key in wanted:
                out.writerow([r.id, r.name, *extra, key, step, "" if epoch is None else epoch, value, wall])
    return buf.getvalue().encode()


def csv_builder(
    runs: Sequence[RunRecord], keys: Sequence[str], groups: Mapping[str, str] | None = None
) -> Callable[[], bytes]:
    """full_curves_csv for a download button that builds it on click (engine taken now, in the script)."""
    engine, runs, keys = queries.engine(), tuple(runs), tuple(keys)
    return lambda: full_curves_csv(engine, runs, keys, groups)
