"""deploy/nginx.conf, as shipped, in front of a real dashboard: Debian's nginx with the file
templated to free ports and a throwaway certificate, `torchdeck ui` behind it. In team mode (the
deployment: sign-in) the page, its assets, the health endpoint and Streamlit's websocket
(/_stcore/stream: upgrade, then a whole script run streamed back) work through the proxy, and HTTP
redirects to HTTPS. In local mode (no sign-in) the dashboard refuses every request that came through
the proxy (its front door, app/web/front_door.py, before any page or file), in a real Chromium, while it still
answers this machine directly."""

from __future__ import annotations

import http.client
import os
import re
import shutil
import socket
import ssl
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from db.migrate import upgrade
from tests._servers import free_port
from tests.e2e.conftest import CHROMIUM, CHROMIUM_ARGS
from tests.team.conftest import ROOT, VENV_BIN, clean_env, stop, wait_http

pytestmark = pytest.mark.timeout(180)
HOST = "torchdeck.example.com"
# Team mode as a deployment configures it; the provider is never contacted (nobody signs in here).
TEAM = {
    "TORCHDECK_MODE": "team",
    "TORCHDECK_UI_ADDRESS": "127.0.0.1",
    "TORCHDECK_OIDC_ISSUER": "https://sso.example.com/realms/lab",
    "TORCHDECK_OIDC_CLIENT_ID": "torchdeck",
    "TORCHDECK_OIDC_CLIENT_SECRET": "s3cret",
    "TORCHDECK_OIDC_REDIRECT_URI": f"https://{HOST}/oauth2callback",
    "TORCHDECK_OIDC_COOKIE_SECRET": "a-long-random-cookie-secret-for-tests",
}


def templated(tmp: Path, http_port: int, https_port: int, app_port: int) -> Path:
    """The shipped site file with only its ports and certificate paths replaced."""
    site = (ROOT / "deploy" / "nginx.conf").read_text()
    for old, new in {
        "listen 80;": f"listen 127.0.0.1:{http_port};",
        "listen 443 ssl;": f"listen 127.0.0.1:{https_port} ssl;",
        "server 127.0.0.1:8501;": f"server 127.0.0.1:{app_port};",
        f"/etc/letsencrypt/live/{HOST}/fullchain.pem": str(tmp / "cert.pem"),
        f"/etc/letsencrypt/live/{HOST}/privkey.pem": str(tmp / "key.pem"),
    }.items():
        assert site.count(old) == 1, f"deploy/nginx.conf no longer has {old!r} once: update this test's template"
        site = site.replace(old, new)
    (tmp / "torchdeck.conf").write_text(site)
    main = tmp / "nginx.conf"
    user = "user root;\n" if os.geteuid() == 0 else ""  # temp files stay in this private folder
    main.write_text(f"""{user}worker_processes 1;
pid {tmp}/nginx.pid;
error_log {tmp}/error.log;
events {{ worker_connections 64; }}
http {{
    access_log {tmp}/access.log;
    client_body_temp_path {tmp}/body;
    proxy_temp_path {tmp}/proxy;
    fastcgi_temp_path {tmp}/fastcgi;
    uwsgi_temp_path {tmp}/uwsgi;
    scgi_temp_path {tmp}/scgi;
    include {tmp}/torchdeck.conf;
}}
""")
    return main


