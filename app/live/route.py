"""A running run's charts over plain HTTP, for the Run page's chart frame.

Every Streamlit rerun costs the browser its fixed price (a new script run, the page's element tree
reconciled, its styles recomputed): several tens of milliseconds, whatever changed. A live page that
reran on every metric flush spent a third of a core in Chromium on that alone. So while a run is
running, the chart frame asks this route for what changed instead (a long poll: the answer comes when a
series grows, or after series.WAIT_S with nothing new), and the page reruns only when the person
does something.

Access: the route serves one run's charts to the holder of a grant, an unguessable token the Run page makes
inside an admitted session and hands to its own chart frame, which sends it in the X-Torchdeck-Grant header
(never in the URL, which proxies and browsers log). A grant is bound to
- its Streamlit session: it dies when the session is gone (the tab closed, the websocket lost);
- the signed-in person (team mode): the request's sign-in cookie must name the same identity, still a member of
  the dashboard, who may still read the run's project (app/web/access.py, their roles looked up at every request:
  a grant outlives a removal from the project by one request at most, the long poll already waiting); a grant
  refused for its project is dropped, and answered as an unknown one;
- time: dropped after GRANT_IDLE_S unused, and GRANT_MAX_AGE_S after it was made however often it is used
  (the frame then asks its page for another).
A session holds at most GRANTS_PER_SESSION (a new one drops that session's oldest, never another's); when
MAX_GRANTS are held, grants of dead sessions are dropped and, if that is not enough, no new grant is made
(the page then refreshes its charts itself). At most MAX_POLLS long polls wait at once, POLLS_PER_SESSION per
session; another is answered at once with 429 (the frame asks again a second later).
The route exists only where the dashboard is served through app/server.py (`torchdeck up`); elsewhere
(`streamlit run app/main.py`, tests) `served()` is false and the page refreshes its charts itself.
"""

from __future__ import annotations

import asyncio
import os
import secrets
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass

import orjson

from app import auth
from app.live import series
from app.ui import queries, run_charts
from db import repo

PATH = "/_torchdeck/live"  # app/server.py mounts the route at this path (written out there: see its docstring)
HEADER = "X-Torchdeck-Grant"
UNKNOWN_GRANT = "unknown or expired grant"
GRANT_IDLE_S = 600.0
GRANT_MAX_AGE_S = 3600.0
MAX_GRANTS = 10_000
GRANTS_PER_SESSION = 8  # one per chart settings (x-axis, smoothing) the person tried: the oldest are stale
MAX_POLLS = 64  # each waiting poll reads the run's counts every series.POLL_S / 2 in the thread pool
POLLS_PER_SESSION = 2  # a frame polls one at a time; a re-created frame's last poll may still be waiting


@dataclass
class Grant:
    run_id: str
    xmode: str
    smoothing: float
    session: str
    identity: str | None  # team mode: the signed-in user's key (auth.User.id); local mode: None
    made: float
    used: float


def session_alive(session_id: str) -> bool:
    """Whether this Streamlit session is still connected (Streamlit's runtime says so; no runtime: no)."""
    from streamlit.runtime import Runtime

    return Runtime.exists() and Runtime.instance().is_active_session(session_id)


class Grants:
    """The grants this process honours. `clock` and `alive` (is a session still there) are parameters so that
    the rules can be tested without waiting hours."""

    def __init__(
        self,
        clock: Callable[[], float] = time.monotonic,
        alive: Callable[[str], bool] = session_alive,
        *,
        limit: int = MAX_GRANTS,
        per_session: int = GRANTS_PER_SESSION,
        idle_s: float = GRANT_IDLE_S,
        max_age_s: float = GRANT_MAX_AGE_S,
    ) -> None:
        self.clock, self.alive = clock, alive
        self.limit, self.per_session, self.idle_s, self.max_age_s = limit, per_session, idle_s, max_age_s
        self._lock = threading.Lock()
        self._grants: dict[str, Grant] = {}

    def _current(self, g: Grant, now: float) -> bool:
        return now - g.used <= self.idle_s and now - g.made <= self.max_age_s and self.alive(g.session)

    def make(self, session: str, identity: str | None, run_id: str, xmode: str, smoothing: float) -> str | None:
        """A new token for the live charts of `run_id` drawn with these settings, for this session and identity;
        None when the table is full of other sessions' current grants."""
        token = secrets.token_urlsafe(24)
        with self._lock:
            now = self.clock()
            own = [t for t, g in self._grants.items() if g.session == session]  # oldest first (insertion order)
            for t in own[: max(0, len(own) - self.per_session + 1)]:  # this session's oldest make room
                del self._grants[t]
            if len(self._grants) >= self.limit:
                for t in [t for t, g in self._grants.items() if not self._current(g, now)]:
                    del self._grants[t]
            if len(self._grants) >= self.limit:
                return None
            self._grants[token] = Grant(run_id, xmode, smoothing, session, identity, now, now)
        return token

    def get(self, token: str) -> Grant | None:
        """The grant, while it is current (one that is not is dropped for good); does not count as a use."""
        with self._lock:
            g = self._grants.get(token)
            if g is not None and self._current(g, self.clock()):
                return g
            self._grants.pop(token, None)
            return None

    def drop(self, token: str) -> None:
        with self._lock:
            self._grants.pop(token, None)

    def use(self, token: str) -> None:
        with self._lock:
            if token in self._grants:
                self._grants[token].used = self.clock()

    def valid(self, token: str, session: str) -> bool:
        """Whether `token` is a current grant of this session."""
        g = self.get(token)
        return g is not None and g.session == session


