"""The dashboard's entry (`streamlit run app/main.py`): the router and the frame every page shares.

Pages live in app/app_pages/ and are thin UI over app/ui/ (Streamlit parts) and plain functions in app/. Nothing here (or
there) imports torch: the UI validates specs with core.config, reads the database and enqueues
runs by task name."""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:  # `streamlit run app/main.py` puts app/, not the repository, on the path
    sys.path.insert(0, str(ROOT))

import streamlit as st

from app.ui import frame, gate
from core.redact import redact_logs

redact_logs()  # no password of a URL in the dashboard's log lines

PAGES = ROOT / "app" / "app_pages"

st.set_page_config(page_title="torchdeck", page_icon="🔥", layout="wide")
user = gate.gate()  # team mode: nobody sees a page (or any data) before signing in

pages = {
    "Experiments": [
        st.Page(PAGES / "overview.py", title="Overview", icon=":material/dashboard:", url_path="overview"),
        st.Page(PAGES / "runs.py", title="Runs", icon=":material/table_rows:", url_path="runs", default=True),
        st.Page(PAGES / "new_run.py", title="New run", icon=":material/add_circle:", url_path="new"),
        st.Page(PAGES / "run.py", title="Run", icon=":material/monitoring:", url_path="run"),
        st.Page(PAGES / "compare.py", title="Compare", icon=":material/compare_arrows:", url_path="compare"),
        st.Page(PAGES / "sweep.py", title="Sweeps", icon=":material/tune:", url_path="sweep"),
        st.Page(PAGES / "artifact.py", title="Artifact", icon=":material/download:", url_path="artifact"),
    ],
    "Resources": [
        st.Page(PAGES / "workers.py", title="Workers", icon=":material/memory:", url_path="workers"),
        st.Page(PAGES / "datasets.py", title="Datasets", icon=":material/folder_zip:", url_path="datasets"),
    ],
}
page = st.navigation(pages)
frame.sidebar()
gate.sidebar(user)
if frame.schema_ok():
    page.run()
