"""The dashboard's front door (app/web/front_door.py), on a real `torchdeck ui` with real HTTP requests and real
websocket handshakes:
- local mode answers only this machine's names in Host and Origin, and TORCHDECK_ALLOWED_HOSTS's, on every
  route (a web page the user visits can point its own name at 127.0.0.1: DNS rebinding);
- local mode refuses, on every route, a request a reverse proxy passed on;
- no other site may frame the dashboard, in either mode;
- team mode shows a visitor no error details (traceback, message), only a generic notice.
The parsing rules themselves are checked as plain functions at the end."""

from __future__ import annotations

import re
from collections.abc import Iterator

import pytest
from streamlit_session import (
    ISSUER,
    SITE,
    get,
    port_of,
    run_page,
    running_run,
    sign_in_cookie,
    stream,
    team_env,
)
from websockets.exceptions import InvalidStatus

from app.web import front_door
from tests.e2e.conftest import serve_ui

pytestmark = pytest.mark.timeout(300)
REBIND = "rebind.attacker.example"
ALIAS = "workstation.lab.internal"  # another name of this machine, listed in TORCHDECK_ALLOWED_HOSTS
SECRET = "a-long-random-cookie-secret-for-front-door-tests"
ANA = {"iss": ISSUER, "sub": "ana", "name": "Ana", "email": "ana@example.com", "email_verified": True}


@pytest.fixture(scope="module")
def local() -> Iterator[dict]:
    with serve_ui("torchdeck-door-", running_run, TORCHDECK_ALLOWED_HOSTS=f"{ALIAS}, other.example") as (url, _, run):
        yield {"port": port_of(url), "run": run}


def _static_asset(port: int) -> str:
    page = get(port, "/")
    assert page.status == 200
    return "/" + re.findall(r'src="\.?/?(static/js/[^"]+\.js)"', page.text)[0]


def test_local_mode_refuses_another_sites_name_on_every_route(local):
    port = local["port"]
    paths = [
        "/",
        "/run?id=" + local["run"],
        _static_asset(port),
        "/_stcore/health",
        "/_stcore/host-config",
        "/_torchdeck/live",
    ]
    for path in paths:
        refused = get(port, path, {"Host": f"{REBIND}:{port}"})
        assert refused.status == 403, path
        assert "TORCHDECK_ALLOWED_HOSTS" in refused.text and "<" not in refused.text, path  # plain text
        refused = get(port, path, {"Origin": f"http://{REBIND}:{port}"})  # this machine's Host, a foreign page
        assert refused.status == 403 and "TORCHDECK_ALLOWED_HOSTS" in refused.text, path
    for host in (
        f"127.0.0.1:{port}",
        f"localhost:{port}",
        f"dash.localhost:{port}",
        "127.0.0.2",
        f"[::1]:{port}",
        f"{ALIAS}:{port}",
        ALIAS.upper(),
        "other.example",
    ):
        assert get(port, "/", {"Host": host}).status == 200, host
        assert get(port, "/_stcore/health", {"Host": host, "Origin": f"http://{host}"}).status == 200, host


def test_local_mode_refuses_a_websocket_from_a_rebound_name_and_serves_this_machine(local):
    port = local["port"]
    with pytest.raises(InvalidStatus) as refused:
        with stream(port, host=f"{REBIND}:{port}"):
            pass
    assert refused.value.response.status_code == 403
    assert "TORCHDECK_ALLOWED_HOSTS" in bytes(refused.value.response.body).decode()
    with pytest.raises(InvalidStatus):  # this machine's name, but opened by another site's page
        with stream(port, origin=f"http://{REBIND}:{port}"):
            pass
    for host in (f"127.0.0.1:{port}", f"localhost:{port}"):
        with stream(port, host=host) as ws:
            assert ws.response.status_code == 101
            drawn = run_page(ws, "runs")
            assert any(e.WhichOneof("type") == "heading" for e in drawn), host  # the Runs page came back


