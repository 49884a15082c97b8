"""The Run page's charts: which metric keys go on which chart, and the series behind them.

A running run's series live in the process-wide app.live.series.SharedRun: fetched once
downsampled, then only the keys that grew, only their new points; each chart is rebuilt only when
one of its series grew, and its JSON is shared by every viewer. A finished run's charts are built
once and cached."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import streamlit as st

from app.live import series
from app.live.chart import Chart, asked_again, chart
from app.present.figures import WHOLE_X_MODES, X_TITLES, Trace, line_dict, step_mapper
from app.ui import queries
from core import catalog
from core import names as n
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
    # The per-epoch metrics' charts (Loss, Accuracy), as core/catalog.py groups them.
    *(ChartSpec(title, keys) for title, keys in catalog.chart_keys().items()),
    ChartSpec("Learning rate", (n.LR,), smooth=False),
    ChartSpec("Gradient norm (total and per layer group)", (n.GRAD_NORM,), (n.GRAD_NORM_PREFIX,), log_y=True),
    ChartSpec("Update / parameter ratio per layer group", (), (n.UPDATE_RATIO_PREFIX,), log_y=True),
    ChartSpec("Throughput (samples/s)", (n.THROUGHPUT,)),
    ChartSpec("Data wait (fraction of step time)", (n.DATA_WAIT,)),
    ChartSpec("Epoch time (s)", (n.EPOCH_TIME,), smooth=False),
    ChartSpec("Peak memory (MB)", (n.PEAK_MEMORY,), smooth=False),
    ChartSpec(
        "System: CPU and GPU utilisation (%)", (), (n.SYS_CPU, n.SYS_HOST_CPU, n.GPU_PREFIX), system=True, smooth=False
    ),
    ChartSpec("System: memory (MB)", (n.SYS_RSS,), (), system=True, smooth=False),
)
EPOCH_KEYS = (
    *map(catalog.stored_key, catalog.METRICS),
    "val/",
    n.EPOCH_TIME,
    n.PEAK_MEMORY,
    n.LR_EPOCH,
    n.DATA_WAIT_EPOCH,
)
MAX_POINTS = 2000  # a finished run's charts (a running run's: series.LIVE_POINTS)


def per_epoch(key: str) -> bool:
    return key.startswith(EPOCH_KEYS)


def chart_keys(spec: ChartSpec, available: Sequence[str]) -> list[str]:
    keys = spec.select(available)
    if spec.title.startswith("System: CPU"):
        keys = [k for k in keys if k.endswith(("_percent", "_util"))]
    if spec.title.startswith("System: memory"):
        keys += sorted(k for k in available if k.startswith(n.GPU_PREFIX) and k.endswith("_mem_mb"))
    return keys


MAX_OTHER_CHARTS = 48  # a script's own metric keys drawn one chart each (Compare overlays any of them)


def uncharted(r: RunRecord, keys: Sequence[str]) -> list[str]:
    """A script's metric keys (a run logged through the MLflow client: `loss`, `accuracy`) that none of CHARTS
    draws; none for torchdeck's runs, whose keys the catalog names."""
    if not r.external:
        return []
    drawn = {k for spec in CHARTS for k in chart_keys(spec, keys)}
    return [k for k in sorted(keys) if k not in drawn]


def chart_specs(r: RunRecord, keys: Sequence[str]) -> tuple[ChartSpec, ...]:
    """CHARTS, and for a script's run one chart per key they leave out (at most MAX_OTHER_CHARTS)."""
    titles = {spec.title for spec in CHARTS}
    other = uncharted(r, keys)[:MAX_OTHER_CHARTS]
    return (*CHARTS, *(ChartSpec(k if k not in titles else f"{k} (metric)", (k,)) for k in other))


def steps_per_epoch(r: RunRecord, last_step: int | None) -> float | None:
    epochs = (r.spec.get("train") or {}).get("epochs")
    if not epochs or not r.progress or not last_step:
        return None
    return last_step / (r.progress * epochs)


