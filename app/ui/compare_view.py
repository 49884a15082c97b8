"""The Compare page's tables and figures, as plain functions of RunRecords and Series."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

import pandas as pd
import plotly.graph_objects as go

from app import charts
from app import fmt as f
from app.ui import queries
from core.names import SYSTEM_PREFIX, is_loss
from app.ui.run_charts import per_epoch
from app.schema import flatten
from db.types import RunRecord, Series


def best_value(r: RunRecord, key: str) -> float | None:
    """Best so far of a metric: the minimum for losses, the maximum otherwise."""
    s = r.metrics.get(key)
    if s is None:
        return None
    return s.min_value if is_loss(key) else s.max_value


def summary_table(runs: Sequence[RunRecord]) -> pd.DataFrame:
    rows = []
    for r in runs:
        summary = r.summary or {}
        best = summary.get("best") or {}
        spec = r.spec
        rows.append({
            "run": r.name, "id": r.id, "status": r.status, "best val/acc": best_value(r, "val/acc"),
            "lowest val/loss": best_value(r, "val/loss"),
            "monitored": f"{best['metric']} {best['value']:.4f}" if best.get("value") is not None else "",
            "best epoch": best.get("epoch"), "epochs run": summary.get("epochs_run"),
            "time (s)": summary.get("wall_time_s") or f.duration_s(r), "parameters": summary.get("parameters"),
            "model": spec.get("model", {}).get("name"), "data": spec.get("data", {}).get("name"),
            "lr": spec.get("optim", {}).get("lr"),
        })
    return pd.DataFrame(rows)


def _cell(v: Any) -> str:
    return json.dumps(v) if isinstance(v, (list, dict, tuple)) else str(v)


def spec_diff(runs: Sequence[RunRecord], differences_only: bool = True) -> pd.DataFrame:
    """One row per spec field, one column per run."""
    flat = [flatten(dict(r.spec)) for r in runs]
    labels = _labels(runs)
    rows = []
    for field in flat[0] if flat else []:
        values = [_cell(x.get(field)) for x in flat]
        if differences_only and len(set(values)) <= 1:
            continue
        rows.append({"field": field, **dict(zip(labels, values, strict=True))})
    return pd.DataFrame(rows, columns=["field", *labels])


def _labels(runs: Sequence[RunRecord]) -> list[str]:
    names = [r.name for r in runs]
    return [f"{r.name} ({r.id[:6]})" if names.count(r.name) > 1 else r.name for r in runs]


def varying_hyperparameters(runs: Sequence[RunRecord], limit: int = 8) -> dict[str, list[Any]]:
    """Spec fields that differ between the runs (the lr when none do), for the parallel coordinates."""
    flat = [flatten(dict(r.spec)) for r in runs]
    out: dict[str, list[Any]] = {}
    for field in flat[0] if flat else []:
        values = [x.get(field) for x in flat]
        if field != "name" and len({_cell(v) for v in values}) > 1:
            out[field] = [v if isinstance(v, (int, float)) and not isinstance(v, bool) else _cell(v) for v in values]
    if not out and flat:
        out["optim.lr"] = [x.get("optim.lr") for x in flat]
    return dict(list(out.items())[:limit])


def parallel(runs: Sequence[RunRecord], metric: str) -> go.Figure:
    params = varying_hyperparameters(runs)
    values = [best_value(r, metric) for r in runs]
    return charts.parallel_figure(params, f"best {metric}", [v if v is not None else float("nan") for v in values])


def curve_figures(runs: Sequence[RunRecord], series: dict, keys: Sequence[str], xmode: str,
                  smoothing: float) -> list[tuple[str, go.Figure]]:
    labels = _labels(runs)
    mappers = {r.id: x_mapper(r, xmode) for r in runs}
    out = []
    for key in keys:
        traces = []
        for i, (r, label) in enumerate(zip(runs, labels, strict=True)):
            s: Series | None = series.get(r.id, {}).get(key)
            if s is None or not s.steps:
                continue
            traces.append(charts.Trace(label, x_values(r, s, key, mappers[r.id]), s.values, markers=per_epoch(key),
                                       color=charts.PALETTE[i % len(charts.PALETTE)]))
        if traces:
            out.append((key, charts.line_figure(key, traces, x_title=x_title(key, xmode), smoothing=smoothing,
                                                uirevision=f"compare:{key}:{xmode}", height=340)))
    return out


def x_title(key: str, xmode: str) -> str:
    return charts.X_TITLES["time" if key.startswith(SYSTEM_PREFIX) else xmode]


def x_values(r: RunRecord, s: Series, key: str, mapper) -> list[float]:
    """A series' x: its steps mapped to the x-axis mode; a system metric's, seconds since the run started."""
    if key.startswith(SYSTEM_PREFIX):
        start = r.started_at.timestamp() if r.started_at else s.steps[0]
        return [t - start for t in s.steps]
    return mapper(s.steps)


def x_mapper(r: RunRecord, xmode: str):
    if xmode == "step":
        return list
    anchors = queries.epoch_anchors(r.id)
    from app.ui.run_charts import steps_per_epoch

    spe = steps_per_epoch(r, anchors[-1][0] if anchors else None)
    return charts.step_mapper(anchors, xmode, r.started_at.timestamp() if r.started_at else None, spe)


def curves_csv(runs: Sequence[RunRecord], series: dict, keys: Sequence[str],
               groups: Mapping[str, str] | None = None) -> bytes:
    """Every point shown, one row each; with `groups` (run id -> group label), the group of each run too."""
    columns = ["run_id", "run", *(["group"] if groups is not None else []), "key", "step", "value"]
    rows = []
    for r in runs:
        extra = {"group": groups.get(r.id, "")} if groups is not None else {}
        for key in keys:
            s = series.get(r.id, {}).get(key)
            if s is not None:
                rows += [{"run_id": r.id, "run": r.name, **extra, "key": key, "step": st, "value": v}
                         for st, v in zip(s.steps, s.values, strict=True)]
    return pd.DataFrame(rows, columns=columns).to_csv(index=False).encode()
