"""A queued run's place in its queue on the Run page: its position, why, about when it starts, and its priority,
which its owner (lower or back to normal), a maintainer of its project or an admin (any) may change; a running
sweep's priority on its page."""

from __future__ import annotations

import streamlit as st

from app import auth
from app.present import text as f
from app.services import queue_place
from app.services.runs import set_priority
from app.services.sweeps import set_sweep_priority
from app.ui import frame, project_context, queries
from core.names import PRIORITIES
from db.errors import RunNotFound, SweepNotFound
from db.types import RunRecord, SweepRecord

K = frame.page_state("run")


def place_panel(r: RunRecord) -> None:
    p = queue_place.place(r, queries.engine())
    if p is None:  # (taken since the page read it)
        return
    eta = p.eta_s
    when = (
        f"starts in about {f.seconds(eta)}"
        if eta is not None
        else "no estimate of its start: "
        + ("no live worker takes this queue" if p.workers < 1 else "no run of this queue has completed yet")
    )
    words = f.md_text(queue_place.why(p.entry, "its owner"))
    st.caption(
        f"Position **{p.entry.position}** of {p.queued} in queue {f.code_span(p.queue)} · {words} · {when} "
        f"(a worker takes the highest priority first, then the person with the least recent GPU time, then the "
        "oldest run)"
    )
    user = project_context.acting()
    if auth.can_modify(user, r):
        priority_control(r, user)


def priority_control(r: RunRecord, user: auth.User) -> None:
    """The run's priority: its owner may choose low or normal, a maintainer of its project or an admin any (the
    service refuses the rest)."""
    current = queue_place.PRIORITY_NAMES.get(r.priority, "normal")
    admin = auth.has_role(user, r.project, "maintainer")
    options = list(PRIORITIES) if admin or current == "high" else ["low", "normal"]
    choice = st.selectbox(
        "Priority",
        options,
        index=options.index(current),
        key=K(f"priority.{r.id}"),
        help="Its place in the queue: a worker takes high before normal before low. "
        + ("" if admin else "Only a maintainer of the project or an admin may raise a run to high."),
    )
    if choice == current:
        return
    try:
        set_priority(r.id, choice, engine=queries.engine(), by=user)
    except RunNotFound:
        st.error("This run was deleted.", icon=":material/error:")
    except (auth.PermissionDenied, ValueError) as e:
        st.error(f"Priority not changed: {f.md_text(e)}", icon=":material/error:")
    else:
        queries.clear()
        st.rerun()


def sweep_priority_control(sweep: SweepRecord) -> None:
    """A running sweep's priority, for its owner (low or normal), a maintainer of its project or an admin (any): its
    queued trials move, and the trials it queues later take it."""
    user = project_context.acting()
    if sweep.finished or not auth.can_modify(user, sweep):
        return
    current = queue_place.PRIORITY_NAMES.get(sweep.priority, "normal")
    admin = auth.has_role(user, sweep.project, "maintainer")
    options = list(PRIORITIES) if admin or current == "high" else ["low", "normal"]
    choice = st.selectbox(
        "Priority of its trials",
        options,
        index=options.index(current),
        key=f"sweep.priority.{sweep.id}",
        help="Their place in the queue: a worker takes high before normal before low, then the person with the "
        "least recent GPU time. "
        + ("" if admin else "Only a maintainer of the project or an admin may raise a sweep to high."),
    )
    if choice == current:
        return
    try:
        moved = set_sweep_priority(sweep.id, choice, by=user, engine=queries.engine())
    except SweepNotFound:
        st.error("This sweep was deleted.", icon=":material/error:")
    except (auth.PermissionDenied, ValueError) as e:
        st.error(f"Priority not changed: {f.md_text(e)}", icon=":material/error:")
    else:
        queries.clear()
        st.toast(f"{moved} queued trial run(s) moved to {choice} priority, and the trials to come")
        st.rerun()
