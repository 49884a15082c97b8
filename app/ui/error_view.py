"""Error analysis on the Run page's evaluation tab: per-class precision/recall/F1 (a table and its CSV), the
best epoch's most confident mistakes (a gallery and the most confused pairs), and the weight and gradient
histograms of each layer group over steps (heat maps). Everything a run wrote is shown as text."""

from __future__ import annotations

import io
from collections.abc import Mapping, Sequence
from typing import Any

import pandas as pd
import plotly.graph_objects as go
import streamlit as st

from app.present import text as f
from app.services.artifacts import artifact_problem, read_artifact
from app.ui import queries
from core.names import HIST_BINS, HIST_RANGE, HISTOGRAM_EVENT, MISCLASSIFIED
from core.scores import SCORE_KEYS, scores_from_confusion
from db.types import EventRecord, RunRecord

SHOWN_PX = 96  # each thumbnail of the gallery is drawn this wide


def class_table(data: Mapping[str, Any]) -> pd.DataFrame | None:
    """Per class: support, precision, recall, F1, from the evaluation event (or from its confusion matrix,
    for runs that stored only the matrix); None when neither is there."""
    names = list(data.get("class_names") or [])
    scores = {k: data[k] for k in SCORE_KEYS if k in data}
    if len(scores) < len(SCORE_KEYS) and data.get("confusion"):
        scores = scores_from_confusion(data["confusion"])
    if len(scores) < len(SCORE_KEYS) or not names or any(len(v) != len(names) for v in scores.values()):
        return None
    return pd.DataFrame({"class": [str(n) for n in names], **{k: list(scores[k]) for k in SCORE_KEYS}})


def scores_panel(r: RunRecord, data: Mapping[str, Any]) -> None:
    """The per-class table (class names are cell text, never Markdown) and its CSV download."""
    table = class_table(data)
    if table is None:
        return
    st.markdown("**Per-class precision, recall and F1** (validation)")
    pct = st.column_config.NumberColumn(format="%.1f%%")
    shown = table.assign(**{k: table[k] * 100 for k in ("precision", "recall", "f1")})
    st.dataframe(
        shown,
        hide_index=True,
        width="stretch",
        height=min(38 + 35 * len(table), 420),
        column_config={"precision": pct, "recall": pct, "f1": st.column_config.NumberColumn("F1", format="%.1f%%")},
    )
    st.download_button(
        "Per-class metrics as CSV",
        table.to_csv(index=False).encode(),
        mime="text/csv",
        file_name=f"{r.id}-per-class-epoch{data.get('epoch', 'last')}.csv",
        icon=":material/table_view:",
        key=f"run.class_csv.{r.id}",
    )


