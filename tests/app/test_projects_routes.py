"""Projects on the routes outside the pages (app/web/access.py): in team mode a person gets a run's artifacts, a
registered model's files and a running run's live charts only from a project they may read. To anyone else the
artifact, the model and the grant do not exist: the same status and the same words as an id or a name nobody made,
so nothing can be learnt by probing. The default project stays open to every member, as before projects.

The routes are asked through Starlette's test client (the sign-in cookie signed as Streamlit signs it), and once
through a real team-mode dashboard (`torchdeck ui`): the Run page's own grant stops serving a viewer at the first
request after they were taken off the project."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterator
from pathlib import Path

import pytest
from seeding import seed_run
from sqlalchemy import update
from starlette.applications import Starlette
from starlette.testclient import TestClient
from streamlit_session import ISSUER, SITE, get, live_run_page, port_of, sign_in_cookie, stream, team_env
from test_registry import exported_run

from app import auth
from app.live import route
from app.live.route import HEADER, PATH, Grants
from app.services import registry
from app.web import downloads, model_downloads
from db import projects, repo
from db.engine import make_engine
from db.models import Run
from tests.e2e.conftest import serve_ui

pytestmark = pytest.mark.timeout(300)
ANA = {"iss": ISSUER, "sub": "ana", "name": "Ana", "email": "ana@example.com", "email_verified": True}
BOB = {"iss": ISSUER, "sub": "bob", "name": "Bob", "email": "bob@example.com", "email_verified": True}
ROOT = {"iss": ISSUER, "sub": "root", "name": "Root", "email": "root@example.com", "email_verified": True}
ANA_KEY, BOB_KEY = f"{ISSUER}#ana", f"{ISSUER}#bob"
PRIVATE = "vision"


def into_project(engine, run_id: str, project: str) -> None:
    """The run moved to `project` (as if it had been submitted there)."""
    with engine.begin() as conn:
        conn.execute(update(Run).where(Run.id == run_id).values(project=project))


def private_project(engine, viewers: tuple[str, ...] = ()) -> None:
    """PRIVATE: seen by its listed people only (and admins), `viewers` listed as viewers."""
    projects.create_project(engine, PRIVATE, by="admin", description="the vision team", maintainer=False)
    for person in viewers:
        projects.set_member(engine, PRIVATE, person, "viewer", by="admin")


def artifact(engine, home: Path, project: str, data: bytes = b"onnx-bytes"):
    run = seed_run(engine, "r")
    into_project(engine, run.id, project)
    path = home / "artifacts" / "runs" / run.id / "export" / "model.onnx"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)
    digest = hashlib.sha256(data).hexdigest()
    return repo.add_artifact(engine, run.id, "onnx", path.as_uri(), size=len(data), sha256=digest, meta={})


def cookie(claims: dict) -> dict[str, str]:
    """The sign-in cookie Streamlit sets for these claims, signed with this process's cookie secret."""
    from streamlit.web.server.server_util import get_cookie_secret
    from streamlit.web.server.starlette.starlette_app_utils import create_signed_value

    payload = json.dumps({**claims, "is_logged_in": True, "provider": "default"})
    return {"_streamlit_user": create_signed_value(get_cookie_secret(), "_streamlit_user", payload).decode()}


@pytest.fixture
def team(home, monkeypatch) -> None:
    monkeypatch.setenv("TORCHDECK_MODE", "team")
    monkeypatch.setenv("TORCHDECK_ADMINS", ROOT["email"])


@pytest.fixture
def client(home, monkeypatch) -> Iterator[TestClient]:
    """The artifact and model routes as app/server.py mounts them."""
    monkeypatch.setenv(downloads.SERVED_ENV, "0")  # routes() sets it: restored (unset) after the test
    routes = downloads.routes() + model_downloads.routes()
    with TestClient(Starlette(routes=routes), client=("127.0.0.1", 50000)) as c:
        yield c


def as_(client: TestClient, claims: dict, path: str):
    client.cookies.clear()
    client.cookies.update(cookie(claims))
    return client.get(path)