class Polls:
    """How many long polls wait now, in all and per session."""

    def __init__(self, limit: int = MAX_POLLS, per_session: int = POLLS_PER_SESSION) -> None:
        self.limit, self.per_session = limit, per_session
        self._lock = threading.Lock()
        self._waiting: dict[str, int] = {}

    @contextmanager
    def slot(self, session: str) -> Iterator[bool]:
        """Yields whether this poll may wait (and then holds its place until it is answered)."""
        with self._lock:
            admitted = sum(self._waiting.values()) < self.limit and self._waiting.get(session, 0) < self.per_session
            if admitted:
                self._waiting[session] = self._waiting.get(session, 0) + 1
        try:
            yield admitted
        finally:
            if admitted:
                with self._lock:
                    self._waiting[session] -= 1
                    if not self._waiting[session]:
                        del self._waiting[session]


_grants = Grants()
_polls = Polls()


def served() -> bool:
    """Whether the dashboard is served through app/server.py, which mounts the route (and says so in the
    environment of its process): only then does the Run page hand out grants."""
    return os.environ.get("TORCHDECK_LIVE_FEED") == "1"


def grant(run_id: str, xmode: str, smoothing: float) -> str | None:
    """From a page's script run: a new token for the live charts of `run_id` drawn with these settings, bound to
    this session and its signed-in person; None when none can be made (the page refreshes its charts itself)."""
    from streamlit.runtime.scriptrunner import get_script_run_ctx

    ctx = get_script_run_ctx()
    user = auth.current_user()
    if ctx is None or user is None:
        return None
    return _grants.make(ctx.session_id, user.id if auth.team_mode() else None, run_id, xmode, smoothing)


def valid(token: str) -> bool:
    """From a page's script run: whether `token` is a grant of this session the route still honours."""
    from streamlit.runtime.scriptrunner import get_script_run_ctx

    ctx = get_script_run_ctx()
    return ctx is not None and _grants.valid(token, ctx.session_id)


async def team_refusal(request, g: Grant) -> tuple[int, str] | None:
    """Team mode: why the request may not use grant `g` now (status and words), or None. The sign-in must be the
    grant's, still a member of the dashboard, who may read the run's project (404 as for an unknown grant)."""
    from starlette.concurrency import run_in_threadpool

    from app.web import access, front_door

    user = front_door.signed_in_user(request)
    if g.identity is None or user is None or user.id != g.identity:
        return 403, "this grant was made for another sign-in"
    if not auth.is_member(user):
        return 403, f"{user.describe()} is not a member of this torchdeck: ask an admin ({auth.ADMINS_ENV}) to add you"
    if not await run_in_threadpool(access.may_read, user, "run", g.run_id, queries.engine()):
        return 404, UNKNOWN_GRANT
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


async def _changes(request, g: Grant, have: set[str]) -> dict:
    """What changed since the frame's figures, waiting up to series.WAIT_S for a series to grow."""
    from starlette.concurrency import run_in_threadpool

    body, counts = await run_in_threadpool(answer, g, have)
    if counts is not None and all(c["spec"] is None for c in body["charts"]):
        shared = series.shared(queries.db_url(), g.run_id)
        deadline = time.monotonic() + series.WAIT_S
        while time.monotonic() < deadline and not await request.is_disconnected():
            await asyncio.sleep(series.POLL_S / 2)
            if await run_in_threadpool(shared.latest_counts, queries.engine()) != counts:
                body, counts = await run_in_threadpool(answer, g, have)
                break
    return body


def _error(status: int, why: str, **headers: str):
    from starlette.responses import Response

    return Response(
        orjson.dumps({"error": why}),
        status_code=status,
        media_type="application/json",
        headers={"Cache-Control": "no-store", **headers},
    )


async def serve(request, grants: Grants, polls: Polls):
    """GET PATH?have=<stamp>,<stamp>… with the grant in the X-Torchdeck-Grant header."""
    from starlette.responses import Response

    team = auth.team_mode()
    if not team:  # the pages' refusal (app/web/front_door.py applies it to every route as well)
        why = auth.local_refusal(request.client.host if request.client else None, request.headers)
        if why:
            return _error(403, why)
    token = request.headers.get(HEADER, "")
    g = grants.get(token)
    if g is None:
        return _error(404, UNKNOWN_GRANT)
    why = await team_refusal(request, g) if team else None
    if why is not None:
        if why[0] == 404:  # its run's project is no longer readable: the grant is of no further use to anyone
            grants.drop(token)
        return _error(*why)
    grants.use(token)
    with polls.slot(g.session) as admitted:
        if not admitted:
            return _error(429, "too many live requests at once: ask again in a second", **{"Retry-After": "1"})
        body = await _changes(request, g, {s for s in request.query_params.get("have", "").split(",") if s})
    return Response(orjson.dumps(body), media_type="application/json", headers={"Cache-Control": "no-store"})


async def live(request):
    """The route of app/server.py, on this process's grants."""
    return await serve(request, _grants, _polls)


def routes(grants: Grants | None = None, polls: Polls | None = None) -> list:
    """The route on these grants and polls (default: the process's)."""
    from starlette.routing import Route

    async def endpoint(request):
        return await serve(request, _grants if grants is None else grants, _polls if polls is None else polls)

    return [Route(PATH, endpoint, methods=["GET"])]
