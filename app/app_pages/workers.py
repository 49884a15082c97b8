"""Workers: who is alive (heartbeat age), their devices and utilisation, what each is running, the queue with
each queued run's position, and the global alert rules. The workers and the queue are every project's: a run of a
project the viewer may not see is listed unnamed and unlinked."""

from __future__ import annotations

import pandas as pd
import streamlit as st

from app.present import text as f
from app.services import queue_words
from app.services.broker import is_alive
from app.services.owners import owner_labels
from app.ui import alerts_view, frame, overview_view, project_context, queries
from db.types import WorkerRecord

K = frame.page_state("workers")


def devices_text(w: WorkerRecord) -> str:
    out = []
    for d in w.devices:
        if d.get("kind") == "gpu":
            util = f" {d['util']:.0f}%" if isinstance(d.get("util"), (int, float)) else ""
            mem = f" {d['mem_mb']:,.0f} MB" if isinstance(d.get("mem_mb"), (int, float)) else ""
            out.append(f"GPU {d.get('index', '?')}{util}{mem}")
        else:
            out.append(f"CPU × {d.get('cores', '?')}")
    return ", ".join(out) or "–"


def workers_frame(workers: list[WorkerRecord], hidden: set[str] | frozenset[str] = frozenset()) -> pd.DataFrame:
    """One row per worker; the run it runs linked, unless it is one of `hidden` (of a project the viewer may not
    see: the queue's "who can take it" still says the worker is busy)."""
    rows = []
    now = f.now()
    for w in workers:
        age = f.age_s(w.heartbeat_at)
        rows.append(
            {
                "state": "alive" if is_alive(w, now) else "silent",
                "worker": w.id,  # doctor's rule
                "host": w.hostname,
                "takes": queue_words.takes(w.queues, w.devices),  # doctor's words too
                "queues": ", ".join(w.queues),
                "devices": devices_text(w),
                "heartbeat age": f.seconds(age),
                "current run": f"run?id={run}" if (run := w.current_run_id) and run not in hidden else None,
                "up since": w.started_at,
            }
        )
    return pd.DataFrame(rows)


@st.fragment(run_every=3.0)
def live() -> None:
    workers = queries.workers()
    if not workers:
        st.info(
            "No worker has registered yet. Start one with `torchdeck worker` (or `make up`, which starts one).",
            icon=":material/info:",
        )
    else:
        st.dataframe(
            workers_frame(workers, hidden_runs([w.current_run_id for w in workers if w.current_run_id])),
            hide_index=True,
            width="stretch",
            placeholder=f.EMPTY,
            column_config={
                "current run": st.column_config.LinkColumn("current run", display_text=r"run\?id=(.*)"),
                "up since": st.column_config.DatetimeColumn("up since", format="YYYY-MM-DD HH:mm"),
            },
        )
    st.subheader("Queue")
    wait = overview_view.waiting(queries.engine(), limit=overview_view.MAX_QUEUED)
    if not wait.runs:
        st.caption("The queue is empty.")
        return
    visible = project_context.visible()
    owners = owner_labels((r.owner for r in wait.runs if visible is None or r.project in visible), queries.engine())
    # (the Overview's table: one order, every project's runs; those of projects the viewer may not see unnamed)
    table, _ = overview_view.queue_table(queries.engine(), wait, owners, visible)
    if wait.total > len(wait.runs):
        st.caption(f"The first {len(wait.runs)} of {wait.total} waiting runs, by their place in their queues.")
    st.dataframe(
        table,
        hide_index=True,
        width="stretch",
        column_config={"open": st.column_config.LinkColumn("open", display_text="open ↗")},
    )


def hidden_runs(run_ids: list[str]) -> set[str]:
    """Of these runs, those of a project the viewer may not see."""
    visible = project_context.visible()
    if visible is None or not run_ids:
        return set()
    found = queries.runs_by_id(run_ids)
    return {i for i in run_ids if i not in found or found[i].project not in visible}


def main() -> None:
    st.title("Workers")
    live()
    alerts_view.global_section()  # the global alert rules: listed for everyone, managed by admins


main()
