"""The dashboard as served by `torchdeck up` (`streamlit run app/server.py`): the pages of app/main.py,
plus the route the live Run page's charts are fed by (app/live_feed.py)."""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:  # `streamlit run app/server.py` puts app/, not the repository, on the path
    sys.path.insert(0, str(ROOT))

import streamlit as st  # noqa: E402

from app import live_feed  # noqa: E402

live_feed.serve()
app = st.App(str(ROOT / "app" / "main.py"), routes=live_feed.routes())
