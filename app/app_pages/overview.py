"""Overview: the current project's runs at a glance. Every running and recently finished run of the project
(owner, progress, ETA, worker and device, the objective, a small curve of loss and objective), diagnosis findings
at the top, and the whole queue with each run's position and who can take it (a run of a project the viewer may
not see holds its place there unnamed). Only the live part refreshes
(a fragment, every overview_view.REFRESH_S seconds), in place, whatever the number of runs."""

from __future__ import annotations

import streamlit as st

from app.present import text as f
from app.ui import frame, project_context
from app.ui import overview_view as ov

K = frame.page_state("overview")


def live(window: str, project: str) -> None:
    s = ov.snapshot(ov.WINDOWS[window], project, project_context.visible())
    ov.counts(s, window)
    ov.attention_panel(s)
    ov.running_panel(s)
    ov.queue_panel(s)
    ov.finished_panel(s, window)


def main() -> None:
    st.title("Overview")
    # Streamlit fades a fragment's elements while it reruns: refreshed every few seconds, the tables would
    # spend much of their time faded although nothing in them is out of date.
    st.html("<style>[data-stale='true']{opacity:1 !important;transition:none !important}</style>")
    left, _ = st.columns([1, 3])
    window = left.selectbox(
        "Finished within", list(ov.WINDOWS), index=list(ov.WINDOWS).index(ov.DEFAULT_WINDOW), key=K("window")
    )
    project = project_context.project()
    st.caption(
        f"Everyone's runs in project {f.md_text(project)}, and the whole queue; refreshed every {ov.REFRESH_S:g} s."
    )
    st.fragment(live, run_every=ov.REFRESH_S)(window, project)


main()
