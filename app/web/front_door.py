"""The dashboard's front door: an ASGI middleware in front of every route of `torchdeck ui` / `torchdeck up`
(pages, Streamlit's websocket and static files, /_stcore/*, the live charts' route).

Local mode has no sign-in and trusts whoever reaches it, so it must be reached only from this machine, by
this machine's names:
- a request a reverse proxy passed on, or one from another machine, is refused (app.auth.local_refusal,
  which the pages' gate also applies; here it covers every route, not only the script's);
- DNS rebinding: a web page the local user visits can point its own name at 127.0.0.1 and then talk to
  the dashboard as a same-origin page (Streamlit's websocket accepts any Origin equal to the Host). So
  `Host` and `Origin` must name this machine: localhost, *.localhost, 127.0.0.0/8 or [::1], any port,
  or a name listed in TORCHDECK_ALLOWED_HOSTS (for a name of this machine in /etc/hosts, say).
Team mode signs everyone in (a rebound page has no sign-in cookie for the dashboard's name), so it
checks neither.

Both modes: no other site may frame the dashboard (clickjacking): every HTTP answer says
`X-Frame-Options: SAMEORIGIN` and `Content-Security-Policy: frame-ancestors 'self'`. The dashboard's own
frames (the live charts' component) are same-origin and keep working.

Only app/server.py mounts this middleware: a dashboard started with `streamlit run app/main.py` (some tests,
a developer) has none of it, only the gate's refusal of proxied and remote requests.
"""

from __future__ import annotations

import ipaddress
import os
from collections.abc import Iterable
from urllib.parse import urlsplit

from app import auth

ALLOWED_HOSTS_ENV = "TORCHDECK_ALLOWED_HOSTS"  # local mode: more names (comma-separated) Host and Origin may use
FRAME_HEADERS = ((b"x-frame-options", b"SAMEORIGIN"), (b"content-security-policy", b"frame-ancestors 'self'"))


def host_name(value: str | None) -> str | None:
    """The host name of a `Host` value (`name`, `name:port`, `[v6]:port`), lower-case, without a trailing dot;
    None when it is missing or malformed."""
    if not value:
        return None
    try:
        parts = urlsplit(f"//{value.strip()}")
        _ = parts.port  # a malformed port raises
    except ValueError:
        return None
    if (
        parts.hostname is None
        or parts.username is not None
        or parts.password is not None
        or parts.path
        or parts.query
        or parts.fragment
    ):
        return None
    return parts.hostname.lower().rstrip(".") or None


def origin_name(value: str) -> str | None:
    """The host name of an `Origin` value (`scheme://host[:port]`); None for `null` or anything malformed."""
    try:
        parts = urlsplit(value.strip())
    except ValueError:
        return None
    if parts.scheme not in ("http", "https") or parts.path not in ("", "/"):
        return None
    return host_name(parts.netloc)


def is_loopback_name(name: str) -> bool:
    """localhost and *.localhost (which browsers resolve to this machine themselves), 127.0.0.0/8 and ::1."""
    if name == "localhost" or name.endswith(".localhost"):
        return True
    try:
        return ipaddress.ip_address(name).is_loopback
    except ValueError:
        return False


def allowed_names() -> frozenset[str]:
    """The names of TORCHDECK_ALLOWED_HOSTS (a port given with one is ignored: any port is accepted)."""
    raw = os.environ.get(ALLOWED_HOSTS_ENV, "")
    return frozenset(n for e in raw.split(",") if e.strip() and (n := host_name(e)))


def host_refusal(host: str | None, origin: str | None, extra: Iterable[str] = ()) -> str | None:
    """Local mode: why a request with this `Host` (and `Origin`, when the browser sent one) is refused, or None."""
    allowed = frozenset(extra)

    def ok(name: str | None) -> bool:
        return name is not None and (is_loopback_name(name) or name in allowed)

    if not ok(host_name(host)):
        what = f"Host {host!r}" if host else "a request without a Host"
    elif origin is not None and not ok(origin_name(origin)):
        what = f"Origin {origin!r}"
    else:
        return None
    return (
        f"This torchdeck dashboard runs in local mode, without sign-in, and answers only this machine's names "
        f"(localhost, 127.0.0.1, [::1]); {what} is not one of them. To reach it by another name of this "
        f"machine, list that name in {ALLOWED_HOSTS_ENV}; to share the dashboard, run it with "
        f"{auth.MODE_ENV}=team."
    )


