"""Workers: who is alive (heartbeat age), their devices and utilisation, what each is running, the queue with
each queued run's position, and the global alert rules."""

from __future__ import annotations

import pandas as pd
import streamlit as st

from app.present import text as f
from app.services import queue_words
from app.services.broker import is_alive
from app.services.owners import owner_labels
from app.ui import alerts_view, frame, overview_view, queries
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


def workers_frame(workers: list[WorkerRecord]) -> pd.DataFrame:
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
                "current run": f"run?id={w.current_run_id}" if w.current_run_id else None,
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
            workers_frame(workers),
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
    owners = owner_labels((r.owner for r in wait.runs), engine=queries.engine())
    table, _ = overview_view.queue_table(queries.engine(), wait, owners)  # (the Overview's table: one order)
    if wait.total > len(wait.runs):
        st.caption(f"The first {len(wait.runs)} of {wait.total} waiting runs, by their place in their queues.")
    st.dataframe(
        table,
        hide_index=True,
        width="stretch",
        column_config={"open": st.column_config.LinkColumn("open", display_text="open ↗")},
    )


def main() -> None:
    st.title("Workers")
    live()
    alerts_view.global_section()  # the global alert rules: listed for everyone, managed by admins


main()
