"""The Run page's charts: which metric keys go on which chart, and the series behind them.

A running run's series are fetched once downsampled and then incrementally: each refresh asks
the database only for points after the last step held (`since_step`). A finished run's series
are fetched once and cached."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import plotly.graph_objects as go
import streamlit as st

from app.ui import queries
from core import names as n
from app.charts import X_TITLES, Trace, line_figure, step_mapper
from db import repo
from db.types import RunRecord


@dataclass(frozen=True)
class ChartSpec:
    title: str
    keys: tuple[str, ...] = ()
    prefixes: tuple[str, ...] = ()
    log_y: bool = False
    system: bool = False  # x is wall time (the step of sys/* points is Unix seconds)
    smooth: bool = True  # noisy per-step series; schedules and per-epoch figures are drawn as they are

    def select(self, available: Sequence[str]) -> list[str]:
        exact = [k for k in self.keys if k in available]
        return exact + sorted(k for k in available if k not in exact and k.startswith(self.prefixes or ("\0",)))


CHARTS: tuple[ChartSpec, ...] = (
    ChartSpec("Loss", (n.TRAIN_LOSS, n.TRAIN_EPOCH_LOSS, n.VAL_LOSS)),
    ChartSpec("Accuracy", (n.TRAIN_ACC, n.VAL_ACC, n.VAL_ACC_TOP5)),
    ChartSpec("Learning rate", (n.LR,), smooth=False),
    ChartSpec("Gradient norm (total and per layer group)", (n.GRAD_NORM,), (n.GRAD_NORM_PREFIX,), log_y=True),
    ChartSpec("Update / parameter ratio per layer group", (), (n.UPDATE_RATIO_PREFIX,), log_y=True),
    ChartSpec("Throughput (samples/s)", (n.THROUGHPUT,)),
    ChartSpec("Data wait (fraction of step time)", (n.DATA_WAIT,)),
    ChartSpec("Epoch time (s)", (n.EPOCH_TIME,), smooth=False),
    ChartSpec("Peak memory (MB)", (n.PEAK_MEMORY,), smooth=False),
    ChartSpec("System: CPU and GPU utilisation (%)", (), (n.SYS_CPU, n.SYS_HOST_CPU, n.GPU_PREFIX),
              system=True, smooth=False),
    ChartSpec("System: memory (MB)", (n.SYS_RSS,), (), system=True, smooth=False),
)
EPOCH_KEYS = (n.TRAIN_EPOCH_LOSS, n.TRAIN_ACC, "val/", n.EPOCH_TIME, n.PEAK_MEMORY, n.LR_EPOCH, n.DATA_WAIT_EPOCH)
MAX_POINTS = 2000  # a finished run's charts
LIVE_POINTS = 1000  # a running run's, redrawn every refresh: half the work for the browser


def per_epoch(key: str) -> bool:
    return key.startswith(EPOCH_KEYS)


def chart_keys(spec: ChartSpec, available: Sequence[str]) -> list[str]:
    keys = spec.select(available)
    if spec.title.startswith("System: CPU"):
        keys = [k for k in keys if k.endswith(("_percent", "_util"))]
    if spec.title.startswith("System: memory"):
        keys += sorted(k for k in available if k.startswith(n.GPU_PREFIX) and k.endswith("_mem_mb"))
    return keys


class LiveSeries:
    """A running run's series held in session state and extended with only the new points."""

    def __init__(self, run_id: str):
        self.run_id = run_id
        self.steps: dict[str, list[int]] = {}
        self.values: dict[str, list[float]] = {}

    @classmethod
    def of(cls, run_id: str) -> LiveSeries:
        k = f"run.live.{run_id}"
        if k not in st.session_state:
            st.session_state[k] = cls(run_id)
        return st.session_state[k]

    def update(self, keys: Sequence[str]) -> None:
        engine = queries.engine()
        for key in keys:
            held = self.steps.get(key)
            if not held or len(held) > 2 * LIVE_POINTS:  # first fetch, or time to re-downsample
                s = repo.series(engine, self.run_id, key, max_points=LIVE_POINTS)
                self.steps[key], self.values[key] = list(s.steps), list(s.values)
                continue
            s = repo.series(engine, self.run_id, key, since_step=held[-1], max_points=LIVE_POINTS)
            held.extend(s.steps)
            self.values[key].extend(s.values)

    def get(self, key: str) -> tuple[Sequence[int], Sequence[float]]:
        return self.steps.get(key, []), self.values.get(key, [])


def series_getter(r: RunRecord, keys: Sequence[str]) -> Callable[[str], tuple[Sequence[int], Sequence[float]]]:
    if not r.finished:
        live = LiveSeries.of(r.id)
        live.update(keys)
        return live.get

    def get(key: str) -> tuple[Sequence[int], Sequence[float]]:
        s = queries.final_series(r, key, MAX_POINTS)
        return s.steps, s.values

    return get


def steps_per_epoch(r: RunRecord, last_step: int | None) -> float | None:
    epochs = (r.spec.get("train") or {}).get("epochs")
    if not epochs or not r.progress or not last_step:
        return None
    return last_step / (r.progress * epochs)


def figures(r: RunRecord, available: Sequence[str], xmode: str, smoothing: float,
            charts: Sequence[ChartSpec] = CHARTS) -> list[tuple[str, go.Figure]]:
    """One figure per chart that has data."""
    wanted = {spec.title: chart_keys(spec, available) for spec in charts}
    get = series_getter(r, sorted({k for keys in wanted.values() for k in keys}))
    started = r.started_at.timestamp() if r.started_at else None
    anchors = queries.epoch_anchors(r.id) if xmode != "step" else []
    last = anchors[-1][0] if anchors else None
    to_x = step_mapper(anchors, xmode, started, steps_per_epoch(r, last)) if xmode != "step" or anchors else None
    out = []
    for spec in charts:
        traces = []
        for key in wanted[spec.title]:
            steps, values = get(key)
            if not steps:
                continue
            if spec.system:
                x = [s - (started or steps[0]) for s in steps]
            else:
                x = to_x(steps) if to_x else list(steps)
            traces.append(Trace(key, x, values, markers=per_epoch(key)))
        if traces:
            x_title = X_TITLES["time"] if spec.system else X_TITLES[xmode]
            fig = line_figure(spec.title, traces, x_title=x_title, uirevision=f"{r.id}:{spec.title}:{xmode}",
                              smoothing=smoothing if spec.smooth else 0.0, log_y=spec.log_y)
            out.append((spec.title, fig))
    return out