def refusal(scope: dict) -> str | None:
    """Why this http or websocket request is refused, or None (always None in team mode)."""
    try:
        if auth.team_mode():
            return None
    except auth.AuthNotConfigured:
        pass  # an unknown mode: the pages say so; meanwhile the stricter rules of local mode apply
    headers: dict[str, str] = {}
    for name, value in scope.get("headers", ()):
        headers.setdefault(name.decode("latin-1").lower(), value.decode("latin-1"))
    client = scope.get("client")
    return auth.local_refusal(client[0] if client else None, headers) or host_refusal(
        headers.get("host"), headers.get("origin"), allowed_names()
    )


class FrontDoor:
    """Pure ASGI middleware (http and websocket): the refusals above, and the framing headers on every answer."""

    def __init__(self, app) -> None:
        self.app = app

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] not in ("http", "websocket"):
            await self.app(scope, receive, send)
            return
        why = refusal(scope)
        if why is not None:
            await (_refuse_http(send, why) if scope["type"] == "http" else _refuse_websocket(scope, receive, send, why))
            return
        if scope["type"] == "websocket":
            await self.app(scope, receive, send)
            return

        async def framed(message) -> None:
            if message["type"] == "http.response.start":
                message = {**message, "headers": _with_frame_headers(message.get("headers", ()))}
            await send(message)

        await self.app(scope, receive, framed)


def _with_frame_headers(headers: Iterable[tuple[bytes, bytes]]) -> list[tuple[bytes, bytes]]:
    out = list(headers)
    present = {name.lower() for name, _ in out}
    out += [(name, value) for name, value in FRAME_HEADERS if name not in present]
    return out


def _plain(status: int, text: str) -> tuple[dict, dict]:
    body = (text + "\n").encode()
    headers = _with_frame_headers(
        [
            (b"content-type", b"text/plain; charset=utf-8"),
            (b"content-length", str(len(body)).encode()),
            (b"cache-control", b"no-store"),
            (b"x-content-type-options", b"nosniff"),
        ]
    )  # it quotes the request's Host
    return {"status": status, "headers": headers}, {"body": body}


async def _refuse_http(send, why: str) -> None:
    start, body = _plain(403, why)
    await send({"type": "http.response.start", **start})
    await send({"type": "http.response.body", **body})


async def _refuse_websocket(scope, receive, send, why: str) -> None:
    """Refuse the handshake: an HTTP 403 with the reason where the server can send one (uvicorn can), else a
    close (the client sees a 403 without the reason)."""
    message = await receive()
    if message["type"] != "websocket.connect":
        return
    if "websocket.http.response" in scope.get("extensions", {}):
        start, body = _plain(403, why)
        await send({"type": "websocket.http.response.start", **start})
        await send({"type": "websocket.http.response.body", **body})
    else:
        await send({"type": "websocket.close", "code": 1008, "reason": why[:120]})


def signed_in_user(request) -> auth.User | None:
    """Team mode: the person the request's sign-in cookie (Streamlit's signed `_streamlit_user`, read as Streamlit's
    websocket reads it) names, or None: no cookie, a bad signature, or a sign-in older than the session's maximum
    age. For the routes outside the pages (the live charts, downloads), which Streamlit's sign-in does not cover."""
    import json

    try:
        from streamlit.auth_util import get_cookie_with_chunks
        from streamlit.web.server.server_util import get_cookie_secret
        from streamlit.web.server.starlette.starlette_app_utils import decode_signed_value
        from streamlit.web.server.starlette.starlette_server_config import USER_COOKIE_NAME
    except ImportError:  # another Streamlit: nobody can be told apart, so nobody is admitted
        return None
    secret = get_cookie_secret()

    def cookie(name: str) -> bytes | None:
        raw = request.cookies.get(name)
        return None if raw is None else decode_signed_value(secret, name, raw.encode("latin-1"))

    try:
        claims = json.loads(get_cookie_with_chunks(cookie, USER_COOKIE_NAME) or b"null")
    except ValueError:
        return None
    if not isinstance(claims, dict) or not claims.get("is_logged_in") or auth.sign_in_too_old(claims):
        return None
    return auth.user_from_claims(claims)


def middleware() -> list:
    """For st.App(middleware=...)."""
    from starlette.middleware import Middleware

    return [Middleware(FrontDoor)]