def test_a_private_projects_artifact_is_not_found_for_a_non_member_and_served_to_its_viewer(team, client, engine, home):
    private_project(engine, viewers=(ANA_KEY,))
    art = artifact(engine, home, PRIVATE)
    nobodys = "Z" * len(art.id)  # an id of the same length that names nothing
    refused, unknown = as_(client, BOB, downloads.url(art.id)), as_(client, BOB, downloads.url(nobodys))
    assert refused.status_code == unknown.status_code == 404 and b"onnx" not in refused.content
    assert refused.text == unknown.text.replace(nobodys, art.id)  # word for word: probing an id tells nothing
    assert dict(refused.headers) == dict(unknown.headers)
    got = as_(client, ANA, downloads.url(art.id))
    assert got.status_code == 200 and got.content == b"onnx-bytes"
    assert as_(client, ROOT, downloads.url(art.id)).content == b"onnx-bytes"  # an admin sees every project
    projects.remove_member(engine, PRIVATE, ANA_KEY)
    assert as_(client, ANA, downloads.url(art.id)).status_code == 404  # at the next request after her removal


def test_a_viewer_listed_by_verified_email_gets_the_download(team, client, engine, home):
    private_project(engine, viewers=("ana@example.com",))
    art = artifact(engine, home, PRIVATE)
    assert as_(client, ANA, downloads.url(art.id)).content == b"onnx-bytes"
    unverified = {**ANA, "email_verified": False}  # anyone may type that address at the provider
    assert as_(client, unverified, downloads.url(art.id)).status_code == 404


def test_the_default_project_serves_every_member_as_before(team, client, engine, home):
    art = artifact(engine, home, "default")
    for who in (ANA, BOB):
        got = as_(client, who, downloads.url(art.id))
        assert got.status_code == 200 and got.content == b"onnx-bytes", who["sub"]


def registered(engine, home, project: str, name: str = "digits") -> None:
    """`name` version 1 from a run of `project`, `production` pointing at it (registered by the operator)."""
    run = exported_run(engine, home, b"onnx-" + name.encode())
    into_project(engine, run.id, project)
    registry.register(run.id, name, auth.local_user(), engine)
    registry.set_alias(name, "production", 1, auth.local_user(), engine)


def test_a_private_projects_model_is_not_found_for_a_non_member_by_alias_and_by_version(team, client, engine, home):
    private_project(engine, viewers=(ANA_KEY,))
    registered(engine, home, PRIVATE)
    registered(engine, home, "default", "shared")
    by_alias, by_version = (model_downloads.url("digits", ref, "model.onnx") for ref in ("production", 1))
    for link in (by_alias, by_version):
        refused = as_(client, BOB, link)
        unknown = as_(client, BOB, link.replace("digits", "nothing"))
        assert refused.status_code == unknown.status_code == 404 and b"onnx" not in refused.content, link
        assert refused.text == unknown.text.replace("nothing", "digits")
        assert refused.text == "Refused: there is no registered model 'digits'.\n"
        got = as_(client, ANA, link)
        assert got.status_code == 200 and got.content == b"onnx-digits", link
    shared = as_(client, BOB, model_downloads.url("shared", "production", "model.onnx"))
    assert shared.status_code == 200 and shared.content == b"onnx-shared"  # the default project: every member


# --- the live charts' feed -----------------------------------------------------------------------


@pytest.fixture
def live(team, monkeypatch) -> Iterator[tuple[Grants, TestClient]]:
    """The live route on a grants table of its own, every grant's session taken as still there."""
    grants = Grants(alive=lambda _session: True)
    with TestClient(Starlette(routes=route.routes(grants)), client=("127.0.0.1", 50000)) as c:
        yield grants, c


def ask(client: TestClient, claims: dict, token: str) -> tuple[int, dict]:
    client.cookies.clear()
    client.cookies.update(cookie(claims))
    got = client.get(PATH, headers={HEADER: token})
    return got.status_code, got.json()


