"""The Sweep page's reads (cached where they may be), its tables and its figures, as functions of a
SweepView (app/services/sweeps.py). A running sweep is read fresh at each refresh; a finished one is cached."""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from typing import Any

import pandas as pd
import plotly.graph_objects as go
import streamlit as st

from app.present import figures
from app.present import text as f
from app.present.seed_groups import add_band, band, mean_std_text
from app.present.text import plot_text
from app.services import sweeps
from app.services.broker import engine_for
from app.services.owners import owner_labels
from app.services.sweeps import SweepView
from app.ui import queries
from db import repo
from sweep import control, study
from sweep.spec import SweepSpec

# A sweep's page reads more than a run's (every trial's runs and curves): refreshed at most this often.
REFRESH_S = max(queries.REFRESH_S, 2.0)
STATE_COLOR = {"completed": "green", "pruned": "orange", "running": "blue", "queued": "gray", "failed": "red"}
PRUNED_ROW = "background-color: rgba(255, 165, 0, 0.18)"
PRUNED_GRAY = "#9e9e9e"


# --- reads -------------------------------------------------------------------------------------------
def view(sweep_id: str) -> SweepView | None:
    """The sweep as the page shows it, or None for an unknown id: fresh while it runs, cached once it ended."""
    try:
        record = repo.get_sweep(queries.engine(), sweep_id)
    except repo.SweepNotFound:
        return None
    if record.finished:
        return _finished_view(queries.db_url(), sweep_id, record.finished_at)
    return sweeps.view(sweep_id, engine=queries.engine())


@st.cache_data(ttl=15, max_entries=32, show_spinner=False)
def _finished_view(url: str, sweep_id: str, finished_at: Any) -> SweepView:
    # A short TTL: a cancelled sweep's running trials take a step or two to stop after it ended.
    return sweeps.view(sweep_id, engine=engine_for(url))


def importances(v: SweepView) -> dict[str, float]:
    """Optuna's fANOVA importances (about two seconds): computed again only when a trial completes."""
    completed = sum(1 for o in v.outcomes if o.state == "completed")
    return _importances(queries.db_url(), v.sweep.id, completed, v.state)


@st.cache_data(ttl=3600, max_entries=64, show_spinner="Computing parameter importances…")
def _importances(url: str, sweep_id: str, completed: int, _state: study.SweepState) -> dict[str, float]:
    return study.importances(_state)


def estimate(spec: SweepSpec) -> sweeps.Estimate:
    """Trials, runs, epochs at most, and the time per epoch of similar finished runs (a query: cached briefly)."""
    return _estimate(queries.db_url(), spec.model_dump_json())


@st.cache_data(ttl=30, max_entries=64, show_spinner=False)
def _estimate(url: str, spec_json: str) -> sweeps.Estimate:
    return sweeps.estimate(SweepSpec.model_validate_json(spec_json), engine=engine_for(url))


@st.cache_data(ttl=5, show_spinner=False)
def _listing(url: str, limit: int, project: str) -> list[dict[str, Any]]:
    engine = engine_for(url)
    rows = []
    for s in repo.list_sweeps(engine, limit=limit, project=project):
        state = control.load_state(engine, s)
        outcomes = control.outcomes(state)
        best = control.best(state)
        done = sum(1 for o in outcomes if o.state != "running")
        rows.append(
            {
                "name": s.name,
                "owner": s.owner,
                "status": s.status,
                "trials": f"{done}/{state.spec.trials}",
                "best": _best_text(state, best),
                "objective": f"{state.spec.metric} ({state.spec.mode})",
                "created": s.created_at,
                "open": f"sweep?id={s.id}",
                "id": s.id,
            }
        )
    return rows


def listing(project: str, limit: int = 200) -> pd.DataFrame:
    """The project's sweeps, newest first: name, owner, status, trials done/total, best objective, a link to each."""
    rows = _listing(queries.db_url(), limit, project)
    owners = owner_labels((r["owner"] for r in rows), engine=queries.engine())
    rows = [{**r, "owner": owners.get(r["owner"], r["owner"])} for r in rows]
    return pd.DataFrame(
        rows, columns=["name", "owner", "status", "trials", "best", "objective", "created", "open", "id"]
    )


def _best_text(state: study.SweepState, best: control.Best | None) -> str:
    if best is None:
        return "–"
    return f"#{best.number}: " + mean_std_text(run_bests(state, best.number))


def run_bests(state: study.SweepState, number: int) -> list[float | None]:
    """Each of a trial's runs' best objective so far (one per seed)."""
    return [study.best_of(state.values.get(r.id, {}), state.spec.mode) for r in state.runs_of(number)]


# --- the trials table ----------------------------------------------------------------------------------
def value_text(v: Any) -> Any:
    if isinstance(v, float):
        return float(f"{v:.6g}")
    return v if isinstance(v, (int, float)) and not isinstance(v, bool) else json.dumps(v)


