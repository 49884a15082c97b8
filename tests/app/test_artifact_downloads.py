"""Artifact downloads through the dashboard's download route (app/web/downloads.py): streamed a piece at a time
(a 128 MB checkpoint costs the dashboard a few MB, not 128), re-checked against the registered SHA-256
(a changed file is refused before its first byte), by opaque id only, and only for whom the pages admit. The
Artifact page links to the route where the dashboard serves it, and falls back on Streamlit's button (which
holds the file) only for small files elsewhere."""

from __future__ import annotations

import asyncio
import hashlib
import json
import os
import tracemalloc

import pytest
from seeding import seed_run
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.testclient import TestClient

from app.web import downloads
from db import repo

ISSUER = "https://sso.example.com/realms/lab"
ANA = {"iss": ISSUER, "sub": "ana", "name": "Ana", "email": "ana@example.com", "email_verified": True}


def _artifact(engine, home, data: bytes, name: str = "model.onnx", kind: str = "onnx"):
    run = seed_run(engine, "r")
    path = home / "artifacts" / "runs" / run.id / "export" / name
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)
    art = repo.add_artifact(
        engine, run.id, kind, path.as_uri(), size=len(data), sha256=hashlib.sha256(data).hexdigest(), meta={}
    )
    return art, path


@pytest.fixture
def client(home, monkeypatch):
    monkeypatch.setenv(downloads.SERVED_ENV, "0")  # routes() sets it: restored (unset) after the test
    with TestClient(Starlette(routes=downloads.routes()), client=("127.0.0.1", 50000)) as c:
        yield c


def test_the_route_serves_an_artifact_by_id_as_an_attachment(client, engine, home):
    data = os.urandom(3 << 20) + b"<script>alert(1)</script>"
    art, _ = _artifact(engine, home, data, name='ré sumé".html', kind="export_report")
    got = client.get(downloads.url(art.id))
    assert got.status_code == 200 and got.content == data
    assert got.headers["content-type"] == "application/octet-stream"  # never rendered in the dashboard's origin
    assert got.headers["x-content-type-options"] == "nosniff" and got.headers["content-length"] == str(len(data))
    assert got.headers["content-disposition"] == (
        "attachment; filename=\"r__sum__.html\"; filename*=UTF-8''r%C3%A9%20sum%C3%A9%22.html"
    )


def _drain(artifact_id: str) -> tuple[str, int, float]:
    """The route's answer read through as a server sends it: (sha256, status, peak MB traced meanwhile)."""
    scope = {
        "type": "http",
        "method": "GET",
        "path": downloads.url(artifact_id),
        "headers": [],
        "client": ("127.0.0.1", 50000),
        "query_string": b"",
        "path_params": {"artifact_id": artifact_id},
    }
    h = hashlib.sha256()

    async def read(answer) -> None:
        async for piece in answer.body_iterator:
            h.update(piece)

    tracemalloc.start()
    try:
        answer = downloads.download(Request(scope))
        asyncio.run(read(answer))
        peak = tracemalloc.get_traced_memory()[1] / 2**20
    finally:
        tracemalloc.stop()
    return h.hexdigest(), answer.status_code, peak


def test_a_128_mb_download_holds_a_few_mb_of_the_dashboards_memory(engine, home):
    """services.read_artifact (what Streamlit's button calls) held all 128 MB, for each download."""
    data = os.urandom(128 << 20)
    art, _ = _artifact(engine, home, data, name="best.pt", kind="checkpoint_best")
    digest, status, peak = _drain(art.id)
    assert status == 200 and digest == hashlib.sha256(data).hexdigest() == art.sha256
    assert peak < 50, f"the download held {peak:.0f} MB"


def test_a_file_changed_behind_its_id_is_refused_before_its_first_byte(client, engine, home):
    data = os.urandom(1 << 20)
    art, path = _artifact(engine, home, data)
    forged = data[:-5] + b"EVIL!"  # the same size: only the hash tells
    path.write_bytes(forged)
    got = client.get(downloads.url(art.id))
    assert got.status_code == 409 and b"EVIL" not in got.content
    assert f"sha256 {hashlib.sha256(forged).hexdigest()} ≠ {art.sha256}" in got.text and "refused" in got.text
    path.write_bytes(data)
    assert client.get(downloads.url(art.id)).content == data


