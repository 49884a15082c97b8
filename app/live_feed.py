"""A running run's charts over plain HTTP, for the Run page's chart frame.

Every Streamlit rerun costs the browser its fixed price (a new script run, the page's element tree
reconciled, its styles recomputed): several tens of milliseconds, whatever changed. A live page that
reran on every metric flush spent a third of a core in Chromium on that alone. So while a run is
running, the chart frame asks this route for what changed instead (a long poll: the answer comes when a
series grows, or after live_series.WAIT_S with nothing new), and the page reruns only when the person
does something.

Access: the route serves one run's charts to whoever holds a grant, an unguessable token made by the
Run page inside a signed-in session (team mode signs everyone in before any page runs; everyone signed
in may read every run). A grant is dropped after GRANT_IDLE_S unused, and at most MAX_GRANTS are held.
The route exists only where the dashboard is served through app/server.py (`torchdeck up`); elsewhere
(`streamlit run app/main.py`, tests) `served()` is false and the page refreshes its charts itself.
"""

from __future__ import annotations

import asyncio
import os
import secrets
import threading
import time
from dataclasses import dataclass

import orjson

from app.ui import live_series, queries, run_charts
from db import repo

PATH = "/_torchdeck/live/"
GRANT_IDLE_S = 600.0
MAX_GRANTS = 10_000


@dataclass
class Grant:
    run_id: str
    xmode: str
    smoothing: float
    used: float


_lock = threading.Lock()
_grants: dict[str, Grant] = {}


def served() -> bool:
    """Whether the dashboard is served through app/server.py, which mounts the route (and says so in the
    environment of its process): only then does the Run page hand out grants."""
    return os.environ.get("TORCHDECK_LIVE_FEED") == "1"


def grant(run_id: str, xmode: str, smoothing: float) -> str:
    """A new token for the live charts of `run_id` drawn with these settings."""
    token = secrets.token_urlsafe(24)
    with _lock:
        _drop_idle()
        if len(_grants) >= MAX_GRANTS:
            del _grants[min(_grants, key=lambda t: _grants[t].used)]
        _grants[token] = Grant(run_id, xmode, smoothing, time.monotonic())
    return token


def valid(token: str) -> bool:
    """Whether `token` is a grant the route still honours."""
    with _lock:
        g = _grants.get(token)
        return g is not None and time.monotonic() - g.used <= GRANT_IDLE_S


def _drop_idle() -> None:
    now = time.monotonic()
    for token in [t for t, g in _grants.items() if now - g.used > GRANT_IDLE_S]:
        del _grants[token]


def _take(token: str) -> Grant | None:
    with _lock:
        g = _grants.get(token)
        if g is not None and time.monotonic() - g.used <= GRANT_IDLE_S:
            g.used = time.monotonic()
            return g
        _grants.pop(token, None)
        return None


def answer(g: Grant, have: set[str]) -> tuple[dict, dict[str, int] | None]:
    """The charts of the grant's run: each with its stamp, and its figure where the frame lacks that stamp;
    `finished` once the run has ended (the page then shows its final charts). Also the series' counts."""
    try:
        r = repo.get_run(queries.engine(), g.run_id)
    except repo.RunNotFound:
        return {"finished": True, "charts": []}, None
    if r.finished:
        return {"finished": True, "charts": []}, None
    charts, counts = run_charts.live_figures(r, g.xmode, g.smoothing)
    out = [{"title": c.title, "stamp": c.stamp, "spec": None if c.stamp in have else c.spec} for c in charts]
    return {"finished": False, "charts": out}, counts


async def live(request):
    """GET PATH<token>?have=<stamp>,<stamp>…: what changed since the frame's figures, waiting for it."""
    from starlette.concurrency import run_in_threadpool
    from starlette.responses import Response

    g = _take(request.path_params["token"])
    if g is None:
        return Response(b'{"error": "unknown or expired grant"}', status_code=404, media_type="application/json")
    have = {s for s in request.query_params.get("have", "").split(",") if s}
    body, counts = await run_in_threadpool(answer, g, have)
    if counts is not None and all(c["spec"] is None for c in body["charts"]):
        shared = live_series.shared(queries.db_url(), g.run_id)
        deadline = time.monotonic() + live_series.WAIT_S
        while time.monotonic() < deadline and not await request.is_disconnected():
            await asyncio.sleep(live_series.POLL_S / 2)
            if await run_in_threadpool(shared.latest_counts, queries.engine()) != counts:
                body, counts = await run_in_threadpool(answer, g, have)
                break
    return Response(orjson.dumps(body), media_type="application/json", headers={"Cache-Control": "no-store"})


def routes() -> list:
    from starlette.routing import Route

    return [Route(PATH + "{token}", live, methods=["GET"])]