def display_state(v: SweepView, o: study.Outcome) -> str:
    """The trial's state, a trial none of whose runs has started yet being `queued` (not running)."""
    waiting = o.state == "running" and all(r.status in ("queued", "lost") for r in v.state.runs_of(o.number))
    return "queued" if waiting else o.state


def state_text(v: SweepView, o: study.Outcome) -> str:
    if o.state != "pruned":
        return display_state(v, o)
    epoch = next((d.epoch for d in v.state.decisions_of(o.number) if d.pruned), None)
    return "pruned" + (f" at epoch {epoch}" if epoch is not None else "")


def trials_frame(v: SweepView) -> pd.DataFrame:
    """One row per trial: its status (pruned ones say so, and why), its parameters, its objective (mean ± std (n)
    of its seeds' bests), the epochs its runs used, and links to its run (and to its seeds side by side)."""
    params = list(v.spec.space)
    by_number = {t.number: t for t in v.state.trials}
    rows = []
    for o in v.outcomes:
        runs = v.state.runs_of(o.number)
        row: dict[str, Any] = {"trial": o.number, "status": state_text(v, o)}
        row.update({p: value_text(by_number[o.number].params.get(p)) for p in params})
        bests = run_bests(v.state, o.number)
        row[v.spec.metric] = mean_std_text(bests) if v.spec.seeds > 1 else bests[0] if bests else None
        row["epochs"] = o.epochs
        row["why pruned"] = o.reason or ""
        row["run"] = f"run?id={runs[0].id}" if runs else None
        if v.spec.seeds > 1:
            row["seeds"] = "compare?ids=" + ",".join(r.id for r in runs) if runs else None
        rows.append(row)
    columns = ["trial", "status", *params, v.spec.metric, "epochs", "why pruned", "run"]
    return pd.DataFrame(rows, columns=columns + (["seeds"] if v.spec.seeds > 1 else []))


def styled_trials(v: SweepView):
    """The trials table with its pruned rows shaded."""
    df = trials_frame(v)
    pruned = {i for i, o in enumerate(v.outcomes) if o.state == "pruned"}
    return df.style.apply(lambda row: [PRUNED_ROW if row.name in pruned else ""] * len(row), axis=1)


def trial_columns(v: SweepView) -> dict[str, Any]:
    cc = st.column_config
    out: dict[str, Any] = {
        "trial": cc.NumberColumn("trial", format="#%d", width="small"),
        "run": cc.LinkColumn("run", display_text="open ↗", width="small"),
        "seeds": cc.LinkColumn("seeds", display_text="compare ↗", width="small"),
        "why pruned": cc.TextColumn("why pruned", width="large"),
    }
    if v.spec.seeds == 1:
        out[v.spec.metric] = cc.NumberColumn(v.spec.metric, format="%.4f")
    return out


# --- figures ------------------------------------------------------------------------------------------
def _label(v: SweepView, number: int) -> str:
    params = next((t.params for t in v.state.trials if t.number == number), {})
    short = ", ".join(f"{p.rsplit('.', 1)[-1]}={value_text(x)}" for p, x in params.items())
    return f"#{number} {short}"


def best_so_far_figure(v: SweepView) -> go.Figure:
    """Each completed trial's objective (dots), each pruned one's last value (crosses), the best so far (steps)."""
    fig = go.Figure()
    done = [o for o in v.outcomes if o.state == "completed" and o.value is not None]
    pruned = [o for o in v.outcomes if o.state == "pruned" and o.curve]
    fig.add_trace(
        go.Scatter(
            x=[o.number for o in done],
            y=[o.value for o in done],
            mode="markers",
            name="trial",
            marker={"color": figures.PALETTE[0], "size": 8},
            text=[plot_text(_label(v, o.number)) for o in done],
            hoverinfo="text+y",
        )
    )
    if pruned:
        fig.add_trace(
            go.Scatter(
                x=[o.number for o in pruned],
                y=[o.curve[max(o.curve)] for o in pruned],
                mode="markers",
                name="pruned (last value)",
                marker={"color": PRUNED_GRAY, "symbol": "x", "size": 8},
                text=[plot_text(_label(v, o.number)) for o in pruned],
                hoverinfo="text+y",
            )
        )
    best = sweeps.best_so_far(v)
    fig.add_trace(
        go.Scatter(
            x=[n for n, _ in best],
            y=[b for _, b in best],
            mode="lines",
            name="best so far",
            line={"color": figures.PALETTE[2], "width": 3, "shape": "hv"},
        )
    )
    _layout(fig, f"Best so far ({v.spec.metric}, {v.spec.mode})", "trial", v)
    return fig