@contextmanager
def behind_nginx(tmp: Path, mode: dict[str, str], ready: int = 200) -> Iterator[dict]:
    """`torchdeck ui` in `mode` (its environment) on a free port, the shipped nginx site in front of it; ready
    once the health endpoint answers `ready` through nginx (local mode refuses it: 403)."""
    nginx = shutil.which("nginx") or ("/usr/sbin/nginx" if Path("/usr/sbin/nginx").exists() else None)
    if nginx is None:
        pytest.fail("nginx is not installed (make test installs it: apt-get install nginx)", pytrace=False)
    url = f"sqlite:///{tmp / 'torchdeck.db'}"
    upgrade(url)
    app_port, http_port, https_port = free_port(), free_port(), free_port()
    log = tmp / "streamlit.log"
    env = clean_env(
        TORCHDECK_DATABASE_URL=url,
        TORCHDECK_HOME=str(tmp / "home"),
        TORCHDECK_BROKER_URL="redis://127.0.0.1:1/0",
        **mode,
    )
    app = subprocess.Popen(
        [str(VENV_BIN / "torchdeck"), "ui", "--port", str(app_port)],
        cwd=ROOT,
        env=env,
        stdout=log.open("wb"),
        stderr=subprocess.STDOUT,
    )
    proxy = None
    try:
        subprocess.run(
            [
                "openssl",
                "req",
                "-x509",
                "-newkey",
                "ec",
                "-pkeyopt",
                "ec_paramgen_curve:prime256v1",
                "-nodes",
                "-keyout",
                str(tmp / "key.pem"),
                "-out",
                str(tmp / "cert.pem"),
                "-days",
                "1",
                "-subj",
                f"/CN={HOST}",
            ],
            check=True,
            capture_output=True,
            timeout=30,
        )
        conf = templated(tmp, http_port, https_port, app_port)
        base = [nginx, "-p", str(tmp), "-e", str(tmp / "error.log"), "-c", str(conf)]
        checked = subprocess.run([*base, "-t"], check=False, capture_output=True, text=True, timeout=30)
        assert checked.returncode == 0, checked.stderr
        proxy = subprocess.Popen([*base, "-g", "daemon off;"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        wait_http(f"http://127.0.0.1:{app_port}/_stcore/health", app, timeout=90, log=log)
        _wait_proxy(https_port, proxy, tmp / "error.log", ready)  # nginx and the app start side by side
        yield {"https": https_port, "http": http_port, "app": app_port, "tmp": tmp}
    finally:
        if proxy is not None:
            stop(proxy)
        stop(app)


@pytest.fixture(scope="module")
def proxied(tmp_path_factory) -> Iterator[dict]:
    """The deployment: team mode behind nginx."""
    with behind_nginx(tmp_path_factory.mktemp("proxy"), TEAM) as served:
        yield served


@pytest.fixture(scope="module")
def proxied_local(tmp_path_factory) -> Iterator[dict]:
    """Local mode (no sign-in) put behind the shipped nginx anyway."""
    with behind_nginx(tmp_path_factory.mktemp("proxy-local"), {"TORCHDECK_MODE": "local"}, ready=403) as served:
        yield served


@pytest.fixture(scope="module")
def browser() -> Iterator:
    """Chromium resolving the site's name to this machine, as a visitor's browser resolves it to the proxy."""
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        b = p.chromium.launch(
            executable_path=CHROMIUM, args=[*CHROMIUM_ARGS, f"--host-resolver-rules=MAP {HOST} 127.0.0.1"]
        )
        yield b
        b.close()


IDLE_JS = """() => {
    const app = document.querySelector("[data-testid='stApp']");
    return app && app.getAttribute("data-test-script-state") === "notRunning"; }"""


def visit(browser, url: str):
    """A fresh visitor's page at `url`, once its script run is drawn (bounded generously, never a fixed sleep)."""
    page = browser.new_context(ignore_https_errors=True).new_page()  # the throwaway certificate
    page.set_default_timeout(60_000)
    page.goto(url)
    page.locator("[data-testid='stMain']").wait_for()
    page.wait_for_function(IDLE_JS, timeout=60_000)
    return page


def _wait_proxy(port: int, proxy: subprocess.Popen, log: Path, ready: int = 200, timeout: float = 60) -> None:
    """Until the health endpoint answers `ready` through nginx (HTTPS), or fail with nginx's error log."""
    import time

    deadline = time.monotonic() + timeout
    last: object = None
    while time.monotonic() < deadline and proxy.poll() is None:
        try:
            r = get(port, "/_stcore/health")
            r.read()
            if r.status == ready:
                return
            last = r.status
        except OSError as e:
            last = e
        time.sleep(0.3)
    tail = log.read_text()[-3000:] if log.exists() else ""
    raise AssertionError(
        f"nginx on {port} did not pass /_stcore/health through within {timeout:.0f} s "
        f"({last}; exit {proxy.poll()})\n{tail}"
    )


def tls() -> ssl.SSLContext:
    ctx = ssl.create_default_context()
    ctx.check_hostname = False
    ctx.verify_mode = ssl.CERT_NONE  # the throwaway certificate
    return ctx


def get(port: int, path: str, *, https: bool = True) -> http.client.HTTPResponse:
    conn = (
        http.client.HTTPSConnection("127.0.0.1", port, context=tls(), timeout=15)
        if https
        else http.client.HTTPConnection("127.0.0.1", port, timeout=15)
    )
    conn.request("GET", path, headers={"Host": f"{HOST}:{port}" if https else HOST})
    return conn.getresponse()


def test_page_and_assets_through_the_proxy(proxied):
    page = get(proxied["https"], "/")
    body = page.read().decode()
    assert page.status == 200
    assert '<div id="root">' in body
    scripts = re.findall(r'src="\.?/?(static/js/[^"]+\.js)"', body)
    assert scripts, body[:500]
    asset = get(proxied["https"], "/" + scripts[0])
    assert asset.status == 200 and len(asset.read()) > 10_000
    health = get(proxied["https"], "/_stcore/health")
    assert health.status == 200 and health.read() == b"ok"


def test_http_redirects_to_https(proxied):
    r = get(proxied["http"], "/runs?x=1", https=False)
    assert r.status == 301
    assert r.getheader("Location") == f"https://{HOST}/runs?x=1"


def _stream(port: int, origin: str):
    """Open /_stcore/stream as a browser on https://torchdeck.example.com:PORT would (its Host and Origin)."""
    from websockets.sync.client import connect

    sock = socket.create_connection(("127.0.0.1", port), timeout=15)
    return connect(
        f"wss://{HOST}:{port}/_stcore/stream",
        sock=sock,
        ssl=tls(),
        origin=origin,
        subprotocols=["streamlit"],
        open_timeout=15,
        max_size=None,
    )


def test_websocket_upgrade_and_a_whole_script_run(proxied):
    from streamlit.proto.BackMsg_pb2 import BackMsg
    from streamlit.proto.ClientState_pb2 import ClientState
    from streamlit.proto.ForwardMsg_pb2 import ForwardMsg

    port = proxied["https"]
    with _stream(port, f"https://{HOST}:{port}") as ws:
        assert ws.response.status_code == 101
        assert ws.response.headers["Upgrade"].lower() == "websocket"
        ws.send(BackMsg(rerun_script=ClientState(query_string="", page_script_hash="")).SerializeToString())
        kinds: list[str] = []
        while "script_finished" not in kinds:
            msg = ForwardMsg.FromString(ws.recv(timeout=60))
            kinds.append(msg.WhichOneof("type"))
    assert kinds[0] == "new_session" or "new_session" in kinds
    assert "delta" in kinds  # the page's elements came back through the proxy


def test_websocket_from_another_site_is_still_refused(proxied):
    """The proxy keeps Streamlit's origin check working (it passes the real Host through)."""
    from websockets.exceptions import InvalidStatus

    with pytest.raises(InvalidStatus) as refused:
        _stream(proxied["https"], "https://evil.example.net")
    assert refused.value.response.status_code == 403


def test_team_mode_through_the_proxy_shows_the_sign_in_screen(proxied, browser):
    page = visit(browser, f"https://{HOST}:{proxied['https']}/")
    try:
        page.get_by_role("button", name="Sign in").wait_for()
        assert "came through a proxy" not in page.locator("body").inner_text()
    finally:
        page.context.close()


def test_local_mode_refuses_every_request_through_the_proxy(proxied_local, browser):
    """Through nginx every visitor arrives from 127.0.0.1: the proxy's headers give them away, on every route."""
    for path in ("/", "/new", "/workers", "/_stcore/health", "/_torchdeck/live", "/static/js/anything.js"):
        refused = get(proxied_local["https"], path)
        text = refused.read().decode()
        assert refused.status == 403, path
        assert "came through a proxy" in text and "run it with TORCHDECK_MODE=team" in text, path
    page = browser.new_context(ignore_https_errors=True).new_page()  # what a visitor sees
    try:
        page.set_default_timeout(60_000)
        page.goto(f"https://{HOST}:{proxied_local['https']}/run")
        page.get_by_text("runs in local mode, without sign-in, and this request came through a proxy").wait_for()
        assert "No runs yet" not in page.locator("body").inner_text()
    finally:
        page.context.close()
    direct = visit(browser, f"http://127.0.0.1:{proxied_local['app']}/")  # this machine, no proxy: served
    try:
        direct.get_by_text("No runs yet").wait_for()
        assert "came through a proxy" not in direct.locator("body").inner_text()
    finally:
        direct.context.close()
