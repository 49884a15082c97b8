"""Grants of the live charts' route (app/live/route.py): who may use one, and for how long.

On a real `torchdeck ui`, a grant is what the Run page hands its chart frame in a real session (Streamlit's
websocket): it is sent in the X-Torchdeck-Grant header (the route's path holds no token), it dies with its
session, in team mode it serves only the person it was made for (their sign-in cookie), and a session may not
hold more than two long polls at once. The table's rules (an absolute lifetime however often a grant is used, a
cap per session that never evicts another session's grants, a full table that evicts nobody, a cap on waiting
polls) are checked on the table itself, its clock and its sessions given, without waiting hours."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator

import orjson
import pytest
from seeding import seed_run
from starlette.applications import Starlette
from starlette.testclient import TestClient
from streamlit_session import (
    ISSUER,
    SITE,
    WAIT_S,
    get,
    live_run_page,
    port_of,
    running_run,
    sign_in_cookie,
    stream,
    team_env,
)

from app.live import route
from app.live.route import HEADER, PATH, Grants, Polls
from tests.e2e.conftest import serve_ui

pytestmark = pytest.mark.timeout(300)
SECRET = "a-long-random-cookie-secret-for-grant-tests"
ANA = {"iss": ISSUER, "sub": "ana", "name": "Ana", "email": "ana@example.com", "email_verified": True}
BOB = {"iss": ISSUER, "sub": "bob", "name": "Bob", "email": "bob@example.com", "email_verified": True}


@pytest.fixture(scope="module")
def local() -> Iterator[dict]:
    with serve_ui("torchdeck-grants-", running_run) as (url, _, run):
        yield {"port": port_of(url), "run": run}


@pytest.fixture(scope="module")
def team() -> Iterator[dict]:
    with serve_ui("torchdeck-grants-team-", running_run, **team_env(SECRET)) as (url, _, run):
        yield {"port": port_of(url), "run": run}


def test_the_run_pages_grant_travels_in_a_header_and_dies_with_its_session(local):
    port = local["port"]
    with stream(port) as ws:
        feed = live_run_page(ws, local["run"])
        grant = feed["grant"]
        assert feed["path"] == PATH and grant not in feed["path"] and len(grant) >= 32
        served = get(port, PATH, {HEADER: grant})
        assert served.status == 200 and served.headers["cache-control"] == "no-store"
        assert "Loss" in [c["title"] for c in orjson.loads(served.body)["charts"]]
        assert get(port, PATH).status == 404  # no grant
        for in_url in (f"{PATH}/{grant}", f"{PATH}?grant={grant}"):  # a token in a URL (a proxy's log) is worth nothing
            assert b'"charts"' not in get(port, in_url).body, in_url  # (Streamlit's page shell, or a 404)
    deadline = time.monotonic() + WAIT_S  # the tab is closed: its session goes, and its grant with it
    while (after := get(port, PATH, {HEADER: grant})).status == 200:
        assert time.monotonic() < deadline, "the grant still served its charts after its session was gone"
        time.sleep(0.2)
    assert after.status == 404


def test_a_session_waits_on_at_most_two_long_polls_at_once(local):
    port = local["port"]
    with stream(port) as ws:
        feed = live_run_page(ws, local["run"])
        first = orjson.loads(get(port, PATH, {HEADER: feed["grant"]}).body)
        have = PATH + "?have=" + ",".join(c["stamp"] for c in first["charts"])  # nothing new: each poll waits
        answers: list = []
        told = threading.Event()

        def poll_until_told() -> None:
            deadline = time.monotonic() + WAIT_S
            while not told.is_set() and time.monotonic() < deadline:
                answers.append(answer := get(port, have, {HEADER: feed["grant"]}))
                if answer.status == 429:
                    told.set()

        pollers = [threading.Thread(target=poll_until_told) for _ in range(3)]
        for t in pollers:
            t.start()
        for t in pollers:
            t.join()
        assert told.is_set(), f"three polls at once were all admitted ({len(answers)} answers)"
        assert {a.status for a in answers} <= {200, 429}
        assert all(a.headers.get("retry-after") == "1" for a in answers if a.status == 429)
        assert get(port, have, {HEADER: feed["grant"]}).status == 200  # the places were given back


def test_in_team_mode_a_grant_serves_only_the_person_it_was_made_for(team):
    port = team["port"]
    origin = f"http://{SITE}"
    ana = sign_in_cookie(SECRET, origin, ANA)
    with stream(port, host=SITE, cookies={"_streamlit_user": ana}) as ws:
        feed = live_run_page(ws, team["run"])

        def ask(cookie: str | None):
            jar = {"Cookie": f"_streamlit_user={cookie}"} if cookie else {}
            return get(port, PATH, {"Host": SITE, HEADER: feed["grant"], **jar}).status

        assert ask(ana) == 200
        assert ask(sign_in_cookie(SECRET, origin, BOB)) == 403  # another member holding Ana's grant
        assert ask(None) == 403  # nobody signed in
        assert ask(sign_in_cookie("not-the-dashboards-secret", origin, ANA)) == 403  # a cookie made elsewhere
        assert ask(sign_in_cookie(SECRET, origin, {**ANA, "iat": time.time() - 13 * 3600})) == 403  # too old
        assert ask(ana) == 200  # refusing the others spent nothing of hers


# --- the table's rules, on a table of its own ---------------------------------------------------


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def always(_session: str) -> bool:
    """Every session is still there (these tests are about time and numbers, not sessions)."""
    return True


def test_a_grant_expires_at_its_absolute_lifetime_however_often_it_is_polled(engine, monkeypatch):
    monkeypatch.delenv("TORCHDECK_MODE", raising=False)
    r = seed_run(engine, "live", status="running", steps=5)
    clock = Clock()
    grants = Grants(clock, always)
    token = grants.make("s1", None, r.id, "step", 0.0)
    with TestClient(Starlette(routes=route.routes(grants)), client=("127.0.0.1", 50000)) as client:
        while client.get(PATH, headers={HEADER: token}).status_code == 200:
            clock.now += 5 * 60  # polled every five minutes: never idle
            assert clock.now - 1000 < 72 * 3600, "a polled grant lives for ever"
        assert route.GRANT_MAX_AGE_S - 5 * 60 < clock.now - 1000 <= route.GRANT_MAX_AGE_S + 5 * 60
        assert client.get(PATH, headers={HEADER: token}).status_code == 404
        idle = grants.make("s1", None, r.id, "step", 0.0)
        clock.now += route.GRANT_IDLE_S + 1  # unused for longer than the idle timeout
        assert client.get(PATH, headers={HEADER: idle}).status_code == 404


def test_a_session_beyond_its_cap_drops_its_own_oldest_grant_never_anothers():
    clock = Clock()
    grants = Grants(clock, always, per_session=3)
    other = grants.make("b", None, "run", "step", 0.0)
    mine = []
    for _ in range(5):
        clock.now += 1
        mine.append(grants.make("a", None, "run", "step", 0.0))
    assert [grants.valid(t, "a") for t in mine] == [False, False, True, True, True]
    assert grants.valid(other, "b") and not grants.valid(other, "a")  # and only for its own session


def test_a_full_table_makes_room_from_gone_sessions_only():
    here = {"a", "b", "c"}
    grants = Grants(Clock(), lambda s: s in here, limit=2)
    a, b = grants.make("a", None, "run", "step", 0.0), grants.make("b", None, "run", "step", 0.0)
    assert grants.make("c", None, "run", "step", 0.0) is None  # nobody's grant is evicted for it
    assert grants.valid(a, "a") and grants.valid(b, "b")
    here.discard("a")  # a's tab closed
    c = grants.make("c", None, "run", "step", 0.0)
    assert c is not None and grants.valid(c, "c") and grants.valid(b, "b") and not grants.valid(a, "a")


def test_waiting_polls_are_capped_in_all_and_per_session():
    polls = Polls(limit=3, per_session=2)
    with polls.slot("a") as a1, polls.slot("a") as a2, polls.slot("a") as a3:
        assert a1 and a2 and not a3
        with polls.slot("b") as b1, polls.slot("c") as c1:
            assert b1 and not c1  # three wait in all
    with polls.slot("c") as again, polls.slot("a") as a4:
        assert again and a4  # places are given back once answered
