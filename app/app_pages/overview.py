"""Overview: the team's runs at a glance. Every running and recently finished run of everyone (owner,
progress, ETA, worker and device, the objective, a small curve of loss and objective), diagnosis findings
at the top, and the queue with each run's position and who can take it. Only the live part refreshes
(a fragment, every overview_view.REFRESH_S seconds), in place, whatever the number of runs."""

from __future__ import annotations

import streamlit as st

from app.ui import frame
from app.ui import overview_view as ov

K = frame.page_state("overview")


def live(window: str) -> None:
    s = ov.snapshot(ov.WINDOWS[window])
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
    st.caption(f"Everyone's runs, refreshed every {ov.REFRESH_S:g} s.")
    st.fragment(live, run_every=ov.REFRESH_S)(window)


main()