def _cells(png: bytes, meta: Mapping[str, Any]) -> list[Any]:
    """The gallery's images, cut out of its PNG grid by the layout in its meta."""
    from PIL import Image

    grid = Image.open(io.BytesIO(png)).convert("RGB")
    cell, cols, pad = int(meta["cell"]), int(meta["cols"]), int(meta.get("pad", 0))
    out = []
    for k in range(len(meta.get("items") or [])):
        x, y = (k % cols) * cell, (k // cols) * cell
        im = grid.crop((x + pad, y + pad, x + cell - pad, y + cell - pad))
        out.append(im.resize((SHOWN_PX, SHOWN_PX), Image.NEAREST))
    return out


def _gallery(r: RunRecord) -> tuple[list[Any], dict] | None:
    arts = [a for a in queries.artifacts(r.id) if a.kind == MISCLASSIFIED]
    if not arts or artifact_problem(arts[-1]) is not None:
        return None
    meta = dict(arts[-1].meta or {})
    try:
        return _cells(read_artifact(arts[-1].id, engine=queries.engine()), meta), meta
    except (LookupError, OSError, KeyError, ValueError):
        return None


def gallery_panel(r: RunRecord) -> None:
    """The best epoch's most confident mistakes, 'true → predicted (confidence)' under each, then the pairs."""
    found = _gallery(r)
    if found is None:
        st.caption("The most confident mistakes appear after the best epoch's validation, when it has any.")
        return
    images, meta = found
    items = meta.get("items") or []
    st.markdown(
        f"**Most confident mistakes** at the best epoch ({f.md_text(meta.get('epoch', '?'))}): "
        f"{len(items)} validation samples"
    )
    captions = [
        f.md_text(f"{i.get('true')} → {i.get('predicted')} ({float(i.get('confidence', 0)):.0%})") for i in items
    ]  # a caption renders Markdown: class names as text
    st.image(images, caption=captions, width=SHOWN_PX)
    pairs = meta.get("top_confusions") or []
    if pairs:
        st.markdown("**Most confused pairs** (validation, best epoch)")
        rows = [[str(t), str(p), int(n)] for t, p, n in pairs]
        st.dataframe(pd.DataFrame(rows, columns=["true", "predicted", "count"]), hide_index=True, width="stretch")


def histogram_events(events: Sequence[EventRecord]) -> list[EventRecord]:
    return [e for e in events if e.kind == HISTOGRAM_EVENT and (e.data or {}).get("weight") is not None]


def _step(e: EventRecord) -> int:
    step = (e.data or {}).get("step")
    return int(step) if isinstance(step, int) else e.id


def histogram_figure(title: str, steps: Sequence[int], columns: Sequence[Sequence[int]], uirevision: str) -> go.Figure:
    """Steps across, log10 |value| bins up, each column the share of the group's values in each bin."""
    lo, hi = HIST_RANGE
    width = (hi - lo) / HIST_BINS
    centers = [round(lo + width * (b + 0.5), 3) for b in range(HIST_BINS)]
    z = [[0.0] * len(steps) for _ in range(HIST_BINS)]
    counts = [[0] * len(steps) for _ in range(HIST_BINS)]
    for j, col in enumerate(columns):
        total = sum(col) or 1
        for b, n in enumerate(col[:HIST_BINS]):
            z[b][j], counts[b][j] = n / total, int(n)
    fig = go.Figure(
        go.Heatmap(
            z=z,
            x=list(steps),
            y=centers,
            customdata=counts,
            colorscale="Viridis",
            zmin=0,
            colorbar={"title": "share"},
            hovertemplate="step %{x}<br>log10 |value| ≈ %{y}<br>%{customdata} values (%{z:.1%})<extra></extra>",
        )
    )
    fig.update_layout(
        title={"text": f.plot_text(title), "font": {"size": 14}},
        height=360,
        uirevision=uirevision,
        margin={"l": 10, "r": 10, "t": 40, "b": 10},
    )
    fig.update_xaxes(title_text="step")
    fig.update_yaxes(title_text="log10 |value|")
    return fig


def histogram_panel(r: RunRecord, events: Sequence[EventRecord]) -> None:
    """Per layer group (picked), the weights' and the gradients' histograms as heat maps over steps."""
    hist = histogram_events(events)
    if not hist:
        st.caption(
            f"Weight and gradient histograms appear every train.diag_every steps "
            f"({HIST_BINS} bins of log10 |value| from {HIST_RANGE[0]:g} to {HIST_RANGE[1]:g})."
        )
        return
    groups = list(dict.fromkeys(g for e in hist for g in (e.data or {}).get("weight", {})))
    st.markdown("**Weight and gradient histograms** per layer group")
    group = st.selectbox(
        "Layer group",
        groups,
        key=f"run.hist_group.{r.id}",
        format_func=str,
        help="Values beyond the range are counted in its first or last bin.",
    )
    left, right = st.columns(2)
    for col, what, label in ((left, "weight", "Weights"), (right, "grad", "Gradients")):
        rows = [(_step(e), e.data[what][group]) for e in hist if group in ((e.data or {}).get(what) or {})]
        if not rows:
            col.caption(f"No {label.lower()} recorded for this group.")
            continue
        fig = histogram_figure(
            f"{label}: {group}", [s for s, _ in rows], [c for _, c in rows], uirevision=f"{r.id}:hist:{what}"
        )
        col.plotly_chart(fig, key=f"run.hist.{what}.{r.id}", config={"displaylogo": False})
