"""The dashboard as served by `torchdeck ui` / `torchdeck up` (`streamlit run app/server.py`): the pages of
app/main.py, plus the route the live Run page's charts are fed by (app/live/route.py) and the artifact downloads' route
(app/web/downloads.py), the model registry's stable links (app/web/model_downloads.py) and the MLflow tracking
endpoint that people's own scripts log into (app/tracking/), behind the front door
(app/web/front_door.py: local mode answers this machine's names only, no other site may frame the dashboard). In team
mode each of these routes serves a person only what belongs to the projects they may read (app/web/access.py).

`streamlit run app/main.py` serves the pages alone: no live route and no front door (only the pages' gate)."""

from __future__ import annotations

import os
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:  # `streamlit run app/server.py` puts app/, not the repository, on the path
    sys.path.insert(0, str(ROOT))

import streamlit as st  # noqa: E402
from starlette.routing import Route  # noqa: E402

from app.tracking import route as tracking  # noqa: E402 - the MLflow endpoint: its handlers are imported at a request
from app.web import downloads, front_door, model_downloads, nodelay  # noqa: E402 - torch-free and cache-free: safe before Streamlit's runtime exists

# app.live.route.PATH, written out: importing app.live.route here would import the dashboard's caches too early.
LIVE_PATH = "/_torchdeck/live"


async def live(request):
    """app.live.route.live, imported at the first request: importing the dashboard's modules (and their
    caches) before Streamlit's runtime exists would give those caches a storage of their own."""
    from app.live import route

    return await route.live(request)


nodelay.install()  # answers are not held back ~40 ms on kept-alive connections (app/web/nodelay.py)
os.environ["TORCHDECK_LIVE_FEED"] = "1"  # app.live.route.served(): the pages may hand out grants
app = st.App(
    str(ROOT / "app" / "main.py"),
    routes=[
        Route(LIVE_PATH, live, methods=["GET"]),
        *downloads.routes(),
        *model_downloads.routes(),
        *tracking.routes(),
    ],
    middleware=front_door.middleware(),
)
