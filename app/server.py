"""The dashboard as served by `torchdeck up` (`streamlit run app/server.py`): the pages of app/main.py,
plus the route the live Run page's charts are fed by (app/live_feed.py)."""

from __future__ import annotations

import os
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:  # `streamlit run app/server.py` puts app/, not the repository, on the path
    sys.path.insert(0, str(ROOT))

import streamlit as st  # noqa: E402
from starlette.routing import Route  # noqa: E402


async def live(request):
    """app.live_feed.live, imported at the first request: importing the dashboard's modules (and their
    caches) before Streamlit's runtime exists would give those caches a storage of their own."""
    from app import live_feed

    return await live_feed.live(request)


os.environ["TORCHDECK_LIVE_FEED"] = "1"  # app.live_feed.served(): the pages may hand out grants
app = st.App(str(ROOT / "app" / "main.py"), routes=[Route("/_torchdeck/live/{token}", live, methods=["GET"])])