def curves_figure(v: SweepView) -> go.Figure:
    """The objective per epoch of every trial, overlaid: a seed group as its mean with a ± std band, a pruned
    trial dashed and grey, ending in a cross where it was stopped."""
    fig = go.Figure()
    for i, o in enumerate(v.outcomes):
        name = plot_text(_label(v, o.number))
        color = PRUNED_GRAY if o.state == "pruned" else figures.PALETTE[i % len(figures.PALETTE)]
        runs = v.state.runs_of(o.number)
        per_run = {r.id: v.state.values.get(r.id, {}) for r in runs}
        if v.spec.seeds > 1 and sum(1 for c in per_run.values() if c) > 1:
            xs, means, stds, _ = band({k: (sorted(c), [c[e] for e in sorted(c)]) for k, c in per_run.items()})
            add_band(fig, xs, means, [s if math.isfinite(s) else 0.0 for s in stds], name=name, color=color)
            continue
        epochs = sorted(o.curve)
        if not epochs:
            continue
        pruned = o.state == "pruned"
        fig.add_trace(
            go.Scatter(
                x=epochs,
                y=[o.curve[e] for e in epochs],
                name=name,
                mode="lines+markers",
                line={"color": color, "dash": "dash" if pruned else "solid"},
                marker={
                    "symbol": ["circle"] * (len(epochs) - 1) + ["x" if pruned else "circle"],
                    "size": [5] * (len(epochs) - 1) + [11 if pruned else 5],
                },
            )
        )
    # groups.add_band leaves a band's mode to Plotly, which marks its outline's points (under 20) with dots.
    fig.update_traces(mode="lines", selector={"fill": "toself"})
    _layout(fig, f"{v.spec.metric} per epoch, every trial", "epoch", v)
    return fig


def parallel_figure(v: SweepView) -> go.Figure | None:
    """The completed trials' parameters against their objective, coloured by it (None before the first)."""
    done = [o for o in v.outcomes if o.state == "completed" and o.value is not None]
    if not done:
        return None
    params = {t.number: t.params for t in v.state.trials}
    columns = {}
    for p, spec in v.spec.space.items():
        values = [_axis_value(params[o.number].get(p)) for o in done]
        if _log_axis(spec.loguniform is not None, values):  # a learning rate's decades, evenly apart
            columns[f"{p} (log10)"] = [math.log10(x) for x in values]
        else:
            columns[p] = values
    fig = figures.parallel_figure(columns, v.spec.metric, [o.value for o in done])
    fig.update_layout(uirevision=f"sweep:{v.sweep.id}:parallel")
    return fig


def _log_axis(loguniform: bool, values: list[Any]) -> bool:
    numbers = [x for x in values if isinstance(x, (int, float)) and not isinstance(x, bool)]
    if len(numbers) < len(values) or not numbers or min(numbers) <= 0:
        return False
    return loguniform or max(numbers) / min(numbers) >= 100


def _axis_value(x: Any) -> Any:
    return x if isinstance(x, (int, float)) and not isinstance(x, bool) else json.dumps(x)


def importance_figure(v: SweepView, values: dict[str, float]) -> go.Figure:
    names = sorted(values, key=values.get, reverse=True)
    return figures.bar_figure(
        "Parameter importances (Optuna, fANOVA)",
        names,
        [values[n] for n in names],
        y_title="importance",
        uirevision=f"sweep:{v.sweep.id}:importance",
        percent=True,
    )


def _layout(fig: go.Figure, title: str, x_title: str, v: SweepView) -> None:
    fig.update_layout(
        title={"text": plot_text(title), "font": {"size": 14}, "y": 0.98, "yanchor": "top"},
        height=360,
        uirevision=f"sweep:{v.sweep.id}:{x_title}",
        margin={"l": 10, "r": 10, "t": 64, "b": 10},
        legend={"orientation": "h", "yanchor": "bottom", "y": 1.0, "xanchor": "left", "x": 0.0, "font": {"size": 11}},
    )
    last = max([len(v.outcomes) - 1, *(e for o in v.outcomes for e in o.curve)], default=1)
    fig.update_xaxes(title_text=x_title, dtick=max(1, math.ceil(last / 10)))  # trials and epochs: whole numbers
    fig.update_yaxes(title_text=plot_text(v.spec.metric))


def counts_text(v: SweepView) -> str:
    """`5/12 trials done · 3 completed · 2 pruned · 1 running · 1 queued · 41 of at most 108 epochs` (Markdown)."""
    counts: dict[str, int] = {}
    for o in v.outcomes:
        counts[display_state(v, o)] = counts.get(display_state(v, o), 0) + 1
    done = sum(n for s, n in counts.items() if s not in ("running", "queued"))
    bits = [f"**{done}/{v.spec.trials}** trials done"]
    bits += [f":{STATE_COLOR[s]}[{counts[s]} {s}]" for s in STATE_COLOR if counts.get(s)]
    bits.append(f"{v.epochs_used} of at most {v.spec.max_epochs()} epochs")
    return " · ".join(bits)


def params_md(params: dict[str, Any], names: Sequence[str] | None = None) -> str:
    """`optim.lr = 0.01 · model.name = mlp`, each part as code (the values came from a user's space)."""
    keys = list(names or params)
    return " · ".join(f"{f.code_span(k)} = {f.code_span(value_text(params.get(k)))}" for k in keys)