def test_local_mode_refuses_requests_through_a_proxy_on_every_route(local):
    port = local["port"]
    for headers in (
        {"X-Forwarded-For": "203.0.113.7"},
        {"Forwarded": "for=203.0.113.7"},
        {"X-Real-IP": "203.0.113.7"},
        {"X-Forwarded-For": "203.0.113.7", "Forwarded": "for=203.0.113.7", "Host": f"{REBIND}:{port}"},
    ):
        for path in ("/", "/_stcore/health", "/_torchdeck/live"):
            refused = get(port, path, headers)
            assert refused.status == 403 and "local mode" in refused.text, (path, headers)
    with pytest.raises(InvalidStatus) as ws_refused:
        from websockets.sync.client import connect

        with connect(
            f"ws://127.0.0.1:{port}/_stcore/stream",
            subprotocols=["streamlit"],
            open_timeout=60,
            additional_headers={"X-Forwarded-For": "203.0.113.7"},
        ):
            pass
    assert ws_refused.value.response.status_code == 403


def _framing_refused(answer) -> bool:
    return answer.headers.get("x-frame-options") == "SAMEORIGIN" and "frame-ancestors 'self'" in answer.headers.get(
        "content-security-policy", ""
    )


def test_no_other_site_may_frame_the_local_dashboard(local):
    port = local["port"]
    for path in ("/", "/run?id=" + local["run"], _static_asset(port), "/_stcore/health", "/_torchdeck/live"):
        assert _framing_refused(get(port, path)), path
    assert _framing_refused(get(port, "/", {"Host": REBIND}))  # a refusal too


@pytest.fixture(scope="module")
def team_misconfigured() -> Iterator[dict]:
    """Team mode with a typo in a setting the pages read: every signed-in page fails with an uncaught error."""
    with serve_ui("torchdeck-door-team-", running_run, **team_env(SECRET), TORCHDECK_SESSION_MAX_AGE_H="twelve") as (
        url,
        _,
        run,
    ):
        yield {"port": port_of(url), "run": run}


def test_team_mode_is_not_framed_by_other_sites_and_shows_visitors_no_error_details(team_misconfigured):
    port = team_misconfigured["port"]
    for path in ("/", "/_stcore/health", "/_torchdeck/live"):
        answer = get(port, path, {"Host": SITE})
        assert _framing_refused(answer), path
    cookie = sign_in_cookie(SECRET, f"http://{SITE}", ANA)
    with stream(port, host=SITE, cookies={"_streamlit_user": cookie}) as ws:
        drawn = run_page(ws, "runs")
    errors = [e.exception for e in drawn if e.WhichOneof("type") == "exception"]
    assert errors, "the misconfigured setting raised no error on the page"
    shown = " ".join(f"{e.type} {e.message} {' '.join(e.stack_trace)}" for e in errors)
    assert not any(e.stack_trace for e in errors), shown  # no traceback: no file of the server
    assert "twelve" not in shown and "TORCHDECK_SESSION_MAX_AGE_H" not in shown and ".py" not in shown, shown


# --- the rules, as plain functions ----------------------------------------------------------------


def test_host_and_origin_parsing():
    assert front_door.host_name("LocalHost.:8501") == "localhost"
    assert front_door.host_name("[::1]:8501") == "::1"
    assert front_door.host_name("user@evil.example") is None and front_door.host_name("a/b") is None
    assert front_door.host_name("127.0.0.1:notaport") is None and front_door.host_name("") is None
    assert front_door.origin_name("http://127.0.0.1:8501") == "127.0.0.1"
    assert front_door.origin_name("null") is None and front_door.origin_name("file://x") is None
    assert all(front_door.is_loopback_name(n) for n in ("localhost", "a.b.localhost", "127.0.0.1", "127.9.8.7", "::1"))
    assert not any(
        front_door.is_loopback_name(n)
        for n in ("localhost.evil.example", "10.0.0.1", "0.0.0.0", "evil-localhost", "128.0.0.1")
    )


def test_host_refusal_rules(monkeypatch):
    assert front_door.host_refusal("127.0.0.1:8501", None) is None
    assert front_door.host_refusal("127.0.0.1:8501", "http://localhost:3000") is None  # any port of this machine
    assert "TORCHDECK_ALLOWED_HOSTS" in front_door.host_refusal(None, None)
    assert "Origin 'null'" in front_door.host_refusal("localhost", "null")  # a sandboxed frame of any site
    monkeypatch.setenv(front_door.ALLOWED_HOSTS_ENV, " Box.Example:8501 ,, ")
    assert front_door.allowed_names() == {"box.example"}
    assert front_door.host_refusal("box.example:9000", "https://box.example", front_door.allowed_names()) is None
