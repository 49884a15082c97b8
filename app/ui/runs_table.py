"""The Runs page's table of runs (one row per run) and its column settings; the page is app/app_pages/runs.py."""

from __future__ import annotations

import pandas as pd
import streamlit as st

from app.present import test_scores
from app.present import text as f
from app.services.owners import owner_labels
from app.ui import queries
from db.types import RunRecord

TABLE_COLUMNS = ["name", "status", "progress", "best", "test/acc", "owner", "worker", "duration", "tags", "created"]
TABLE_COLUMNS += ["open", "id"]


def frame_of(runs: tuple[RunRecord, ...]) -> pd.DataFrame:
    """One row per run: its name, status, progress, best monitored metric, held-out test accuracy, owner, …"""
    owners = owner_labels((r.owner for r in runs), engine=queries.engine())
    return pd.DataFrame(
        [
            {
                "name": r.name,
                "status": f.status_label(r.status),
                "progress": r.progress or 0.0,
                "best": f.best_text(r),
                "test/acc": test_scores.value(r),
                "owner": owners.get(r.owner, r.owner),
                "worker": r.worker_id or "",
                "duration": f.seconds(f.duration_s(r)),
                "tags": list(r.tags),
                "created": r.created_at,
                "open": f"run?id={r.id}",
                "id": r.id,
            }
            for r in runs
        ],
        columns=TABLE_COLUMNS,
    )


COLUMNS = {
    "progress": st.column_config.ProgressColumn("progress", min_value=0.0, max_value=1.0, format="percent"),
    "test/acc": st.column_config.NumberColumn(
        "test/acc", format="%.4f", help="Accuracy on the held-out test split, scored once at the end of the run"
    ),
    "tags": st.column_config.ListColumn("tags"),
    "created": st.column_config.DatetimeColumn("created", format="YYYY-MM-DD HH:mm"),
    "open": st.column_config.LinkColumn("open", display_text="open ↗", width="small"),
}
