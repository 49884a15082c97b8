"""The Run page's word on the preprocessing a run used: whose it was (the pretrained weights', a checkpoint's or
the dataset's), the resize, the centre crop, the interpolation and the mean/std, and which spec fields replaced
them. Read from the run's `data` event, which carries the data's description as the training core recorded it.
"""

from __future__ import annotations

from typing import Any

import streamlit as st

from app.present import text as f
from app.ui import queries
from core.preprocessing import describe

DATA_EVENT = "data"  # core/recipe.py's event with the loaded data's description (DataInfo)
FIRST_EVENTS = 200  # the data event comes right after the start: never further than this


def recorded(run_id: str) -> dict[str, Any] | None:
    """The preprocessing record of the run's latest start among its first events; None before the data loaded,
    {} for a run from before the record existed."""
    found = None
    for e in queries.events(run_id, after_id=0, limit=FIRST_EVENTS):
        if e.code == DATA_EVENT:
            found = dict((e.data or {}).get("preprocessing") or {})
    return found


def show(r) -> None:
    """One line under a heading; nothing to say before the run has loaded its data."""
    rec = recorded(r.id)
    if rec is None:
        st.caption("Preprocessing: known once the run has loaded its data.")
        return
    st.markdown(f"**Preprocessing** — {f.md_text(describe(rec))}")
