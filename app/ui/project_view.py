"""The Project page's panels (app/app_pages/project.py): the project's description, its members and their roles
(managed by its maintainers and admins), its share of the queue and of the devices, its recent runs, and the form
that makes a new project. The rules are app/services/projects.py's; here, what they would refuse is not offered."""

from __future__ import annotations

from datetime import datetime, timedelta

import pandas as pd
import streamlit as st
from sqlalchemy import Engine

from app import auth
from app.present import text as f
from app.services import projects
from app.services.owners import owner_labels
from app.ui import frame, project_context, queries
from core.names import CLAIMABLE_STATUSES, FINISHED_STATUSES, queue_gpus, queue_of
from db import repo
from db.projects import DESCRIPTION_LEN
from db.types import PROJECT_ROLES, RunRecord, utcnow

K = frame.page_state("project")
SHARE_WINDOW_H = 24  # the queue share's device time: over the last this many hours
SHARE_RUNS = 1000  # runs read per status for the queue share (the counts say when there were more)
RECENT_RUNS = 15
ROLE_HELP = (
    "A viewer sees the project's runs, sweeps, datasets and models; a member also launches runs and sweeps, "
    "uploads datasets, registers models, and cancels and deletes their own; a maintainer also acts on anyone's "
    "runs in the project and manages its members."
)


def may_maintain(name: str) -> bool:
    """Maintainers of the project and admins (local mode: its one person) edit it and its members."""
    return projects.role(project_context.acting(), name) in ("maintainer", "admin")


def description_panel(record: projects.ProjectRecord) -> None:
    """The description as its text (never Markdown), and for a maintainer the form that changes it."""
    if record.description:
        st.markdown(f.md_text(record.description, multiline=True))
    else:
        st.caption("No description yet.")
    made = owner_labels([record.created_by], queries.engine()).get(record.created_by, record.created_by)
    st.caption(f"created {record.created_at:%Y-%m-%d} by {f.md_text(made)}")
    if not may_maintain(record.name):
        return
    with st.popover("Edit the description", icon=":material/edit:"):
        with st.form(K(f"describe.{record.name}"), border=False):
            text = st.text_area(
                "Description", value=record.description, max_chars=DESCRIPTION_LEN, key=K(f"text.{record.name}")
            )
            saved = st.form_submit_button("Save", type="primary", icon=":material/save:")
    if saved:
        try:
            projects.update(record.name, by=project_context.acting(), description=text, engine=queries.engine())
        except (auth.PermissionDenied, ValueError) as e:
            st.error(f"Description not saved: {f.md_text(e)}", icon=":material/error:")
            return
        st.rerun()


def members_frame(members: list[projects.MemberRecord]) -> pd.DataFrame:
    labels = owner_labels([m.person for m in members] + [m.added_by for m in members], queries.engine())
    rows = [
        {
            "person": labels.get(m.person, m.person),
            "role": m.role,
            "since": m.added_at,
            "added by": labels.get(m.added_by, m.added_by),
        }
        for m in members
    ]
    return pd.DataFrame(rows, columns=["person", "role", "since", "added by"])


def members_panel(record: projects.ProjectRecord) -> None:
    """Who is in the project with which role; a maintainer adds people, changes their role, takes them off."""
    user = project_context.acting()
    members = projects.members(record.name, by=user, engine=queries.engine())
    if record.open_role:
        st.caption(
            f"Open to every member of the dashboard as **{record.open_role}**; the people listed here have the "
            "higher of that and their listed role."
        )
    if members:
        since = st.column_config.DatetimeColumn("since", format="YYYY-MM-DD HH:mm")
        st.dataframe(members_frame(members), hide_index=True, width="stretch", column_config={"since": since})
    else:
        st.caption("Nobody is listed.")
    if may_maintain(record.name):
        add_form(record.name)
        if members:
            change_form(record.name, members)


def add_form(name: str) -> None:
    with st.form(K(f"add.{name}"), border=True):
        st.markdown("**Add a person**")
        a, b, c = st.columns([3, 1.2, 1], vertical_alignment="bottom")
        person = a.text_input(
            "Account key or verified e-mail",
            key=K(f"person.{name}"),
            placeholder="ana@example.com or https://sso.example.com/realms/lab#1234",
            help="The account's key is shown to someone signed in who is not yet a member; a verified e-mail "
            "matches whoever signs in with it.",
        )
        role = b.selectbox("Role", PROJECT_ROLES, index=1, key=K(f"role.{name}"), help=ROLE_HELP)
        added = c.form_submit_button("Add", icon=":material/person_add:", width="stretch")
    if added:
        apply(lambda: projects.set_member(name, person, role, by=project_context.acting(), engine=queries.engine()))


def change_form(name: str, members: list[projects.MemberRecord]) -> None:
    labels = owner_labels([m.person for m in members], queries.engine())
    with st.form(K(f"change.{name}"), border=True):
        st.markdown("**Change a role, or take someone off the project**")
        a, b, c, d = st.columns([3, 1.2, 1, 1], vertical_alignment="bottom")
        person = a.selectbox(
            "Person", [m.person for m in members], key=K(f"who.{name}"), format_func=lambda p: labels.get(p, p)
        )
        role = b.selectbox("New role", PROJECT_ROLES, key=K(f"new_role.{name}"), help=ROLE_HELP)
        changed = c.form_submit_button("Change role", icon=":material/manage_accounts:", width="stretch")
        removed = d.form_submit_button("Remove", icon=":material/person_remove:", width="stretch")
    by = project_context.acting()
    if changed:
        apply(lambda: projects.set_member(name, person, role, by=by, engine=queries.engine()))
    elif removed:
        apply(lambda: projects.remove_member(name, person, by=by, engine=queries.engine()))


