"""Talking to a real dashboard (`torchdeck ui`, started by tests/e2e/conftest.py's serve_ui) the way a browser
does, without one: HTTP requests with the Host, Origin and cookies a browser would send, Streamlit's websocket
(/_stcore/stream: a handshake, then a whole script run of a page, read as the ForwardMsgs it streams back), and a
team-mode sign-in cookie made as Streamlit's /oauth2callback makes it (signed with the configured secret)."""

from __future__ import annotations

import http.client
import json
import socket
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

from websockets.sync.client import ClientConnection, connect

WAIT_S = 90  # for what a visitor would wait for: generous, a busy machine takes longer
SITE = "torchdeck.test"  # a team dashboard's name (its sign-in redirect URI's host)
ISSUER = "https://sso.example.com/realms/lab"


def team_env(cookie_secret: str) -> dict[str, str]:
    """The environment of a team-mode dashboard signing in at ISSUER, on 127.0.0.1 (its cookies signed with
    `cookie_secret`, which sign_in_cookie needs too)."""
    return {
        "TORCHDECK_MODE": "team",
        "TORCHDECK_UI_ADDRESS": "127.0.0.1",
        "TORCHDECK_OIDC_ISSUER": ISSUER,
        "TORCHDECK_OIDC_CLIENT_ID": "torchdeck",
        "TORCHDECK_OIDC_CLIENT_SECRET": "s3cret",
        "TORCHDECK_OIDC_REDIRECT_URI": f"http://{SITE}/oauth2callback",
        "TORCHDECK_OIDC_COOKIE_SECRET": cookie_secret,
    }


def running_run(db_url: str) -> str:
    """serve_ui's seed: one running run with a few points; returns its id."""
    from seeding import seed_run

    from db.engine import make_engine

    engine = make_engine(db_url)
    try:
        return seed_run(engine, "live", status="running", steps=20, epochs=1).id
    finally:
        engine.dispose()


@dataclass
class Answer:
    status: int
    headers: dict[str, str]  # names lower-case
    body: bytes

    @property
    def text(self) -> str:
        return self.body.decode(errors="replace")


def port_of(url: str) -> int:
    return int(url.rsplit(":", 1)[1])


def get(port: int, path: str, headers: dict[str, str] | None = None, timeout: float = WAIT_S) -> Answer:
    """GET `path` from 127.0.0.1:`port` with exactly these headers (Host too: http.client sends the one given)."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    try:
        conn.request("GET", path, headers={"Host": f"127.0.0.1:{port}", **(headers or {})})
        r = conn.getresponse()
        return Answer(r.status, {k.lower(): v for k, v in r.getheaders()}, r.read())
    finally:
        conn.close()


def cookie_header(cookies: dict[str, str]) -> str:
    return "; ".join(f"{k}={v}" for k, v in cookies.items())


def sign_in_cookie(secret: str, origin: str, claims: dict) -> str:
    """The `_streamlit_user` cookie Streamlit sets after a sign-in with these ID-token claims."""
    from streamlit.web.server.starlette.starlette_app_utils import create_signed_value

    payload = {**claims, "origin": origin, "is_logged_in": True, "provider": "default"}
    return create_signed_value(secret, "_streamlit_user", json.dumps(payload)).decode()


@contextmanager
def stream(
    port: int, host: str | None = None, origin: str | None = None, cookies: dict[str, str] | None = None
) -> Iterator[ClientConnection]:
    """Streamlit's websocket opened as a browser on http://`host` would (its Host and Origin, an XSRF token in
    the subprotocols and its cookie); the connection goes to 127.0.0.1:`port` whatever the name."""
    from streamlit.web.server.starlette.starlette_app_utils import (
        generate_xsrf_token_string,
    )

    host = host or f"127.0.0.1:{port}"
    xsrf = generate_xsrf_token_string()
    jar = {"_streamlit_xsrf": xsrf, **(cookies or {})}
    sock = socket.create_connection(("127.0.0.1", port), timeout=WAIT_S)
    with connect(
        f"ws://{host}/_stcore/stream",
        sock=sock,
        origin=origin or f"http://{host}",
        subprotocols=["streamlit", xsrf],
        additional_headers={"Cookie": cookie_header(jar)},
        open_timeout=WAIT_S,
        max_size=None,
    ) as ws:
        yield ws


def run_page(ws: ClientConnection, page: str, query: str = "") -> list:
    """Ask for a run of `page` (its url path) and return the elements it drew, up to its script's end."""
    from streamlit.proto.BackMsg_pb2 import BackMsg
    from streamlit.proto.ClientState_pb2 import ClientState
    from streamlit.proto.ForwardMsg_pb2 import ForwardMsg

    ws.send(BackMsg(rerun_script=ClientState(query_string=query, page_name=page)).SerializeToString())
    elements = []
    deadline = time.monotonic() + WAIT_S
    while True:
        msg = ForwardMsg.FromString(ws.recv(timeout=max(1.0, deadline - time.monotonic())))
        kind = msg.WhichOneof("type")
        if kind == "delta" and msg.delta.WhichOneof("type") == "new_element":
            elements.append(msg.delta.new_element)
        if kind == "script_finished" and elements:  # an st.rerun() finishes a run with nothing drawn: go on
            return elements


def feed_of(elements: list) -> dict | None:
    """The live-chart component's `feed` argument (the live route's path and a grant), if the page drew one."""
    for e in elements:
        if e.WhichOneof("type") == "component_instance":
            return json.loads(e.component_instance.json_args).get("feed")
    return None


def live_run_page(ws: ClientConnection, run_id: str) -> dict:
    """Open the Run page of a running run and return its chart frame's feed (it must have one)."""
    feed = feed_of(run_page(ws, "run", f"id={run_id}"))
    assert feed is not None, "the Run page of a running run drew no live chart frame fed by the live route"
    return feed
