"""The current project of every page, and who is acting with their roles (app/ui/gate.py looks them up).

Every page lists the current project's runs, sweeps, datasets and models. The project is in every page's URL
(`?project=<name>`), so that a link opens the same project's view; between pages (whose links leave the
parameter out) the session remembers it; without either it is the user's first readable project, the default
project when they can read it. A name the user may not read is answered exactly like one that does not exist, so
that nobody learns which private projects there are. A page that opens one item by id (a run, a sweep, an
artifact) switches to the item's project once the user may read it, so that a shared link works.

Local mode has every project (its one person is an admin) and shows the sidebar's switcher only once there is
more than one; team mode always shows it."""

from __future__ import annotations

import streamlit as st

from app import auth
from app.present import text as f
from app.services import projects
from app.ui import queries
from db.types import DEFAULT_PROJECT

PARAM = "project"  # the URL's query parameter
CURRENT = "project.current"  # session state: the current project's name
NAMES = "project.names"  # session state: the names of the projects the user may read, by name
SWITCH = "project.switch"  # the sidebar switcher's key


def acting() -> auth.User | None:
    """Who is acting, with their role in every project as the gate looked them up at this script run (auth.current_user;
    local mode: the local user, an admin)."""
    return auth.current_user()


def not_found(name: str) -> str:
    """The same words for a project that does not exist and for one the user may not read."""
    return f"Project {f.md_text(repr(name[:80]))} not found: choose one of your projects in the sidebar."


def resolve(user: auth.User | None) -> str | None:
    """The current project for this script run, also put in the URL; None, after saying why, when the URL names a
    project the user may not read (or none that exists), or when they may read none at all."""
    names = [p.name for p in projects.readable(user, queries.engine())]
    st.session_state[NAMES] = names
    wanted = st.query_params.get(PARAM)
    kept = st.session_state.get(CURRENT)
    fallback = kept if kept in names else DEFAULT_PROJECT if DEFAULT_PROJECT in names else next(iter(names), None)
    if wanted and wanted not in names:
        st.error(not_found(wanted), icon=":material/error:")
        if fallback is not None:
            st.button(
                f"Open project {fallback}",
                icon=":material/folder:",
                key="project.open",
                on_click=_open,
                args=(fallback,),
            )
        return None
    current = wanted or fallback
    if current is None:
        st.info(
            "You are in no project yet: ask a maintainer of one to add you, or create your own on the Project page.",
            icon=":material/folder_off:",
        )
        return None
    st.session_state[CURRENT] = current
    if st.query_params.get(PARAM) != current:
        st.query_params[PARAM] = current
    return current


def in_no_project() -> bool:
    """The user may read no project at all (team mode, every project private to others)."""
    return not st.session_state.get(NAMES)


def project() -> str:
    """The current project (app/main.py resolved it before the page ran)."""
    return st.session_state.get(CURRENT) or DEFAULT_PROJECT


def readable_names() -> list[str]:
    """The projects the user may read, by name."""
    return list(st.session_state.get(NAMES) or [])


def only_project() -> bool:
    """Local mode with one project: everything in the database is the current project's."""
    return not auth.team_mode() and len(readable_names()) == 1


def visible() -> frozenset[str] | None:
    """The projects whose runs the user may see (None: every project, for an admin and in local mode): what the
    Overview and the Workers page name in the queue."""
    user = acting()
    if not auth.team_mode() or (user is not None and user.is_admin):
        return None
    return frozenset(readable_names())


def may_read(name: str) -> bool:
    """May the acting user see this project's runs, sweeps, datasets and models?"""
    return not auth.team_mode() or auth.can_read(acting(), name)


def may_contribute(name: str | None = None) -> bool:
    """May the acting user launch runs and sweeps, upload and register in this project (default: the current)?"""
    return not auth.team_mode() or auth.can_contribute(acting(), name or project())


def role(name: str | None = None) -> str | None:
    """The acting user's role in the project (default: the current): admin, maintainer, member, viewer or None."""
    return projects.role(acting(), name or project())


def follow(name: str) -> None:
    """A page opened an item of project `name`, which the user may read: it becomes the current project."""
    st.session_state[CURRENT] = name
    if st.query_params.get(PARAM) != name:
        st.query_params[PARAM] = name


def switch_to(name: str) -> None:
    """Make `name` the current project (after creating it), with the URL saying so."""
    st.session_state[CURRENT] = name
    st.session_state[NAMES] = sorted({*readable_names(), name})
    st.query_params[PARAM] = name


def _open(name: str) -> None:
    """The project `name`'s fresh view of the same page (an item's id, a filter, a comparison of another project's
    runs mean nothing there)."""
    st.session_state[CURRENT] = name
    st.query_params.clear()
    st.query_params[PARAM] = name


def _switched() -> None:
    _open(st.session_state[SWITCH])


def switcher(container) -> None:
    """The sidebar's project switcher (in `container`): the projects the user may read. Local mode shows it only
    once there is more than one project."""
    names = readable_names()
    if not names or (not auth.team_mode() and len(names) < 2):
        return
    current = st.session_state.get(CURRENT)
    if current in names:
        st.session_state[SWITCH] = current
    elif st.session_state.get(SWITCH) not in names:
        st.session_state.pop(SWITCH, None)
    container.selectbox(
        "Project",
        names,
        key=SWITCH,
        on_change=_switched,
        help="Every page lists this project's runs, sweeps, datasets and models; the Project page says who is in it.",
    )
