"""The Run page's test-scores block: the held-out test split's scores beside the validation split's, where the split
came from and with which weights, and, opened, its per-class precision/recall/F1 and confusion matrix."""

from __future__ import annotations

import pandas as pd
import streamlit as st

from app.present import figures
from app.present import test_scores as ts
from app.present import text as f
from app.ui import external_view, queries
from core.names import SUCCESS_STATUSES, VAL_ACC
from db.types import RunRecord

LABELS = {
    "test/acc": "test accuracy",
    "test/loss": "test loss",
    "test/acc_top5": "test top-5",
    "test/f1_macro": "test F1",
}


def show(r: RunRecord) -> None:
    """The block, on a run that ended; nothing while it runs (the test split is scored only at its end)."""
    if not r.finished:
        return
    if r.external:  # no test split of torchdeck's: whatever it logged is on the charts
        external_view.not_applicable("test")
        return
    scores = ts.scores(r)
    if not scores:
        if r.status in SUCCESS_STATUSES:
            st.caption(ts.no_test_text(r.spec))
        return
    event = queries.test_event(r.id)
    data = dict(event.data or {}) if event is not None else {}
    with st.container(border=True):
        st.markdown("**Held-out test split**")
        cols = st.columns(len(scores) + 1)
        for col, (key, v) in zip(cols, scores.items(), strict=False):
            col.metric(LABELS.get(key, key), f"{v:.4f}")
        val = r.metrics.get(VAL_ACC)
        if val is not None and val.max_value is not None:
            cols[-1].metric("best val accuracy", f"{val.max_value:.4f}", help="The validation split's best epoch.")
        st.caption(f.md_text(" · ".join(t for t in (ts.source_text(data), ts.NEVER_SELECTED) if t)))
        if data.get("class_names"):
            with st.expander("Per class and confusion (test split)", icon=":material/grid_on:"):
                _per_class(r, data)


def _per_class(r: RunRecord, data: dict) -> None:
    left, right = st.columns(2)
    frame = ts.class_frame(data)
    number = st.column_config.NumberColumn(format="%.4f")
    left.dataframe(
        frame, hide_index=True, column_config={k: number for k in ("precision", "recall", "f1")}, width="stretch"
    )
    if data.get("confusion"):
        right.plotly_chart(
            figures.confusion_figure(data["confusion"], data["class_names"], uirevision=f"{r.id}:test-cm"),
            key=f"run.test_cm.{r.id}",
            config={"displaylogo": False},
        )
    elif data.get("top_confusions"):
        right.dataframe(pd.DataFrame(data["top_confusions"], columns=["true", "predicted", "count"]), hide_index=True)
