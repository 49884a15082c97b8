"""Plotly figures. Every live figure carries a `uirevision` that stays the same across refreshes,
so zoom, pan and legend selections survive new data; it changes only when the meaning of the axes
does (another run, another x-axis)."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np
import plotly.graph_objects as go

from app.present.text import plot_text

X_MODES = ("step", "epoch", "time")
X_TITLES = {"step": "step", "epoch": "epoch", "time": "seconds since start", "wall": "wall-clock time (UTC)"}
# Compare also draws runs against the clock ("wall": x is Unix seconds, drawn as dates).
COMPARE_X_MODES = (*X_MODES, "wall")
X_LABELS = {"step": "step", "epoch": "epoch", "time": "relative time", "wall": "wall time"}
PALETTE = ("#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f", "#bcbd22", "#17becf")


@dataclass
class Trace:
    name: str
    x: Sequence[float]
    y: Sequence[float]
    markers: bool = False  # per-epoch metrics: few points, show them
    color: str | None = None
    extra: dict = field(default_factory=dict)


def smooth(values: Sequence[float], weight: float) -> list[float]:
    """Debiased exponential moving average (TensorBoard's smoothing); NaNs pass through."""
    if weight <= 0:
        return list(values)
    out, last, n = [], 0.0, 0
    for v in values:
        if v is None or not math.isfinite(v):
            out.append(v)
            continue
        last, n = last * weight + (1 - weight) * v, n + 1
        out.append(last / (1 - weight**n))
    return out


def step_mapper(
    anchors: Sequence[tuple[int, int, float]], mode: str, started: float | None, steps_per_epoch: float | None = None
):
    """A function steps → x for `mode`, from (step, epoch, wall_time) anchors (see queries.epoch_anchors).
    Beyond the last anchor the last rate is extrapolated."""
    if mode == "step":
        return lambda steps: list(steps)
    if mode == "epoch":
        ends = [(s, e) for s, e, _ in anchors if e]
        xs = [0.0] + [float(s) for s, _ in ends]
        ys = [0.0] + [float(e) for _, e in ends]
        slope = 1.0 / steps_per_epoch if steps_per_epoch else (ys[-1] / xs[-1] if xs[-1] else 0.0)
    else:
        pts = sorted((float(s), w - (started or anchors[0][2])) for s, _, w in anchors) if anchors else []
        xs = [0.0] + [p[0] for p in pts]
        ys = [0.0] + [p[1] for p in pts]
        slope = (ys[-1] - ys[-2]) / (xs[-1] - xs[-2]) if len(xs) > 1 and xs[-1] > xs[-2] else 0.0

    def to_x(steps: Sequence[int]) -> list[float]:
        s = np.asarray(steps, dtype=float)
        out = np.interp(s, xs, ys)
        beyond = s > xs[-1]
        out[beyond] = ys[-1] + (s[beyond] - xs[-1]) * slope
        return out.tolist()

    return to_x


def as_dates(xs: Sequence[float]) -> np.ndarray:
    """Unix seconds as datetimes (UTC), for a date x-axis."""
    return (np.asarray(xs, dtype=float) * 1000).astype("datetime64[ms]")


def line_dict(
    title: str,
    traces: Sequence[Trace],
    *,
    x_title: str,
    uirevision: str,
    smoothing: float = 0.0,
    log_y: bool = False,
    height: int = 300,
    x_dates: bool = False,
    whole_x: bool = False,
) -> dict:
    """A line chart as Plotly's plain JSON structure (numpy arrays inside), built without Plotly's
    per-property validation: a live chart is rebuilt every time its series grows, and validation
    costs ten times the rest. Trace names and the title are shown as text (a run's or a class's name
    is never Plotly's HTML). With `x_dates`, the traces' x are Unix seconds, drawn on a date axis; with
    `whole_x` (steps, epochs), the x-axis is ticked on whole numbers only (whole_ticks)."""
    data = []
    for i, t in enumerate(traces):
        data += _trace_dicts(t, t.color or PALETTE[i % len(PALETTE)], x_dates=x_dates, smoothing=smoothing)
    layout = _line_layout(title, x_title=x_title, uirevision=uirevision, height=height)
    xs = [v for t in traces for v in t.x]
    layout["xaxis"].update({**({"type": "date"} if x_dates else {}), **(whole_ticks(xs) if whole_x else {})})
    if log_y:
        layout["yaxis"] = {"type": "log", "dtick": 1, "exponentformat": "power"}  # one label per decade
    else:
        layout["yaxis"] = _flat_range([v for t in traces for v in t.y])
    return {"data": data, "layout": layout}


def _trace_dicts(t: Trace, color: str, *, x_dates: bool, smoothing: float) -> list[dict]:
    """One trace's line; smoothed, its raw values faint behind it (per-step series with more than two points)."""
    name = plot_text(t.name)
    x, y = as_dates(t.x) if x_dates else np.asarray(t.x, dtype=float), np.asarray(t.y, dtype=float)
    out = []
    if smoothing > 0 and not t.markers and len(y) > 2:
        out.append(
            {
                "type": "scatter",
                "x": x,
                "y": y,
                "name": f"{name} (raw)",
                "mode": "lines",
                "showlegend": False,
                "line": {"color": color, "width": 1},
                "opacity": 0.25,
                "hoverinfo": "skip",
                "legendgroup": t.name,
            }
        )
        y = np.asarray(smooth(y.tolist(), smoothing), dtype=float)
    out.append(
        {
            "type": "scatter",
            "x": x,
            "y": y,
            "name": name,
            "legendgroup": t.name,
            "mode": "lines+markers" if t.markers else "lines",
            "line": {"color": color, "width": 2},
            "marker": {"size": 6},
            **t.extra,
        }
    )
    return out


def _line_layout(title: str, *, x_title: str, uirevision: str, height: int) -> dict:
    """Title on top, legend in its own row under it (long per-layer legends never cover the title)."""
    return {
        "title": {"text": plot_text(title), "font": {"size": 14}, "y": 0.98, "yanchor": "top"},
        "height": height,
        "uirevision": uirevision,
        "margin": {"l": 10, "r": 10, "t": 64, "b": 10},
        "hovermode": "x unified",
        "legend": {
            "orientation": "h",
            "yanchor": "bottom",
            "y": 1.0,
            "xanchor": "left",
            "x": 0.0,
            "font": {"size": 11},
        },
        "xaxis": {"title": {"text": x_title}},
        "yaxis": {},
    }


WHOLE_X_MODES = ("step", "epoch")  # the x-axes counted in whole numbers
WHOLE_TICKS_SPAN = 10  # below this span of steps or epochs, one tick per whole number


def whole_ticks(xs: Sequence[float]) -> dict:
    """The x-axis settings of steps or epochs: ticks on whole numbers only. Over a short span (a chart of one point,
    the first epochs) Plotly would tick halves (421, 421.5, 422): there, one tick per whole number, the axis
    widened to the whole numbers around the points when none lies among them (steps of the first epoch on an
    epoch axis). Over a longer one, Plotly's own spacing, labelled as integers."""
    finite = [float(x) for x in xs if x is not None and math.isfinite(x)]
    if not finite or max(finite) - min(finite) >= WHOLE_TICKS_SPAN:
        return {"tickformat": "d"}
    lo, hi = min(finite), max(finite)
    axis: dict = {"tickformat": "d", "tickmode": "linear", "tick0": 0, "dtick": 1}
    if math.floor(hi) < math.ceil(lo):  # no whole number among the points
        axis["range"] = [math.floor(lo), math.ceil(hi)]
    return axis


def line_figure(title: str, traces: Sequence[Trace], **kwargs) -> go.Figure:
    """line_dict as a Plotly figure (for st.plotly_chart and figures edited further)."""
    return go.Figure(line_dict(title, traces, **kwargs))


def _flat_range(ys: Sequence[float]) -> dict:
    """A constant series (a fixed learning rate) would get Plotly's default ±1 range, which draws
    0.001 as if it were 0: the y-axis settings that centre the axis on the value instead."""
    finite = [v for v in ys if v is not None and math.isfinite(v)]
    if not finite:
        return {}
    lo, hi = min(finite), max(finite)
    if hi - lo <= 1e-9 * max(abs(hi), 1e-300):
        pad = abs(hi) * 0.5 if hi else 1.0
        return {"range": [hi - pad, hi + pad]}
    return {}


def confusion_figure(matrix: Sequence[Sequence[int]], names: Sequence[str], uirevision: str) -> go.Figure:
    m = np.asarray(matrix, dtype=float)
    rows = m.sum(axis=1, keepdims=True)
    share = np.divide(m, rows, out=np.zeros_like(m), where=rows > 0)
    labels = [plot_text(n) for n in names]  # axis ticks and hover render Plotly's HTML: class names as text
    fig = go.Figure(
        go.Heatmap(
            z=share.tolist(),
            x=labels,
            y=labels,
            colorscale="Blues",
            zmin=0,
            zmax=1,
            text=m.astype(int).tolist(),
            texttemplate="%{text}",
            colorbar={"title": "row share"},
            hovertemplate="true %{y} → predicted %{x}: %{text} (%{z:.1%})<extra></extra>",
        )
    )
    fig.update_layout(
        title={"text": "Confusion matrix (validation)", "font": {"size": 14}},
        height=420,
        uirevision=uirevision,
        margin={"l": 10, "r": 10, "t": 40, "b": 10},
    )
    fig.update_xaxes(title_text="predicted", type="category")
    fig.update_yaxes(title_text="true", type="category", autorange="reversed")
    return fig


def bar_figure(
    title: str,
    names: Sequence[str],
    values: Sequence[float],
    *,
    y_title: str,
    uirevision: str,
    percent: bool = False,
    height: int = 320,
) -> go.Figure:
    fig = go.Figure(
        go.Bar(
            x=[plot_text(n) for n in names],
            y=list(values),
            marker_color=PALETTE[0],
            texttemplate="%{y:.1%}" if percent else "%{y}",
            textposition="outside",
        )
    )
    fig.update_layout(
        title={"text": plot_text(title), "font": {"size": 14}},
        height=height,
        uirevision=uirevision,
        margin={"l": 10, "r": 10, "t": 40, "b": 10},
    )
    fig.update_xaxes(type="category")
    fig.update_yaxes(title_text=y_title, tickformat=".0%" if percent else None, range=[0, 1.08] if percent else None)
    return fig


def parallel_figure(columns: dict[str, Sequence], metric: str, metric_values: Sequence[float]) -> go.Figure:
    """Hyperparameters (numeric, or categorical mapped to ticks) against one metric, coloured by it. Labels
    render Plotly's HTML, so they are escaped; tick texts are shown as they are."""
    dims = []
    for name, values in columns.items():
        if all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in values):
            dims.append({"label": plot_text(name), "values": [float(v) for v in values]})
        else:
            cats = sorted({str(v) for v in values})
            dims.append(
                {
                    "label": plot_text(name),
                    "values": [cats.index(str(v)) for v in values],
                    "tickvals": list(range(len(cats))),
                    "ticktext": cats,
                }
            )
    clean = [v if v is not None and math.isfinite(v) else float("nan") for v in metric_values]
    dims.append({"label": plot_text(metric), "values": clean})
    fig = go.Figure(
        go.Parcoords(
            dimensions=dims,
            line={"color": clean, "colorscale": "Viridis", "showscale": True, "colorbar": {"title": plot_text(metric)}},
        )
    )
    fig.update_layout(height=380, margin={"l": 60, "r": 60, "t": 50, "b": 20})
    return fig
