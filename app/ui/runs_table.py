"""The Runs page's tables: one row per run, or grouped (one row per sweep, per seed group, per other run, a selected
row's runs listed under it), and their column settings; the page is app/app_pages/runs.py."""

from __future__ import annotations

import pandas as pd
import streamlit as st

from app.present import external as ext
from app.present import test_scores
from app.present import text as f
from app.services.owners import owner_labels
from app.ui import queries, run_units
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
                "progress": None if r.external else r.progress or 0.0,  # a script says nothing of its progress
                "best": f.best_text(r),
                "test/acc": test_scores.value(r),
                "owner": owners.get(r.owner, r.owner),
                "worker": ext.SOURCE_LABEL if r.external else r.worker_id or "",  # a script's run: no worker
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
    "worker": st.column_config.TextColumn(
        "worker", help="The worker that ran it; `script`: logged by a person's script through the MLflow client"
    ),
    "created": st.column_config.DatetimeColumn("created", format="YYYY-MM-DD HH:mm"),
    "open": st.column_config.LinkColumn("open", display_text="open ↗", width="small"),
}


MEMBERS_SHOWN = 500  # runs listed under a selected sweep or seed group
GROUP_COLUMNS = {
    **COLUMNS,
    "kind": st.column_config.TextColumn("kind", width="small"),
    "size": st.column_config.TextColumn("runs", help="A sweep's trials and runs, a seed group's runs"),
    "best": st.column_config.TextColumn(
        "best",
        help="A run's best monitored metric; a seed group's as mean ± std "
        "(n); a sweep's best completed trial (mean over its seeds)",
    ),
}


def grouped_rows(members: run_units.Members) -> pd.DataFrame:
    sweeps = members.sweeps
    owners = {r.owner for runs in members.runs.values() for r in runs} | {s.owner for s in sweeps.values()}
    labels = owner_labels(owners, engine=queries.engine())
    rows = []
    for u, runs in members.runs.items():
        if u.kind == run_units.SWEEP:
            sweep = sweeps[u.id]  # unit_members left out a sweep that is gone
            rows.append(run_units.sweep_row(sweep, runs, u.runs, labels.get(sweep.owner, sweep.owner)))
        elif u.kind == run_units.GROUP:
            rows.append(run_units.group_row(u.id, runs, u.runs, labels.get(runs[0].owner, runs[0].owner)))
        else:
            row = run_units.run_row(runs[0], labels.get(runs[0].owner, runs[0].owner))
            rows.append({**row, "kind": f"{row['kind']} ({ext.SOURCE_LABEL})"} if runs[0].external else row)
    return pd.DataFrame(rows, columns=run_units.COLUMNS)


def expand(u: run_units.Unit, runs: list[RunRecord], row, key: str) -> None:
    """A selected sweep's or seed group's runs, listed under the table (at most MEMBERS_SHOWN)."""
    with st.expander(
        f"{f.md_text(row['kind'])} {f.md_text(row['name'])}: {len(runs)} run(s)",
        expanded=True,
        icon=":material/unfold_more:",
    ):
        shown = runs[:MEMBERS_SHOWN]
        st.dataframe(
            frame_of(tuple(shown)),
            hide_index=True,
            column_config=COLUMNS,
            width="stretch",
            key=key,
            height=min(38 + 35 * len(shown), 420),
        )
        if len(runs) > len(shown):
            st.caption(f"the first {len(shown)} of {len(runs)} runs; filter by the sweep to page through them all")
