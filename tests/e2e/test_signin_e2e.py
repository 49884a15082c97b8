"""Sign-in end to end: the dashboard in team mode (`torchdeck ui`, TORCHDECK_MODE=team) behind a real
OpenID Connect provider (oidc-provider-mock, a separate process), driven by Chromium. Runs are seeded
straight into the database (no training: the test is about who may see and touch them).

Anonymous visitors get the sign-in screen and no data; Ana sees Bob's runs but cannot cancel or delete
them (buttons disabled, and the service refuses too); the admin can do both. The dashboard has an
allow-list (a domain and a group): someone the provider signs in who matches neither gets a refusal
page, whatever name or unverified address they gave the provider."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from conftest import SHOTS, STILL_JS, ends_with_us, free_port, keep_logs, settled, stop_group, wait_http
from playwright.sync_api import expect

from app import auth
from app.services.artifacts import InvalidArtifactId, read_artifact
from app.services.runs import cancel, remove
from db import repo
from db.engine import make_engine
from db.migrate import upgrade

ROOT = Path(__file__).resolve().parents[2]
ANA, BOB, ADMIN = "ana@example.com", "bob@example.com", "root@example.com"
# Besides them, at the provider: Eve (a verified address of another domain), Carol (another domain, but
# in the allowed group), and Mallory, who typed the admin's address as her username and unverified e-mail.
OTHERS = [
    {"sub": "eve", "email": "eve@elsewhere.org", "email_verified": True, "name": "Eve"},
    {"sub": "carol", "email": "carol@partner.org", "email_verified": True, "name": "Carol", "groups": ["ml-lab"]},
    {"sub": "mallory", "preferred_username": ADMIN, "email": ADMIN, "email_verified": False},
]
SPEC = {"name": "seeded", "data": {"name": "digits", "image_size": 16}, "train": {"epochs": 1}}
pytestmark = pytest.mark.timeout(180)


def start(cmd: list[str], env: dict[str, str], log: Path) -> subprocess.Popen:
    with open(log, "wb") as out:
        return subprocess.Popen(
            ends_with_us(cmd), cwd=ROOT, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True
        )


def seed(url: str, home: Path) -> dict[str, str]:
    upgrade(url)
    engine = make_engine(url)
    try:
        running = repo.create_run(engine, SPEC, name="bob-running", owner=BOB)
        repo.claim_run(engine, running.id, "w1", device="cpu")
        repo.heartbeat(engine, running.id, worker_id="w1", progress=0.4)
        ids = {"bob-running": running.id}
        for name, owner in (("bob-done", BOB), ("ana-done", ANA)):
            r = repo.create_run(engine, SPEC, name=name, owner=owner)
            repo.claim_run(engine, r.id, "w1", device="cpu")
            repo.finish_run(engine, r.id, "completed", summary={"status": "completed"})
            ids[name] = r.id
        onnx = home / "artifacts" / "runs" / ids["ana-done"] / "export" / "model.onnx"
        onnx.parent.mkdir(parents=True)
        onnx.write_bytes(b"onnx-bytes")
        ids["artifact"] = repo.add_artifact(engine, ids["ana-done"], "onnx", onnx.as_uri(), size=10).id
        return ids
    finally:
        engine.dispose()


@pytest.fixture(scope="module")
def team() -> Iterator[dict]:
    """An OpenID provider with six users, and the dashboard in team mode using it, with an allow-list."""
    home = Path(tempfile.mkdtemp(prefix="torchdeck-signin-"))
    db_url = f"sqlite:///{home / 'torchdeck.db'}"
    ids = seed(db_url, home)
    idp_port, ui_port = free_port(), free_port()
    users = [
        json.dumps({"sub": who, "email": who, "email_verified": True, "name": who.split("@")[0].title()})
        for who in (ANA, BOB, ADMIN)
    ] + [json.dumps(u) for u in OTHERS]
    idp_env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    idp = start(
        [
            sys.executable,
            "-m",
            "oidc_provider_mock",
            "--port",
            str(idp_port),
            *[arg for u in users for arg in ("--user-claims", u)],
        ],
        idp_env,
        home / "idp.log",
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith("TORCHDECK_")}
    url = f"http://127.0.0.1:{ui_port}"
    env.update(
        TORCHDECK_HOME=str(home),
        TORCHDECK_DATABASE_URL=db_url,
        TORCHDECK_BROKER_URL="redis://127.0.0.1:1/0",
        TORCHDECK_MODE="team",
        TORCHDECK_UI_ADDRESS="127.0.0.1",
        TORCHDECK_ADMINS=ADMIN,
        TORCHDECK_ALLOWED_DOMAINS="example.com",
        TORCHDECK_ALLOWED_GROUPS="ml-lab",
        TORCHDECK_OIDC_ISSUER=f"http://127.0.0.1:{idp_port}",
        TORCHDECK_OIDC_CLIENT_ID="torchdeck",
        TORCHDECK_OIDC_CLIENT_SECRET="s3cret",
        TORCHDECK_OIDC_REDIRECT_URI=f"{url}/oauth2callback",
        TORCHDECK_OIDC_COOKIE_SECRET="a-long-random-cookie-secret-for-tests",
        PYTHONUNBUFFERED="1",
    )
    ui = start([str(Path(sys.executable).parent / "torchdeck"), "ui", "--port", str(ui_port)], env, home / "ui.log")
    try:
        wait_http(f"http://127.0.0.1:{idp_port}/.well-known/openid-configuration", 30, idp, home / "idp.log")
        wait_http(f"{url}/_stcore/health", 60, ui, home / "ui.log")
        yield {"url": url, "ids": ids, "db": db_url, "home": home, "issuer": f"http://127.0.0.1:{idp_port}"}
    finally:
        stop_group(ui)
        stop_group(idp)
        keep_logs(__name__, list(home.glob("*.log")))
        shutil.rmtree(home, ignore_errors=True)


def new_page(browser, **options):
    """A page of a fresh browser context (no cookies). Every wait on it is for something the user would
    see, bounded generously: a busy or slow machine takes longer, never forever."""
    page = browser.new_context(**options).new_page()
    page.set_default_timeout(60_000)
    return page


def through_the_provider(browser, team: dict, who: str):
    """A fresh browser (no cookies) goes through the provider's form as `who` (a predefined user's subject)."""
    page = new_page(browser, viewport={"width": 1400, "height": 1000})
    page.goto(team["url"])
    button(page, "Sign in").wait_for()
    settled(page)  # the sign-in screen's script run drawn: a click during it can land on a button being redrawn
    button(page, "Sign in").click()
    page.get_by_role("button", name=who, exact=True).click()  # the provider's form: a predefined user
    return page


def sign_in(browser, team: dict, who: str):
    """A member signs in: the dashboard says who is signed in."""
    page = through_the_provider(browser, team, who)
    page.get_by_text("signed in as").wait_for()
    return page


# settled(page) (conftest): the app has finished its script run, nothing on the page is stale or still a
# placeholder, and nothing moves: what is drawn is all the server will draw for the last interaction.


def select_only(page, url: str, name: str) -> None:
    """The runs table filtered to one run, and that row selected (its checkbox is drawn on a canvas)."""
    # Always a fresh page (a new session, signed in by its cookie): a selection made under the previous
    # filter would survive the filter change, and clicking its row again would clear it.
    page.goto(url)  # the Runs page is the default one, at the root
    box = page.locator(".st-key-runs-text input")
    box.fill(name)
    box.press("Enter")
    grid = page.locator("[data-testid='stDataFrame']").first
    # The filtered table (its row is this run's) and the rerun that drew it finished: the caption and the
    # buttons on the page are those of this filter, not the previous one's.
    grid.locator("td[role='gridcell']", has_text=name).first.wait_for(state="attached")
    settled(page)
    page.get_by_text("1 run(s) match").wait_for()
    expect(page.locator(".st-key-runs-open button")).to_be_disabled(timeout=60_000)  # nothing selected yet
    page.wait_for_function(STILL_JS, arg=grid.element_handle(), timeout=60_000)
    bounds = grid.bounding_box()
    page.mouse.click(bounds["x"] + 18, bounds["y"] + 35 + 17)  # first data row, row-marker column
    # Exactly one row selected: "Open" and "Clone" enabled, and the action bar drawn anew (nothing stale).
    page.locator(".st-key-runs-open button:enabled").wait_for(timeout=60_000)
    page.locator(".st-key-runs-clone button:enabled").wait_for(timeout=60_000)
    settled(page)


def button(page, name: str):
    return page.get_by_role("button", name=name, exact=True)


def shot(page, name: str) -> None:
    SHOTS.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=str(SHOTS / name), full_page=True)


def test_anonymous_visitors_see_no_data(team, browser):
    page = new_page(browser)
    for path in ("", f"/run?id={team['ids']['bob-running']}", "/compare"):
        page.goto(team["url"] + path)
        button(page, "Sign in").wait_for()
        settled(page)  # the whole script run is drawn: nothing more can appear below the sign-in screen
        body = page.locator("body").inner_text()
        assert "bob-running" not in body and "bob-done" not in body and "run(s) match" not in body, path
    shot(page, "signin-01-anonymous.png")
    page.context.close()


def _ana_path(page, team: dict) -> None:
    assert page.get_by_text(f"({ANA})").count() == 1  # who is signed in, in the sidebar
    page.get_by_text("3 run(s) match").wait_for()  # everyone's runs, Bob's included
    page.goto(f"{team['url']}/run?id={team['ids']['bob-running']}")
    page.get_by_role("heading", name="bob-running").wait_for()
    assert button(page, "Cancel").is_disabled() and button(page, "Clone").is_enabled()
    shot(page, "signin-02-user-on-others-run.png")
    select_only(page, team["url"], "bob-done")
    assert button(page, "Delete").is_disabled() and button(page, "Clone").is_enabled()
    select_only(page, team["url"], "ana-done")
    expect(button(page, "Delete")).to_be_enabled(timeout=60_000)  # her own
    button(page, "Sign out").click()
    page.get_by_role("button", name="End session").click()  # the provider's logout form (end_session_endpoint)
    button(page, "Sign in").wait_for()
    page.goto(team["url"])  # the session cookie is gone: signed out for good
    button(page, "Sign in").wait_for()
    assert "bob-done" not in page.locator("body").inner_text()


def test_a_user_sees_others_runs_but_cannot_cancel_or_delete_them(team, browser):
    page = sign_in(browser, team, ANA)
    try:
        _ana_path(page, team)
    except BaseException:
        shot(page, "signin-zz-failure.png")
        raise
    finally:
        page.context.close()
    # The service refuses as well, whatever a client sends.
    engine = make_engine(team["db"])
    try:
        ana = auth.User(id=f"{team['issuer']}#{ANA}", name="Ana", email=ANA)
        with pytest.raises(auth.PermissionDenied):
            cancel(team["ids"]["bob-running"], engine=engine, by=ana)
        with pytest.raises(auth.PermissionDenied):
            remove(team["ids"]["bob-done"], engine=engine, by=ana)
        assert not repo.get_run(engine, team["ids"]["bob-running"]).cancel_requested
    finally:
        engine.dispose()


def _refused(page, team: dict, name: str) -> None:
    page.get_by_text(
        f"{name} is signed in but not a member of this dashboard; ask an admin to add you to TORCHDECK_ALLOWED_USERS"
    ).wait_for()
    settled(page)  # the whole script run is drawn: nothing more comes below the refusal
    body = page.locator("body").inner_text()
    assert "bob-running" not in body and "run(s) match" not in body and "signed in as" not in body
    assert button(page, "Sign out").is_visible() and not page.get_by_role("link", name="New run").count()


def test_only_members_of_the_allow_list_get_in(team, browser):
    """Eve (another domain) and Mallory (the admin's address, unverified) are refused; Carol (the group) and
    Ana (the domain) are members. Members are recorded as accounts, by issuer and subject."""
    engine = make_engine(team["db"])
    pages = []
    try:
        for who, name in (("eve", "Eve"), ("mallory", ADMIN)):  # Mallory's name: her preferred_username
            pages.append(page := through_the_provider(browser, team, who))
            _refused(page, team, name)
            page.goto(f"{team['url']}/run?id={team['ids']['bob-running']}")  # no page behind the refusal either
            _refused(page, team, name)
        shot(pages[0], "signin-05-not-a-member.png")
        button(pages[0], "Sign out").click()
        pages[0].get_by_role("button", name="End session").click()
        button(pages[0], "Sign in").wait_for()
        pages.append(carol := sign_in(browser, team, "carol"))
        carol.get_by_text("run(s) match").wait_for()
        assert carol.get_by_text("signed in as").inner_text().startswith("signed in as Carol (carol@partner.org)")
        known = repo.accounts(engine, [f"{team['issuer']}#{s}" for s in ("eve", "mallory", "carol")])
        assert [(a.name, a.email) for a in known.values()] == [("Carol", "carol@partner.org")]
    except BaseException:
        for i, page in enumerate(pages):
            shot(page, f"signin-zz-members-{i}.png")
        raise
    finally:
        engine.dispose()
        for page in pages:
            page.context.close()


def test_an_admin_may_cancel_and_delete_anyones_runs(team, browser):
    page = sign_in(browser, team, ADMIN)
    engine = make_engine(team["db"])
    try:
        page.get_by_text("admin").first.wait_for()
        page.goto(f"{team['url']}/run?id={team['ids']['bob-running']}")
        page.get_by_role("heading", name="bob-running").wait_for()
        settled(page)
        button(page, "Cancel").click()
        deadline = time.monotonic() + 120
        while not repo.get_run(engine, team["ids"]["bob-running"]).cancel_requested and time.monotonic() < deadline:
            time.sleep(0.2)
        assert repo.get_run(engine, team["ids"]["bob-running"]).cancel_requested
        select_only(page, team["url"], "bob-done")
        button(page, "Delete").click()
        button(page, "Delete permanently").click()
        page.get_by_text("deleted 1 run(s)").wait_for()
        with pytest.raises(repo.RunNotFound):
            repo.get_run(engine, team["ids"]["bob-done"])
        shot(page, "signin-03-admin.png")
    finally:
        engine.dispose()
        page.context.close()


def test_download_links_take_an_opaque_artifact_id_only(team, browser, tmp_path):
    """The shareable link /artifact?id=…: the registered id downloads the file (signed in); an unknown id
    and path-like ids are refused in the page; an anonymous visitor gets the sign-in screen."""
    anonymous = new_page(browser)
    anonymous.goto(f"{team['url']}/artifact?id={team['ids']['artifact']}")
    button(anonymous, "Sign in").wait_for()
    assert not anonymous.get_by_role("link", name="Download").count()
    anonymous.context.close()
    page = sign_in(browser, team, ANA)
    try:
        page.goto(f"{team['url']}/artifact?id={team['ids']['artifact']}")
        page.get_by_role("link", name="Download").wait_for()  # the download route's link (app/web/downloads.py)
        settled(page)
        with page.expect_download() as dl:
            page.get_by_role("link", name="Download").click()
        saved = tmp_path / "model.onnx"
        dl.value.save_as(saved)
        assert saved.read_bytes() == b"onnx-bytes"
        for bad, says in (
            ("0" * 32, "no artifact with id"),
            ("..%2F..%2Fetc%2Fpasswd", "never by a path"),
            ("runs%2Fx%2Fexport%2Fmodel.onnx", "never by a path"),
        ):
            page.goto(f"{team['url']}/artifact?id={bad}")
            page.get_by_text(says).wait_for()
            assert not page.get_by_role("button", name="Download").count()
        shot(page, "signin-04-artifact-refused.png")
    except BaseException:
        shot(page, "signin-zz-failure.png")
        raise
    finally:
        page.context.close()


def test_downloads_take_an_opaque_artifact_id_only(team, monkeypatch):
    """The download service (app.services.artifacts.read_artifact) behind the Artifacts tab and the artifact link: the
    registered id gives the file; an unknown id and anything path-like are refused."""
    from db.repo import ArtifactNotFound

    monkeypatch.setenv("TORCHDECK_HOME", str(team["home"]))
    monkeypatch.delenv("TORCHDECK_ARTIFACTS", raising=False)
    engine = make_engine(team["db"])
    try:
        assert read_artifact(team["ids"]["artifact"], engine=engine) == b"onnx-bytes"
        with pytest.raises(ArtifactNotFound):
            read_artifact("0" * 32, engine=engine)
        for bad in (
            "../../../etc/passwd",
            "runs/x/export/model.onnx",
            "/etc/passwd",
            "file:///etc/passwd",
            team["ids"]["artifact"] + "/..",
            "",
        ):
            with pytest.raises(InvalidArtifactId):
                read_artifact(bad, engine=engine)
    finally:
        engine.dispose()
