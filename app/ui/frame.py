"""The frame around every page: where the data lives, how many runs are active, and a refusal to
show anything on a database whose schema this code does not know (with the command to fix it)."""

from __future__ import annotations

import streamlit as st

from app import services
from app.fmt import code_span
from app.ui import queries
from core.names import CLAIMABLE_STATUSES
from core.redact import redact
from db.migrate import check_schema
from db.repo import SchemaOutOfDate

# The pages, for st.switch_page / st.page_link (paths relative to app/main.py).
RUNS, NEW, RUN, COMPARE = "app_pages/runs.py", "app_pages/new_run.py", "app_pages/run.py", "app_pages/compare.py"
ARTIFACT = "app_pages/artifact.py"
WORKERS, DATASETS = "app_pages/workers.py", "app_pages/datasets.py"


@st.cache_data(ttl=30, show_spinner=False)
def _schema_problem(url: str) -> str | None:
    try:
        check_schema(services.engine_for(url))
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
def _active_counts(url: str) -> tuple[int, int]:
    from db.repo import list_runs

    e = services.engine_for(url)
    return list_runs(e, status="running", limit=1).total, list_runs(e, status=list(CLAIMABLE_STATUSES), limit=1).total


def sidebar() -> None:
    with st.sidebar:
        st.markdown("### :material/local_fire_department: torchdeck")
        if _schema_problem(queries.db_url()) is None:
            running, queued = _active_counts(queries.db_url())
            st.caption(f"{running} running · {queued} queued")
        url = queries.db_url()
        st.caption(f"database: {code_span(redact(url.split('///')[-1] if url.startswith('sqlite') else url.split('@')[-1]))}")
        st.caption(f"broker: {code_span(redact(services.broker_url().split('@')[-1]))}")


def open_run(run_id: str) -> None:
    st.switch_page(RUN, query_params={"id": run_id})


def page_state(page: str):
    """Session-state keys of one page: `page_state("runs")("sort")` → "runs.sort"."""
    return lambda name: f"{page}.{name}"
