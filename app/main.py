"""The dashboard's entry (`streamlit run app/main.py`): the router and the frame every page shares.

Pages live in app/app_pages/ and are thin UI over app/ui/ (Streamlit parts) and plain functions in app/. Nothing
here (or there) imports torch: the UI validates specs with core.config, reads the database and enqueues runs by
task name."""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:  # `streamlit run app/main.py` puts app/, not the repository, on the path
    sys.path.insert(0, str(ROOT))

import streamlit as st

from app.ui import frame, gate, project_context
from core.redact import redact_logs

redact_logs()  # no password of a URL in the dashboard's log lines

st.set_page_config(page_title="torchdeck", page_icon="🔥", layout="wide")
user = gate.gate()  # team mode: nobody sees a page (or any data) before signing in

page = st.navigation(frame.navigation(ROOT / "app"))  # the pages: app/ui/frame.py's PAGES
schema_ok = frame.schema_ok()
# The current project (?project=, kept between pages): a project the user may not read is "not found".
project = project_context.resolve(user) if schema_ok else None
switcher = frame.sidebar(project)
gate.sidebar(user)
if project is not None or (schema_ok and project_context.in_no_project() and page.url_path == frame.PROJECT_URL):
    page.run()
if schema_ok:
    frame.project_switcher(switcher)  # after the page: one that opened another project's run switched to it
