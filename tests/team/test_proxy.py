"""deploy/nginx.conf, as shipped, in front of a real dashboard: Debian's nginx with the file
templated to free ports and a throwaway certificate, `streamlit run app/main.py` behind it. The
page, its assets, the health endpoint and Streamlit's websocket (/_stcore/stream: upgrade, then a
whole script run streamed back) work through the proxy; HTTP redirects to HTTPS."""

from __future__ import annotations

import http.client
import os
import re
import shutil
import socket
import ssl
import subprocess
import sys
from pathlib import Path

import pytest

from db.migrate import upgrade
from tests._servers import free_port
from tests.team.conftest import ROOT, clean_env, stop, wait_http

pytestmark = pytest.mark.timeout(120)
HOST = "torchdeck.example.com"


def templated(tmp: Path, http_port: int, https_port: int, app_port: int) -> Path:
    """The shipped site file with only its ports and certificate paths replaced."""
    site = (ROOT / "deploy" / "nginx.conf").read_text()
    for old, new in {"listen 80;": f"listen 127.0.0.1:{http_port};",
                     "listen 443 ssl;": f"listen 127.0.0.1:{https_port} ssl;",
                     "server 127.0.0.1:8501;": f"server 127.0.0.1:{app_port};",
                     f"/etc/letsencrypt/live/{HOST}/fullchain.pem": str(tmp / "cert.pem"),
                     f"/etc/letsencrypt/live/{HOST}/privkey.pem": str(tmp / "key.pem")}.items():
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


@pytest.fixture(scope="module")
def proxied(tmp_path_factory):
    nginx = shutil.which("nginx") or ("/usr/sbin/nginx" if Path("/usr/sbin/nginx").exists() else None)
    if nginx is None:
        pytest.fail("nginx is not installed (make test installs it: apt-get install nginx)", pytrace=False)
    tmp = tmp_path_factory.mktemp("proxy")
    url = f"sqlite:///{tmp / 'torchdeck.db'}"
    upgrade(url)
    app_port, http_port, https_port = free_port(), free_port(), free_port()
    log = tmp / "streamlit.log"
    env = clean_env(TORCHDECK_DATABASE_URL=url, TORCHDECK_HOME=str(tmp / "home"), TORCHDECK_MODE="local",
                    TORCHDECK_BROKER_URL="redis://127.0.0.1:1/0")
    app = subprocess.Popen([sys.executable, "-m", "streamlit", "run", "app/main.py", "--server.address", "127.0.0.1",
                            "--server.port", str(app_port), "--server.headless", "true",
                            "--browser.gatherUsageStats", "false"],
                           cwd=ROOT, env=env, stdout=log.open("wb"), stderr=subprocess.STDOUT)
    proxy = None
    try:
        subprocess.run(["openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes",
                        "-keyout", str(tmp / "key.pem"), "-out", str(tmp / "cert.pem"), "-days", "1", "-subj", f"/CN={HOST}"],
                       check=True, capture_output=True, timeout=30)
        conf = templated(tmp, http_port, https_port, app_port)
        base = [nginx, "-p", str(tmp), "-e", str(tmp / "error.log"), "-c", str(conf)]
        checked = subprocess.run([*base, "-t"], check=False, capture_output=True, text=True, timeout=30)
        assert checked.returncode == 0, checked.stderr
        proxy = subprocess.Popen([*base, "-g", "daemon off;"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        wait_http(f"http://127.0.0.1:{app_port}/_stcore/health", app, timeout=90, log=log)
        _wait_proxy(https_port, proxy, tmp / "error.log")  # nginx and the app start side by side: either may be last
        yield {"https": https_port, "http": http_port, "tmp": tmp}
    finally:
        if proxy is not None:
            stop(proxy)
        stop(app)


def _wait_proxy(port: int, proxy: subprocess.Popen, log: Path, timeout: float = 60) -> None:
    """Until the health endpoint answers 200 through nginx (HTTPS), or fail with nginx's error log."""
    import time

    deadline = time.monotonic() + timeout
    last: object = None
    while time.monotonic() < deadline and proxy.poll() is None:
        try:
            r = get(port, "/_stcore/health")
            r.read()
            if r.status == 200:
                return
            last = r.status
        except OSError as e:
            last = e
        time.sleep(0.3)
    tail = log.read_text()[-3000:] if log.exists() else ""
    raise AssertionError(f"nginx on {port} did not pass /_stcore/health through within {timeout:.0f} s "
                         f"({last}; exit {proxy.poll()})\n{tail}")


def tls() -> ssl.SSLContext:
    ctx = ssl.create_default_context()
    ctx.check_hostname = False
    ctx.verify_mode = ssl.CERT_NONE  # the throwaway certificate
    return ctx


def get(port: int, path: str, *, https: bool = True) -> http.client.HTTPResponse:
    conn = (http.client.HTTPSConnection("127.0.0.1", port, context=tls(), timeout=15) if https
            else http.client.HTTPConnection("127.0.0.1", port, timeout=15))
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
    return connect(f"wss://{HOST}:{port}/_stcore/stream", sock=sock, ssl=tls(), origin=origin,
                   subprotocols=["streamlit"], open_timeout=15, max_size=None)


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
