"""The frame around every page: where the data lives, how many runs are active, and a refusal to
show anything on a database whose schema this code does not know (with the command to fix it)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import streamlit as st
from streamlit.delta_generator import DeltaGenerator

from app.present.text import STATUS_ICON, code_span, md_text, status_label
from app.services.broker import broker_url, engine_for
from app.ui import alerts_view, project_context, queries
from core.names import CLAIMABLE_STATUSES, FINISHED_STATUSES
from core.redact import redact
from db.migrate import check_schema
from db.repo import FollowedRun, SchemaOutOfDate, followed
from db.types import utcnow


@dataclass(frozen=True)
class PageInfo:
    """One page of the dashboard, for the navigation (app/main.py) and for st.switch_page / st.page_link."""

    path: str  # its file, relative to app/main.py
    title: str
    icon: str
    url_path: str
    section: str
    default: bool = False
    hidden: bool = False  # reached by link only: not listed in the navigation


# Every page, in the navigation's order: its file is named here and nowhere else.
PAGES = (
    PageInfo("app_pages/overview.py", "Overview", ":material/dashboard:", "overview", "Experiments"),
    PageInfo("app_pages/runs.py", "Runs", ":material/table_rows:", "runs", "Experiments", default=True),
    PageInfo("app_pages/new_run.py", "New run", ":material/add_circle:", "new", "Experiments"),
    PageInfo("app_pages/run.py", "Run", ":material/monitoring:", "run", "Experiments"),
    PageInfo("app_pages/compare.py", "Compare", ":material/compare_arrows:", "compare", "Experiments"),
    PageInfo("app_pages/sweep.py", "Sweeps", ":material/tune:", "sweep", "Experiments"),
    PageInfo("app_pages/models.py", "Models", ":material/deployed_code:", "models", "Experiments"),
    # An artifact's download (and shareable link): opened from the Run page's artifacts, never on its own.
    PageInfo("app_pages/artifact.py", "Artifact", ":material/download:", "artifact", "Experiments", hidden=True),
    PageInfo("app_pages/workers.py", "Workers", ":material/memory:", "workers", "Resources"),
    PageInfo("app_pages/datasets.py", "Datasets", ":material/folder_zip:", "datasets", "Resources"),
    PageInfo("app_pages/project.py", "Project", ":material/group_work:", "project", "Resources"),
    PageInfo("app_pages/tokens.py", "API tokens", ":material/key:", "tokens", "Resources"),
)
OVERVIEW, RUNS, NEW, RUN, COMPARE, SWEEP, MODELS, ARTIFACT, WORKERS, DATASETS, PROJECT, TOKENS = (p.path for p in PAGES)
PROJECT_URL = "project"  # the Project page's url_path: the one page shown to someone in no project yet


def navigation(root: Path) -> dict[str, list]:
    """The pages by section, as st.navigation takes them (`root`: the folder of app/main.py)."""
    sections: dict[str, list] = {}
    for p in PAGES:
        sections.setdefault(p.section, []).append(
            st.Page(
                root / p.path,
                title=p.title,
                icon=p.icon,
                url_path=p.url_path,
                default=p.default,
                visibility="hidden" if p.hidden else "visible",
            )
        )
    return sections


@st.cache_data(ttl=30, show_spinner=False)
def _schema_problem(url: str) -> str | None:
    try:
        check_schema(engine_for(url))
    except SchemaOutOfDate as e:
        return str(e)
    except Exception as e:  # noqa: BLE001 - an unreachable database is shown, not raised
        return f"cannot open the database: {e}"
    return None


def schema_ok() -> bool:
    problem = _schema_problem(queries.db_url())
    if problem:
        st.error(problem, icon=":material/database:")
        st.code("torchdeck db upgrade", language="bash")
        return False
    return True


@st.cache_data(ttl=3, show_spinner=False)
def _active_counts(url: str, project: str) -> tuple[int, int]:
    from db.repo import list_runs

    e = engine_for(url)
    running = list_runs(e, status="running", project=project, limit=1).total
    return running, list_runs(e, status=list(CLAIMABLE_STATUSES), project=project, source="torchdeck", limit=1).total


def sidebar(project: str | None) -> DeltaGenerator:
    """The sidebar: the current project's active runs, where the data lives, the followed runs and the alerts.
    Returns the place of the project switcher, drawn after the page (project_switcher): a page that opens a run
    of another project switches to it first."""
    with st.sidebar:
        st.markdown("### :material/local_fire_department: torchdeck")
        slot = st.container()
        if _schema_problem(queries.db_url()) is None and project is not None:
            running, queued = _active_counts(queries.db_url(), project)
            where = "" if project_context.only_project() else f" in {md_text(project)}"
            st.caption(f"{running} running · {queued} queued{where}")
        url = queries.db_url()
        st.caption(
            f"database: {code_span(redact(url.split('///')[-1] if url.startswith('sqlite') else url.split('@')[-1]))}"
        )
        st.caption(f"broker: {code_span(redact(broker_url().split('@')[-1]))}")
        if _schema_problem(queries.db_url()) is None and followed_runs():
            st.fragment(_follow_panel, run_every=FOLLOW_EVERY_S)()
        st.session_state.setdefault(FOLLOW_SINCE, utcnow())  # this session hears of what happens from now on
        watched = project_context.acting() is not None and alerts_view.watching(queries.db_url())
        if _schema_problem(queries.db_url()) is None and watched:
            st.fragment(_alert_panel, run_every=FOLLOW_EVERY_S)()
    return slot


def project_switcher(slot: DeltaGenerator) -> None:
    """The project switcher at the top of the sidebar (app/ui/project_context.py), once the page has run."""
    project_context.switcher(slot)


# Followed runs: the sidebar polls them this often (seconds) and tells, once, when one ends.
FOLLOW_EVERY_S = max(queries.REFRESH_S, 2.0)
FOLLOW_SEEN = "follow.seen"  # session state: run id → the status this session last saw
FOLLOW_SINCE = "follow.since"  # session state: when this session started watching
FOLLOW_SHOWN = 8  # followed runs listed in the sidebar; the others are counted


def followed_runs() -> list[FollowedRun]:
    """The runs the acting person follows and may still see (nobody signed in, or an unreadable database: none):
    someone taken off a project no longer hears of its runs."""
    user = project_context.acting()
    if user is None:
        return []
    try:
        rows = followed(queries.engine(), user.id)
        found = queries.runs_by_id([row.run_id for row in rows]) if rows else {}
    except Exception:  # noqa: BLE001 - a database hiccup must not break every page's sidebar
        return []
    return [row for row in rows if row.run_id in found and project_context.may_read(found[row.run_id].project)]


def note_followed(run_id: str, status: str | None) -> None:
    """The Run page followed (a status) or unfollowed (None) a run: the toasts start from what it showed."""
    seen = st.session_state.setdefault(FOLLOW_SEEN, {})
    if status is None:
        seen.pop(run_id, None)
    else:
        seen[run_id] = status


def ended_since_seen(rows: list[FollowedRun]) -> list[FollowedRun]:
    """The followed runs that ended since this session last looked, each once; the first look only records
    (opening the app does not replay old ends). A run seen for the first time later (followed in another tab)
    counts as ended if it ended after this session started watching."""
    first = FOLLOW_SEEN not in st.session_state
    seen = st.session_state.setdefault(FOLLOW_SEEN, {})
    since = st.session_state.setdefault(FOLLOW_SINCE, utcnow())
    ended = []
    for row in rows:
        before = seen.get(row.run_id)
        seen[row.run_id] = row.status
        if first or row.status not in FINISHED_STATUSES or before == row.status:
            continue
        if before is not None or (row.finished_at is not None and row.finished_at >= since):
            ended.append(row)
    return ended


def _follow_panel() -> None:
    rows = followed_runs()
    for row in ended_since_seen(rows):
        st.toast(
            f"Run **{md_text(row.name)}** {status_label(row.status)}",
            icon=f":material/{STATUS_ICON.get(row.status, 'info')}:",
            duration="long",
        )
    if not rows:
        return
    st.caption(f":material/notifications: following {len(rows)} run{'s' if len(rows) != 1 else ''}")
    for row in rows[-FOLLOW_SHOWN:]:  # the newest follows
        st.page_link(
            RUN,
            label=f"{md_text(row.name)} · {status_label(row.status)}",
            query_params={"id": row.run_id},
            icon=f":material/{STATUS_ICON.get(row.status, 'circle')}:",
        )
    if len(rows) > FOLLOW_SHOWN:
        st.caption(f"and {len(rows) - FOLLOW_SHOWN} more")


def _alert_panel() -> None:
    alerts_view.sidebar_notices(st.session_state.setdefault(FOLLOW_SINCE, utcnow()), RUN)


def open_run(run_id: str) -> None:
    st.switch_page(RUN, query_params={"id": run_id})


def page_state(page: str):
    """Session-state keys of one page: `page_state("runs")("sort")` → "runs.sort"."""
    return lambda name: f"{page}.{name}"