def test_a_grant_serves_a_private_run_only_while_its_holder_may_read_the_project(live, engine):
    grants, client = live
    private_project(engine, viewers=(ANA_KEY,))
    run = seed_run(engine, "live", status="running", steps=5)
    into_project(engine, run.id, PRIVATE)
    anas, bobs = (grants.make("tab", key, run.id, "step", 0.0) for key in (ANA_KEY, BOB_KEY))
    status, body = ask(client, ANA, anas)
    assert status == 200 and "Loss" in [c["title"] for c in body["charts"]]
    unknown = ask(client, BOB, "no-such-grant")
    assert ask(client, BOB, bobs) == unknown == (404, {"error": "unknown or expired grant"})  # never for Bob's run
    projects.remove_member(engine, PRIVATE, ANA_KEY)
    assert ask(client, ANA, anas) == unknown  # the next request after her removal
    projects.set_member(engine, PRIVATE, ANA_KEY, "viewer", by="admin")
    assert ask(client, ANA, anas) == unknown  # the refused grant was dropped: her page must ask for a new one
    again = grants.make("tab", ANA_KEY, run.id, "step", 0.0)
    assert ask(client, ANA, again)[0] == 200


def test_a_grant_for_a_default_project_run_serves_every_member(live, engine):
    grants, client = live
    run = seed_run(engine, "live", status="running", steps=5)
    for claims, key in ((ANA, ANA_KEY), (BOB, BOB_KEY)):
        assert ask(client, claims, grants.make("tab", key, run.id, "step", 0.0))[0] == 200, key


# --- on a real team dashboard --------------------------------------------------------------------

SECRET = "a-long-random-cookie-secret-for-project-tests"


def private_running_run(db_url: str) -> dict[str, str]:
    """serve_ui's seed: PRIVATE with Ana as a viewer, a running run in it and an artifact of that run."""
    engine = make_engine(db_url)
    try:
        private_project(engine, viewers=(ANA_KEY,))
        run = seed_run(engine, "live", status="running", steps=20, epochs=1)
        into_project(engine, run.id, PRIVATE)
        art = artifact(engine, Path(db_url.removeprefix("sqlite:///")).parent, PRIVATE)
        return {"run": run.id, "artifact": art.id, "db": db_url}
    finally:
        engine.dispose()


@pytest.fixture(scope="module")
def dashboard() -> Iterator[dict]:
    with serve_ui("torchdeck-projects-", private_running_run, **team_env(SECRET)) as (url, _, seeded):
        yield {"port": port_of(url), **seeded}


def test_on_a_real_dashboard_a_viewer_loses_the_feed_and_the_files_at_the_next_request(dashboard):
    port, origin = dashboard["port"], f"http://{SITE}"
    ana, bob = (f"_streamlit_user={sign_in_cookie(SECRET, origin, c)}" for c in (ANA, BOB))
    link = downloads.url(dashboard["artifact"])

    def fetch(path: str, jar: str, **headers: str):
        return get(port, path, {"Host": SITE, "Cookie": jar, **headers})

    refused, unknown = fetch(link, bob), fetch(downloads.url("Z" * len(dashboard["artifact"])), bob)
    assert refused.status == unknown.status == 404 and b"onnx" not in refused.body
    assert fetch(link, ana).body == b"onnx-bytes"
    with stream(port, host=SITE, cookies={"_streamlit_user": ana.partition("=")[2]}) as ws:
        feed = live_run_page(ws, dashboard["run"])
        assert fetch(PATH, ana, **{HEADER: feed["grant"]}).status == 200
        engine = make_engine(dashboard["db"])
        try:
            projects.remove_member(engine, PRIVATE, ANA_KEY)
        finally:
            engine.dispose()
        after = fetch(PATH, ana, **{HEADER: feed["grant"]})  # the very next request
        assert after.status == 404 and json.loads(after.body) == {"error": "unknown or expired grant"}
        assert fetch(link, ana).status == 404
