"""Sign-in and ownership (app/auth.py): who may cancel and delete a run (its owner or an admin), enforced
in app/services.py and reflected in the pages; team mode refuses to start without sign-in settings and
shows nothing before sign-in; local mode is served on 127.0.0.1 only."""

from __future__ import annotations

import stat
import tomllib

import pytest
from seeding import seed_run
from streamlit.testing.v1 import AppTest

from app import auth, services
from db import repo

ANA, BOB, ADMIN = "ana@example.com", "bob@example.com", "root@example.com"
OIDC = {env: f"value-of-{key}" for key, env in auth.OIDC_ENV.items()}


@pytest.fixture
def team(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(auth.MODE_ENV, "team")
    monkeypatch.setenv(auth.ADMINS_ENV, f" {ADMIN.upper()} , other-admin@example.com")


def user(email: str) -> auth.User:
    u = auth.user_from_claims({"is_logged_in": True, "email": email, "name": email.split("@")[0].title()})
    assert u is not None
    return u


# --- the rules -----------------------------------------------------------------------------------


def test_owner_and_admins_may_modify_others_may_not(team, engine):
    run = seed_run(engine, "bobs", owner=BOB, status="queued")
    assert auth.can_modify(user(BOB), run)
    assert auth.can_modify(user("Bob@Example.com"), run)  # addresses compare case-insensitively
    assert auth.can_modify(user(ADMIN), run) and user(ADMIN).is_admin
    assert not auth.can_modify(user(ANA), run) and not user(ANA).is_admin
    assert not auth.can_modify(None, run)


def test_identity_from_the_providers_claims(team):
    assert auth.user_from_claims({"is_logged_in": False, "email": ANA}) is None
    assert auth.user_from_claims({}) is None
    entra = auth.user_from_claims({"is_logged_in": True, "preferred_username": "Ana@Corp.example", "name": "Ana"})
    assert entra == auth.User(id="ana@corp.example", name="Ana", is_admin=False)
    # An address the provider has not verified is not trusted: claiming the admin's gives nothing.
    forged = auth.user_from_claims({"is_logged_in": True, "email": ADMIN, "email_verified": False, "sub": "x1"})
    assert forged is not None and forged.id == "x1" and not forged.is_admin


def test_local_mode_user_may_do_anything(monkeypatch, engine):
    monkeypatch.delenv(auth.MODE_ENV, raising=False)
    run = seed_run(engine, "someone's", owner=BOB, status="queued")
    assert not auth.team_mode() and auth.can_modify(auth.local_user(), run)
    assert services.cancel(run.id, engine=engine, by=auth.local_user()).status == "cancelled"


# --- enforced in the services ---------------------------------------------------------------------


def test_service_refuses_cancel_and_delete_by_another_user(team, engine, home):
    queued = seed_run(engine, "bob-queued", owner=BOB, status="queued")
    running = seed_run(engine, "bob-running", owner=BOB, status="running")
    done = seed_run(engine, "bob-done", owner=BOB)
    files = home / "artifacts" / "runs" / done.id
    files.mkdir(parents=True)
    (files / "best.pt").write_bytes(b"x")
    for r in (queued, running):
        with pytest.raises(auth.PermissionDenied, match=f"{ANA} may not cancel run {r.id}: it belongs to {BOB}"):
            services.cancel(r.id, engine=engine, by=user(ANA))
    with pytest.raises(auth.PermissionDenied, match="may not delete"):
        services.remove(done.id, engine=engine, by=user(ANA))
    assert repo.get_run(engine, queued.id).status == "queued"
    assert not repo.get_run(engine, running.id).cancel_requested
    assert repo.get_run(engine, done.id) and files.is_dir()
    assert "may not delete" in services.refused_removal(done.id, by=user(ANA), engine=engine)


def test_owner_and_admin_may_cancel_and_delete(team, engine, home):
    queued = seed_run(engine, "bob-queued", owner=BOB, status="queued")
    running = seed_run(engine, "bob-running", owner=BOB, status="running")
    done = seed_run(engine, "bob-done", owner=BOB)
    assert services.cancel(queued.id, engine=engine, by=user(BOB)).status == "cancelled"
    assert services.cancel(running.id, engine=engine, by=user(ADMIN)).cancel_requested
    services.remove(done.id, engine=engine, by=user(ADMIN))
    with pytest.raises(repo.RunNotFound):
        repo.get_run(engine, done.id)


# --- starting the UI -------------------------------------------------------------------------------


def test_team_mode_without_sign_in_settings_refuses_to_start(team, monkeypatch, tmp_path):
    for env in auth.OIDC_ENV.values():
        monkeypatch.delenv(env, raising=False)
    monkeypatch.setenv("TORCHDECK_OIDC_CLIENT_ID", "torchdeck")
    with pytest.raises(auth.AuthNotConfigured) as e:
        auth.serve_options(tmp_path)
    missing = [env for env in auth.OIDC_ENV.values() if env != "TORCHDECK_OIDC_CLIENT_ID"]
    assert all(env in str(e.value) for env in missing) and "TORCHDECK_OIDC_CLIENT_ID" not in str(e.value)
    assert not (tmp_path / "auth").exists()


def test_team_mode_writes_the_auth_secrets_for_streamlit(team, monkeypatch, tmp_path):
    for env, value in OIDC.items():
        monkeypatch.setenv(env, value)
    monkeypatch.setenv("TORCHDECK_OIDC_CLIENT_SECRET", 'with "quotes" and \\ backslash')
    opts = auth.serve_options(tmp_path)
    assert opts[opts.index("--server.address") + 1] == "0.0.0.0"
    path = tmp_path / "auth" / "secrets.toml"
    assert opts[opts.index("--secrets.files") + 1] == str(path)
    assert stat.S_IMODE(path.stat().st_mode) == 0o600  # a client secret: this user only
    section = tomllib.loads(path.read_text())["auth"]
    assert section["client_secret"] == 'with "quotes" and \\ backslash'
    assert section["server_metadata_url"] == "value-of-server_metadata_url"
    assert set(section) == set(auth.OIDC_ENV)
    # Or the issuer alone: its metadata is at the well-known address (OpenID Connect Discovery).
    monkeypatch.delenv("TORCHDECK_OIDC_SERVER_METADATA_URL")
    monkeypatch.setenv(auth.ISSUER_ENV, "https://sso.example.com/realms/lab/")
    auth.serve_options(tmp_path)
    assert (tomllib.loads(path.read_text())["auth"]["server_metadata_url"]
            == "https://sso.example.com/realms/lab/.well-known/openid-configuration")


def test_local_mode_is_served_on_loopback_only(monkeypatch, tmp_path):
    monkeypatch.delenv(auth.MODE_ENV, raising=False)
    monkeypatch.delenv(auth.ADDRESS_ENV, raising=False)
    assert auth.serve_options(tmp_path) == ["--server.address", "127.0.0.1"]
    monkeypatch.setenv(auth.ADDRESS_ENV, "0.0.0.0")
    with pytest.raises(auth.AuthNotConfigured, match="127.0.0.1 only"):
        auth.serve_options(tmp_path)
    monkeypatch.setenv(auth.MODE_ENV, "tema")
    with pytest.raises(auth.AuthNotConfigured, match="not a mode"):
        auth.team_mode()


def test_cli_up_refuses_team_mode_without_sign_in(team, monkeypatch, home):
    from typer.testing import CliRunner

    from app.cli import app

    for env in auth.OIDC_ENV.values():
        monkeypatch.delenv(env, raising=False)
    for command in (["up"], ["ui"]):
        result = CliRunner().invoke(app, command)
        assert result.exit_code == 2, result.output
        assert "TORCHDECK_MODE=team requires sign-in" in result.output
    assert not (home / "redis.pid").exists()  # nothing was started


# --- the pages ---------------------------------------------------------------------------------------


def team_page(name: str, who: dict | None, **query: str) -> AppTest:
    at = AppTest.from_file(str(auth.__file__).replace("auth.py", "main.py"), default_timeout=60)
    at.secrets["auth"] = {"client_id": "torchdeck"}  # what `torchdeck ui` passes to Streamlit
    at.user = {"is_logged_in": False} if who is None else {"is_logged_in": True, **who}
    at.run()
    if who is not None:
        at.switch_page(f"app_pages/{name}")
        for k, v in query.items():
            at.query_params[k] = v
        at.run()
    return at


def _button(at, label: str):
    return next(b for b in at.button if b.label == label)


def test_anonymous_visitor_sees_only_the_sign_in_screen(team, engine):
    seed_run(engine, "secret-run", owner=BOB)
    at = team_page("runs.py", None)
    assert not at.exception
    assert [b.label for b in at.button] == ["Sign in"]
    assert len(at.dataframe) == 0 and "secret-run" not in str(at.main) + str(at.sidebar)


def test_runs_page_lets_a_user_cancel_and_delete_only_their_own(team, engine):
    bobs = seed_run(engine, "bobs", owner=BOB, status="queued")
    at = team_page("runs.py", {"email": ANA, "name": "Ana"})
    assert not at.exception
    assert list(at.dataframe[0].value["owner"]) == [BOB]  # everyone sees everyone's runs
    assert any(f"signed in as **Ana** ({ANA})" in c.value for c in at.sidebar.caption)
    assert "Sign out" in [b.label for b in at.sidebar.button]
    at.session_state["runs.table"] = {"selection": {"rows": [0], "columns": [], "cells": []}}
    at.run()
    assert _button(at, "Cancel").disabled and _button(at, "Delete").disabled
    assert not _button(at, "Clone").disabled and not _button(at, "Re-run").disabled
    assert repo.get_run(engine, bobs.id).status == "queued"


def test_admin_may_cancel_anyones_run_from_the_runs_page(team, engine):
    bobs = seed_run(engine, "bobs", owner=BOB, status="queued")
    at = team_page("runs.py", {"email": ADMIN, "name": "Root"})
    assert any("admin" in c.value for c in at.sidebar.caption)
    at.session_state["runs.table"] = {"selection": {"rows": [0], "columns": [], "cells": []}}
    at.run()
    _button(at, "Cancel").click()
    at.run()
    assert repo.get_run(engine, bobs.id).status == "cancelled"
    assert any("cancel requested for 1 run(s)" in s.value for s in at.success)


def test_run_page_disables_cancel_for_others(team, engine):
    bobs = seed_run(engine, "bobs", owner=BOB, status="running")
    at = team_page("run.py", {"email": ANA}, id=bobs.id)
    assert not at.exception
    assert _button(at, "Cancel").disabled and not _button(at, "Clone").disabled
    at = team_page("run.py", {"email": BOB}, id=bobs.id)
    assert not _button(at, "Cancel").disabled
    _button(at, "Cancel").click()
    at.run()
    assert repo.get_run(engine, bobs.id).cancel_requested


def test_new_run_owner_is_the_signed_in_user(team, engine):
    at = team_page("new_run.py", {"email": ANA})
    assert not at.exception
    owner = at.text_input(key="nr.owner")
    assert owner.value == ANA and owner.disabled


def test_team_mode_started_without_sign_in_shows_nothing(team, engine):
    seed_run(engine, "secret-run", owner=BOB)
    at = AppTest.from_file(str(auth.__file__).replace("auth.py", "main.py"), default_timeout=60)
    at.user = {"is_logged_in": True, "email": ANA}
    at.run()
    assert any("requires sign-in" in e.value for e in at.error)
    assert len(at.dataframe) == 0
