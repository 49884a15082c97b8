"""Sign-in and ownership (app/auth.py): who may cancel and delete a run (its owner or an admin), enforced
in app/services/runs.py and reflected in the pages; team mode refuses to start without sign-in settings and
shows nothing before sign-in; local mode is served on 127.0.0.1 only."""

from __future__ import annotations

import dataclasses
import stat
import tomllib
from types import SimpleNamespace

import pytest
from seeding import seed_run
from streamlit.testing.v1 import AppTest

from app import auth
from app.services.runs import cancel, refused_removal, remove
from db import repo

ANA, BOB, ADMIN = "ana@example.com", "bob@example.com", "root@example.com"
ISS = "https://sso.example.com/realms/lab"
OIDC = {env: f"value-of-{key}" for key, env in auth.OIDC_ENV.items()}


@pytest.fixture
def team(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(auth.MODE_ENV, "team")
    monkeypatch.setenv(auth.ADMINS_ENV, f" {ADMIN.upper()} , other-admin@example.com")
    for env in (*auth.ALLOW_ENVS, auth.GROUPS_CLAIM_ENV, auth.ISSUER_ENV, auth.OIDC_ENV["server_metadata_url"]):
        monkeypatch.delenv(env, raising=False)


def claims(email: str, **more) -> dict:
    """What a provider's ID token says of someone whose e-mail it verified (the subject: a stable id)."""
    return {
        "iss": ISS,
        "sub": f"id-{email.lower()}",
        "email": email,
        "email_verified": True,
        "name": email.split("@")[0].title(),
        **more,
    }


def user(email: str, **more) -> auth.User:
    """A member of the dashboard as the gate hands them to the pages: with their projects' roles, here the default
    project's open role (member) and nothing else (tests of other projects look roles up: projects.with_roles)."""
    u = auth.user_from_claims({"is_logged_in": True, **claims(email, **more)})
    assert u is not None
    return as_member(u)


def as_member(u: auth.User) -> auth.User:
    """`u` with the roles every member of the dashboard has: the default project's open role."""
    return dataclasses.replace(u, roles=(("default", "member"),))


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
    assert auth.user_from_claims({"is_logged_in": True, "iss": ISS, "email": ANA, "email_verified": True}) is None
    ana = user(ANA)
    assert ana == auth.User(id=f"{ISS}#id-{ANA}", name="Ana", email=ANA, roles=(("default", "member"),))
    entra = auth.user_from_claims({"is_logged_in": True, "iss": ISS, "sub": "00u1", "preferred_username": "Ana@Corp"})
    assert entra == auth.User(id=f"{ISS}#00u1", name="Ana@Corp")  # a display name, nothing more
    # The display name: `name`, else the verified e-mail, else preferred_username.
    assert auth.user_from_claims({**claims(ANA), "is_logged_in": True, "name": None}).name == ANA
    mail_unverified = {"is_logged_in": True, "iss": ISS, "sub": "7", "email": ANA, "preferred_username": "ana"}
    assert auth.user_from_claims(mail_unverified).name == "ana"


def test_a_chosen_username_or_unverified_address_is_nobodys_identity(team, monkeypatch, engine):
    """preferred_username and an unverified e-mail are whatever the person typed at the provider."""
    monkeypatch.setenv(auth.ADMINS_ENV, "boss@corp.com")
    monkeypatch.setenv(auth.ALLOWED_USERS_ENV, "boss@corp.com")
    bosses_run = seed_run(engine, "boss", owner="boss@corp.com", status="queued")  # stored as an e-mail
    forged = [
        {"preferred_username": "boss@corp.com", "email_verified": False},
        {"preferred_username": "boss@corp.com", "email": "boss@corp.com", "email_verified": False},
        {"email": "boss@corp.com"},  # email_verified absent: not verified
        {"email": "boss@corp.com", "email_verified": "true"},
    ]  # only the boolean true counts
    for extra in forged:
        u = auth.user_from_claims({"is_logged_in": True, "iss": ISS, "sub": "mallory", **extra})
        assert u is not None and u.id == f"{ISS}#mallory" and u.email is None, extra
        assert not u.is_admin and not auth.is_member(u) and not auth.can_modify(as_member(u), bosses_run), extra
    boss = auth.user_from_claims(
        {"is_logged_in": True, "iss": ISS, "sub": "b0", "email": "Boss@Corp.com", "email_verified": True}
    )
    assert boss.is_admin and auth.is_member(boss) and boss.email == "Boss@Corp.com"


def test_the_key_is_issuer_and_subject(team, monkeypatch):
    """The same subject at another provider is another person; without `iss`, the configured issuer's."""
    here, there = (
        auth.user_from_claims({"is_logged_in": True, "iss": iss, "sub": "42"})
        for iss in (ISS, "https://accounts.google.com")
    )
    assert here.id == f"{ISS}#42" and there.id == "https://accounts.google.com#42"
    monkeypatch.setenv(auth.ISSUER_ENV, ISS + "/")
    assert auth.user_from_claims({"is_logged_in": True, "sub": "42"}).id == f"{ISS}#42"
    monkeypatch.delenv(auth.ISSUER_ENV)
    monkeypatch.setenv(auth.OIDC_ENV["server_metadata_url"], f"{ISS}/.well-known/openid-configuration")
    assert auth.user_from_claims({"is_logged_in": True, "sub": "42"}).id == f"{ISS}#42"


def test_admins_by_key_or_by_verified_email(team, monkeypatch, engine):
    monkeypatch.setenv(auth.ADMINS_ENV, f"{ISS}#ops-7, ROOT@example.com")
    by_key = auth.user_from_claims({"is_logged_in": True, "iss": ISS, "sub": "ops-7"})
    assert by_key.is_admin and by_key.email is None
    assert not auth.user_from_claims({"is_logged_in": True, "iss": "https://other.example", "sub": "ops-7"}).is_admin
    assert not auth.user_from_claims({"is_logged_in": True, "iss": ISS, "sub": "OPS-7"}).is_admin  # keys: exact
    assert user(ADMIN).is_admin and user("Root@Example.COM").is_admin  # e-mails: any case
    bobs = seed_run(engine, "bobs", owner=user(BOB).id, status="queued")
    assert auth.can_modify(by_key, bobs) and auth.can_modify(user(ADMIN), bobs)


def test_owners_by_key_and_legacy_email_owners(team, engine):
    bob = user(BOB)
    keyed = seed_run(engine, "keyed", owner=bob.id, status="queued")
    legacy = seed_run(engine, "legacy", owner=BOB, status="queued")  # stored before identities were keyed
    assert auth.can_modify(bob, keyed) and auth.can_modify(bob, legacy)
    assert auth.can_modify(user("BOB@example.com"), legacy)  # the stored e-mail, any case
    # Another account with Bob's verified address owns his legacy runs, never his keyed ones.
    twin = as_member(auth.user_from_claims({**claims(BOB), "is_logged_in": True, "sub": "someone-else"}))
    assert auth.can_modify(twin, legacy) and not auth.can_modify(twin, keyed)
    unverified = as_member(auth.user_from_claims({"is_logged_in": True, "iss": ISS, "sub": f"id-{BOB}", "email": BOB}))
    assert unverified.id == bob.id and auth.can_modify(unverified, keyed)  # the key alone makes the owner
    assert not auth.can_modify(unverified, legacy)  # an e-mail nobody verified owns nothing
    assert not auth.can_modify(user(ANA), keyed) and not auth.can_modify(user(ANA), legacy)
    # Anything with an owner: a dataset with none (uploaded before datasets had owners) is an admin's only.
    assert not auth.can_modify(bob, SimpleNamespace(owner=None)) and auth.can_modify(
        user(ADMIN), SimpleNamespace(owner=None)
    )
    assert auth.can_modify(bob, SimpleNamespace(owner=bob.id))


def test_allow_list_by_user_domain_or_group(team, monkeypatch):
    outsider = user("eve@elsewhere.org")
    assert auth.allow_list() == {} and auth.is_member(outsider)  # no allow-list: everyone signed in
    monkeypatch.setenv(auth.ALLOWED_DOMAINS_ENV, "Example.com, @lab.example.org")
    assert auth.is_member(user(ANA)) and auth.is_member(user("x@LAB.example.org"))
    assert not auth.is_member(outsider) and not auth.is_member(user("x@sub.example.com"))  # exactly the domain
    assert not auth.is_member(auth.user_from_claims({"is_logged_in": True, "iss": ISS, "sub": "u", "email": ANA}))
    assert not auth.is_member(user("root@elsewhere.org"))
    monkeypatch.setenv(auth.ADMINS_ENV, "root@elsewhere.org")
    assert auth.is_member(user("root@elsewhere.org"))  # admins always pass
    monkeypatch.setenv(auth.ALLOWED_USERS_ENV, f"EVE@elsewhere.org, {ISS}#id-carl")
    assert auth.is_member(outsider)
    assert auth.is_member(auth.user_from_claims({"is_logged_in": True, "iss": ISS, "sub": "id-carl"}))
    monkeypatch.setenv(auth.ALLOWED_GROUPS_ENV, "ml-lab,/vision")
    dan = "dan@partner.net"
    assert auth.is_member(user(dan, groups=["staff", "ml-lab"])) and auth.is_member(user(dan, groups="/vision"))
    assert not auth.is_member(user(dan, groups=["ml-lab-alumni"])) and not auth.is_member(user(dan))
    monkeypatch.setenv(auth.GROUPS_CLAIM_ENV, "roles")
    assert auth.is_member(user(dan, roles=["ml-lab"])) and not auth.is_member(user(dan, groups=["ml-lab"]))


def test_local_mode_refuses_remote_and_proxied_requests():
    assert auth.local_refusal("127.0.0.1", {"Host": "127.0.0.1:8501"}) is None
    assert auth.local_refusal(None, {}) is None
    assert "only answers on this machine" in auth.local_refusal("10.0.0.7", {})
    for header in auth.PROXY_HEADERS:
        why = auth.local_refusal("127.0.0.1", {header.lower(): "203.0.113.9"})
        assert why and header in why and "TORCHDECK_MODE=team" in why, header


def test_local_mode_user_may_do_anything(monkeypatch, engine):
    monkeypatch.delenv(auth.MODE_ENV, raising=False)
    run = seed_run(engine, "someone's", owner=BOB, status="queued")
    assert not auth.team_mode() and auth.can_modify(auth.local_user(), run)
    assert cancel(run.id, engine=engine, by=auth.local_user()).status == "cancelled"


# --- enforced in the services ---------------------------------------------------------------------


def test_service_refuses_cancel_and_delete_by_another_user(team, engine, home):
    queued = seed_run(engine, "bob-queued", owner=BOB, status="queued")
    running = seed_run(engine, "bob-running", owner=BOB, status="running")
    done = seed_run(engine, "bob-done", owner=BOB)
    files = home / "artifacts" / "runs" / done.id
    files.mkdir(parents=True)
    (files / "best.pt").write_bytes(b"x")
    for r in (queued, running):
        with pytest.raises(
            auth.PermissionDenied, match=rf"Ana \({ANA}\) may not cancel run {r.id}: it belongs to {BOB}"
        ):
            cancel(r.id, engine=engine, by=user(ANA))
    with pytest.raises(auth.PermissionDenied, match="may not delete"):
        remove(done.id, engine=engine, by=user(ANA))
    assert repo.get_run(engine, queued.id).status == "queued"
    assert not repo.get_run(engine, running.id).cancel_requested
    assert repo.get_run(engine, done.id) and files.is_dir()
    assert "may not delete" in refused_removal(done.id, by=user(ANA), engine=engine)


def test_owner_and_admin_may_cancel_and_delete(team, engine, home):
    queued = seed_run(engine, "bob-queued", owner=BOB, status="queued")
    running = seed_run(engine, "bob-running", owner=BOB, status="running")
    done = seed_run(engine, "bob-done", owner=BOB)
    assert cancel(queued.id, engine=engine, by=user(BOB)).status == "cancelled"
    assert cancel(running.id, engine=engine, by=user(ADMIN)).cancel_requested
    remove(done.id, engine=engine, by=user(ADMIN))
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
    assert (
        opts[opts.index("--client.showErrorDetails") + 1] == "none"
    )  # no traceback for visitors (Streamlit 1.67's values)
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
    assert (
        tomllib.loads(path.read_text())["auth"]["server_metadata_url"]
        == "https://sso.example.com/realms/lab/.well-known/openid-configuration"
    )


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
    at = team_page("runs.py", claims(ANA))
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
    at = team_page("runs.py", claims(ADMIN))
    assert any("admin" in c.value for c in at.sidebar.caption)
    at.session_state["runs.table"] = {"selection": {"rows": [0], "columns": [], "cells": []}}
    at.run()
    _button(at, "Cancel").click()
    at.run()
    assert repo.get_run(engine, bobs.id).status == "cancelled"
    assert any("cancel requested for 1 run(s)" in s.value for s in at.success)


def test_run_page_disables_cancel_for_others(team, engine):
    bobs = seed_run(engine, "bobs", owner=BOB, status="running")
    at = team_page("run.py", claims(ANA), id=bobs.id)
    assert not at.exception
    assert _button(at, "Cancel").disabled and not _button(at, "Clone").disabled
    at = team_page("run.py", claims(BOB), id=bobs.id)
    assert not _button(at, "Cancel").disabled
    _button(at, "Cancel").click()
    at.run()
    assert repo.get_run(engine, bobs.id).cancel_requested


def test_new_run_owner_is_the_signed_in_user(team, engine):
    at = team_page("new_run.py", claims(ANA))
    assert not at.exception
    owner = at.text_input(key="nr.owner")
    assert owner.value == f"Ana ({ANA})" and owner.disabled  # the name, not the key


def test_team_mode_started_without_sign_in_shows_nothing(team, engine):
    seed_run(engine, "secret-run", owner=BOB)
    at = AppTest.from_file(str(auth.__file__).replace("auth.py", "main.py"), default_timeout=60)
    at.user = {"is_logged_in": True, **claims(ANA)}
    at.run()
    assert any("requires sign-in" in e.value for e in at.error)
    assert len(at.dataframe) == 0
