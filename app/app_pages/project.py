"""Project: the current project (the sidebar's switcher chooses it) with its description, its members and their
roles, its share of the queue and of the device time, and its latest runs; and a new project made here, its
maker its maintainer. Its maintainers (and admins) edit the description and the members (app/ui/project_view.py)."""

from __future__ import annotations

import streamlit as st

from app.present import text as f
from app.services import projects
from app.ui import alerts_view, project_context, queries
from app.ui import project_view as pv


def main() -> None:
    if project_context.in_no_project():  # in none yet: only the form that makes one
        st.title("Project")
        pv.create_form()
        return
    name = project_context.project()
    record = projects.get(name, by=project_context.acting(), engine=queries.engine())
    st.title(f"Project {f.md_text(record.name)}")
    st.caption(f"Your role here: **{project_context.role(name)}**")
    pv.description_panel(record)
    counts = projects.counts([name], engine=queries.engine())[name]
    st.caption(
        f"{counts['runs']:,} run(s) · {counts['sweeps']:,} sweep(s) · {counts['datasets']:,} uploaded dataset(s)"
    )
    members, share, activity, rules = st.tabs(
        ["Members", "Queue share", "Recent activity", "Alerts"], key="project.tab"
    )
    with members:
        pv.members_panel(record)
    with share:
        pv.share_panel(name)
    with activity:
        pv.activity_panel(name)
    with rules:
        alerts_view.project_section(name)
    with st.expander("Make a new project", icon=":material/create_new_folder:"):
        pv.create_form()


main()