def test_ids_that_are_not_ids_unknown_ids_and_files_outside_the_store_are_refused(client, engine, home):
    run = seed_run(engine, "r")
    outside = repo.add_artifact(engine, run.id, "checkpoint_best", (home / "torchdeck.db").as_uri(), size=1)
    for artifact_id, status, words in (
        ("%2e%2e", 400, "not an artifact id"),
        ("a.b", 400, "not an artifact id"),
        ("x" * 65, 400, "not an artifact id"),
        ("0" * 32, 404, "no artifact with id"),
        (outside.id, 404, "cannot be downloaded here"),
    ):
        got = client.get(f"{downloads.PATH}/{artifact_id}")
        assert got.status_code == status and words in got.text, (artifact_id, got.status_code, got.text)


def test_local_mode_answers_this_machine_only_and_never_through_a_proxy(client, engine, home):
    art, _ = _artifact(engine, home, b"onnx-bytes")
    got = client.get(downloads.url(art.id), headers={"X-Forwarded-For": "203.0.113.9"})
    assert got.status_code == 403 and "proxy" in got.text and b"onnx" not in got.content
    with TestClient(Starlette(routes=downloads.routes()), client=("203.0.113.9", 4000)) as remote:
        got = remote.get(downloads.url(art.id))
    assert got.status_code == 403 and "only answers on this machine" in got.text


def test_team_mode_serves_signed_in_members_only(client, engine, home, monkeypatch):
    from streamlit.web.server.server_util import get_cookie_secret
    from streamlit.web.server.starlette.starlette_app_utils import create_signed_value

    art, _ = _artifact(engine, home, b"onnx-bytes")
    monkeypatch.setenv("TORCHDECK_MODE", "team")
    monkeypatch.setenv("TORCHDECK_ALLOWED_DOMAINS", "example.com")

    def signed_in(claims: dict) -> dict[str, str]:
        payload = json.dumps({**claims, "is_logged_in": True, "provider": "default"})
        return {"_streamlit_user": create_signed_value(get_cookie_secret(), "_streamlit_user", payload).decode()}

    assert client.get(downloads.url(art.id)).status_code == 403  # nobody signed in
    client.cookies.update(signed_in({**ANA, "email": "eve@elsewhere.example", "sub": "eve"}))
    got = client.get(downloads.url(art.id))
    assert got.status_code == 403 and "not a member" in got.text
    client.cookies.clear()
    client.cookies.update({"_streamlit_user": "forged"})
    assert client.get(downloads.url(art.id)).status_code == 403
    client.cookies.clear()
    client.cookies.update(signed_in(ANA))
    got = client.get(downloads.url(art.id))
    assert got.status_code == 200 and got.content == b"onnx-bytes"


def test_the_artifact_page_links_to_the_route_where_it_is_served(page, engine, home, monkeypatch):
    art, _ = _artifact(engine, home, b"onnx-bytes")
    monkeypatch.setenv(downloads.SERVED_ENV, "1")
    at = page("artifact.py", id=art.id)
    assert not at.exception and not at.error
    links = at.get("link_button")
    assert [b.proto.url for b in links] == [f"/_torchdeck/download/{art.id}"] and not at.get("download_button")


def test_elsewhere_the_page_holds_small_files_only(page, engine, home, monkeypatch):
    monkeypatch.setenv(downloads.SERVED_ENV, "0")
    small, _ = _artifact(engine, home, b"onnx-bytes")
    at = page("artifact.py", id=small.id)
    assert [b.label for b in at.get("download_button")] == ["Download"] and not at.get("link_button")
    big, path = _artifact(engine, home, b"", name="best.pt", kind="checkpoint_best")
    with open(path, "wb") as f:  # a sparse file: its size is what matters here
        f.truncate(downloads.FALLBACK_MAX_BYTES + 1)
    repo_big = repo.add_artifact(engine, big.run_id, "checkpoint_best", path.as_uri(), size=path.stat().st_size)
    at = page("artifact.py", id=repo_big.id)
    assert not at.exception and not at.get("download_button")
    assert any("torchdeck up" in c.value for c in at.caption), [c.value for c in at.caption]