def apply(change) -> None:
    """Make a change of the members; what was refused is said, otherwise the page shows the new list."""
    try:
        change()
    except (auth.PermissionDenied, ValueError, LookupError) as e:
        st.error(f"Not changed: {f.md_text(e)}", icon=":material/error:")
        return
    queries.clear()
    st.rerun()


def _device_hours(r: RunRecord, since: datetime, now: datetime) -> float:
    """The run's device time within [since, now], in hours: its queue's GPUs (a CPU run counts one)."""
    if r.started_at is None:
        return 0.0
    end = r.finished_at or (now if r.status == "running" else r.heartbeat_at) or r.started_at
    seconds = (min(end, now) - max(r.started_at, since)).total_seconds()
    return max(seconds, 0.0) * max(queue_gpus(queue_of(r.spec)) or 1, 1) / 3600


@queries.shared(ttl=10)
def share(engine: Engine, name: str) -> tuple[pd.DataFrame, dict[str, int]]:
    """Per owner in the project: runs waiting, running and finished in the last SHARE_WINDOW_H hours, and their
    device hours in that time (and what share of the project's); with the project's totals."""
    now = utcnow()
    since = now - timedelta(hours=SHARE_WINDOW_H)
    # The queue's runs only: a script's run (app/tracking/) takes no place in the queue and none of its devices.
    ours = {"project": name, "source": "torchdeck", "limit": SHARE_RUNS}
    waiting = repo.list_runs(engine, status=list(CLAIMABLE_STATUSES), **ours)
    running = repo.list_runs(engine, status="running", **ours)
    done = repo.list_runs(engine, status=list(FINISHED_STATUSES), sort="finished_at", **ours)
    recent = [r for r in done.runs if r.finished_at is not None and r.finished_at >= since]
    rows: dict[str, dict] = {}
    for kind, runs in (("waiting", waiting.runs), ("running", running.runs), ("finished", recent)):
        for r in runs:
            row = rows.setdefault(r.owner, {"waiting": 0, "running": 0, "finished": 0, "device hours": 0.0})
            row[kind] += 1
            row["device hours"] += _device_hours(r, since, now) if kind != "waiting" else 0.0
    labels = owner_labels(rows, engine)
    total_h = sum(row["device hours"] for row in rows.values())
    table = pd.DataFrame(
        [
            {"person": labels.get(o, o), **row, "share": row["device hours"] / total_h if total_h else 0.0}
            for o, row in sorted(rows.items(), key=lambda kv: (-kv[1]["device hours"], -kv[1]["waiting"], kv[0]))
        ],
        columns=["person", "waiting", "running", "finished", "device hours", "share"],
    )
    return table, {"waiting": waiting.total, "running": running.total, "finished": len(recent)}


def share_panel(name: str) -> None:
    """The project's runs in the queue and on the workers, and who used its device time lately."""
    table, totals = share(name)
    a, b, c = st.columns(3)
    a.metric("Waiting", totals["waiting"], help="Queued runs (and lost ones waiting to resume) of the project.")
    b.metric("Running", totals["running"])
    c.metric(f"Finished in {SHARE_WINDOW_H} h", totals["finished"])
    if table.empty:
        st.caption(f"Nothing queued, running or finished in the last {SHARE_WINDOW_H} hours.")
        return
    st.dataframe(
        table,
        hide_index=True,
        width="stretch",
        column_config={
            "device hours": st.column_config.NumberColumn(
                f"device hours ({SHARE_WINDOW_H} h)", format="%.2f", help="GPU hours (a CPU run counts one device)."
            ),
            "share": st.column_config.ProgressColumn("share", min_value=0.0, max_value=1.0, format="percent"),
        },
    )
    if max(totals["waiting"], totals["running"]) > SHARE_RUNS:
        st.caption(f"Counted over the first {SHARE_RUNS} runs of each status.")


def activity_panel(name: str) -> None:
    """The project's latest runs, newest first, each linked to its page."""
    runs = queries.runs_page(limit=RECENT_RUNS, project=name).runs
    if not runs:
        st.caption("No runs yet.")
        return
    labels = owner_labels((r.owner for r in runs), queries.engine())
    table = pd.DataFrame(
        [
            {
                "run": r.name,
                "owner": labels.get(r.owner, r.owner),
                "status": f.status_label(r.status),
                "created": r.created_at,
                "open": f"run?id={r.id}",
            }
            for r in runs
        ]
    )
    st.dataframe(
        table,
        hide_index=True,
        width="stretch",
        column_config={
            "created": st.column_config.DatetimeColumn("created", format="YYYY-MM-DD HH:mm"),
            "open": st.column_config.LinkColumn("open", display_text="open ↗", width="small"),
        },
    )
    st.page_link(frame.RUNS, label="All the project's runs", icon=":material/table_rows:")


def create_form() -> None:
    """A new project (anyone who uses the dashboard may make one): its maker becomes its maintainer, and it
    becomes the current project."""
    with st.form(K("create"), border=True):
        st.markdown("**New project**")
        name = st.text_input(
            "Name",
            key=K("new_name"),
            max_chars=40,
            placeholder="e.g. vision-lab",
            help="Lower-case letters, digits and dashes: it is part of the pages' addresses.",
        )
        description = st.text_area("Description", key=K("new_description"), max_chars=DESCRIPTION_LEN)
        made = st.form_submit_button("Create project", icon=":material/create_new_folder:")
    if not made:
        return
    try:
        record = projects.create(
            name.strip(), by=project_context.acting(), description=description.strip(), engine=queries.engine()
        )
    except (auth.PermissionDenied, ValueError) as e:
        st.error(f"Project not created: {f.md_text(e)}", icon=":material/error:")
        return
    queries.clear()
    project_context.switch_to(record.name)
    st.rerun()