Getter = Callable[[str], tuple[Sequence[int], Sequence[float]]]


def _chart(
    r: RunRecord, spec: ChartSpec, keys: Sequence[str], get: Getter, anchors, xmode: str, smoothing: float
) -> Chart | None:
    started = r.started_at.timestamp() if r.started_at else None
    to_x = None
    if xmode != "step" and anchors:
        to_x = step_mapper(anchors, xmode, started, steps_per_epoch(r, anchors[-1][0]))
    traces = []
    for key in keys:
        steps, values = get(key)
        if not steps:
            continue
        if spec.system:
            x = [s - (started or steps[0]) for s in steps]
        else:
            x = to_x(steps) if to_x else list(steps)
        traces.append(Trace(key, x, values, markers=per_epoch(key)))
    if not traces:
        return None
    fig = line_dict(
        spec.title,
        traces,
        x_title=X_TITLES["time"] if spec.system else X_TITLES[xmode],
        uirevision=f"{r.id}:{spec.title}:{xmode}",
        smoothing=smoothing if spec.smooth else 0.0,
        log_y=spec.log_y,
        whole_x=not spec.system and xmode in WHOLE_X_MODES,
    )
    return chart(spec.title, fig)


def wait_for_more(run_id: str, counts: dict[str, int], chart_key: str) -> None:
    """After a timer's refresh has sent the charts of `counts`: wait, on the server, until a series grows
    (a click cuts the wait short; at most series.WAIT_S), so that the browser redraws when there is
    something new rather than every few hundred milliseconds. The charts just sent reach the browser
    meanwhile: a fragment's messages stream while it runs."""
    if series.fragment_rerun() and not asked_again(chart_key):
        live = series.shared(queries.db_url(), run_id)
        live.wait_for_growth(queries.engine(), counts, series.WAIT_S, series.preempted)


def live_figures(r: RunRecord, xmode: str, smoothing: float) -> tuple[list[Chart], dict[str, int]]:
    """A running run's charts, and each metric key's point count."""
    engine = queries.engine()
    live = series.shared(queries.db_url(), r.id)
    counts = live.refresh(engine)
    anchors = live.anchors(engine, (counts.get(n.EPOCH_TIME), counts.get(n.TRAIN_LOSS))) if xmode != "step" else []
    spe = steps_per_epoch(r, anchors[-1][0]) if anchors and xmode == "epoch" else None
    out = []
    for spec in chart_specs(r, sorted(counts)):
        keys = chart_keys(spec, sorted(counts))
        if not keys:
            continue
        version = (
            spec.title,
            xmode,
            smoothing,
            tuple((k, counts[k]) for k in keys),
            len(anchors) if xmode != "step" else 0,
            spe,
            r.started_at,
        )
        c = live.built(version, lambda spec=spec, keys=keys: _chart(r, spec, keys, live.get, anchors, xmode, smoothing))
        if c is not None:
            out.append(c)
    return out, counts


@st.cache_data(ttl=600, show_spinner=False, max_entries=64)
def _final_figures(url: str, run_id: str, finished_at, xmode: str, smoothing: float) -> list[Chart]:
    r = queries.run(run_id)
    if r is None:
        return []
    keys = queries.metric_keys(r)
    anchors = queries.epoch_anchors(r.id) if xmode != "step" else []

    def get(key: str) -> tuple[Sequence[int], Sequence[float]]:
        s = queries.final_series(r, key, MAX_POINTS)
        return s.steps, s.values

    out = [_chart(r, spec, chart_keys(spec, keys), get, anchors, xmode, smoothing) for spec in chart_specs(r, keys)]
    return [c for c in out if c is not None]


def figures(r: RunRecord, xmode: str, smoothing: float) -> tuple[list[Chart], dict[str, int] | None]:
    """The run's charts; for a running run, each metric key's point count as well."""
    if r.finished:
        return _final_figures(queries.db_url(), r.id, r.finished_at, xmode, smoothing), None
    return live_figures(r, xmode, smoothing)
