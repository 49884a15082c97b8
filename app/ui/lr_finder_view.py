"""The Run page's LR range test (train.lr_finder): the loss at each learning rate the pre-flight tried, raw and
smoothed, on a log axis, with the suggested optim.lr and the one the run used. It reads the run's `lr_finder`
event (core/lr_finder.py records it among the run's first events); a run without the test shows nothing."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import plotly.graph_objects as go
import streamlit as st

from app.present import text as f
from app.ui import queries
from db.types import EventRecord, RunRecord

CODE = "lr_finder"  # the event's code (core/lr_finder.py)
FIRST_EVENTS = 300  # the test runs in the pre-flight: its event is among a run's first ones


def wants_test(spec: Mapping[str, Any] | None) -> bool:
    """Whether the run's spec asked for the LR range test."""
    return bool((((spec or {}).get("train") or {}).get("lr_finder") or {}).get("enabled"))


def finder_event(events: Sequence[EventRecord]) -> EventRecord | None:
    """The run's latest `lr_finder` event (one per run: the test runs before the first epoch only)."""
    found = [e for e in events if (e.code or (e.data or {}).get("code")) == CODE]
    return found[-1] if found else None


def _numbers(values: Any) -> list[float | None]:
    """A stored list of floats (a non-finite one is stored as a string): None where not a number."""
    out: list[float | None] = []
    for v in values or []:
        out.append(float(v) if isinstance(v, (int, float)) and not isinstance(v, bool) else None)
    return out


def figure(data: Mapping[str, Any]) -> go.Figure:
    """Loss against learning rate (log x): the raw losses faint, the smoothed curve, and vertical lines at the
    suggested optim.lr and at the learning rate the run used."""
    lrs = _numbers(data.get("lrs"))
    fig = go.Figure()
    fig.add_scatter(x=lrs, y=_numbers(data.get("losses")), name="loss", mode="lines", opacity=0.35)
    fig.add_scatter(x=lrs, y=_numbers(data.get("smoothed")), name="smoothed loss", mode="lines")
    for key, label, dash in (("suggested_lr", "suggested", "dash"), ("optim_lr", "this run", "dot")):
        value = data.get(key)
        if isinstance(value, (int, float)) and value > 0:
            fig.add_vline(x=value, line_dash=dash, annotation_text=f"{label} {value:.2g}")
    fig.update_layout(
        title="LR range test: loss by learning rate",
        xaxis={"type": "log", "title": "learning rate"},
        yaxis={"title": "training loss"},
        height=340,
        margin={"l": 10, "r": 10, "t": 50, "b": 10},
    )
    return fig


def summary_line(data: Mapping[str, Any]) -> str:
    """The suggestion in words, with how it was chosen."""
    s, used = data.get("suggested_lr"), data.get("optim_lr")
    steps = len(data.get("lrs") or [])
    if not isinstance(s, (int, float)):
        return f"No learning rate suggested: the loss did not clearly fall over the {steps} steps tried."
    used_text = f"{used:g}" if isinstance(used, (int, float)) else "?"
    text = f"Suggested optim.lr {s:.2g} ({data.get('method', '')}); this run used {used_text}"
    stopped = " · stopped early: the loss blew up" if data.get("stopped") == "diverged" else ""
    return f"{text} · {steps} steps{stopped}."


def show(r: RunRecord) -> None:
    """Under the Run page's charts, for a run whose spec asked for the test (a script's run has no spec: its status
    panel says it had no pre-flight of torchdeck's)."""
    if r.external or not wants_test(r.spec):
        return
    try:
        event = finder_event(queries.events(r.id, limit=FIRST_EVENTS))
    except Exception:  # noqa: BLE001 - a courtesy panel: the event log still has the event
        event = None
    with st.expander("LR range test", expanded=event is not None, icon=":material/query_stats:"):
        if event is None:
            st.caption("The LR range test runs in the pre-flight; its curve appears here once it has finished.")
            return
        data = event.data or {}
        st.plotly_chart(figure(data), key=f"run.lr_finder.{r.id}", config={"displaylogo": False})
        st.caption(f.md_text(summary_line(data)))
