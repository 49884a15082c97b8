"""The rules of personal API tokens (app/services/tokens.py): local mode makes none (its endpoint answers this machine
only); in team mode a member makes, lists and revokes their own, an admin revokes anyone's; a script's token is its
person again (key, name, verified e-mail, groups, admin right as TORCHDECK_ADMINS says now, projects' roles) only
while the token is live and its person still a member of the dashboard, and each use is recorded."""

from __future__ import annotations

from datetime import timedelta

import pytest
from test_auth import ADMIN, ANA, BOB, ISS, team, user  # noqa: F401 - `team` is a fixture

from app import auth
from app.services import projects, tokens
from db import tokens as store
from db.engine import session_scope
from db.models import ApiToken


def test_local_mode_makes_no_token_and_says_why(engine, monkeypatch):
    monkeypatch.delenv(auth.MODE_ENV, raising=False)
    with pytest.raises(tokens.TokensNotNeeded, match="local mode.*answers this machine only.*needs no token"):
        tokens.make(auth.local_user(), "laptop", engine=engine)
    assert tokens.mine(auth.local_user(), engine=engine) == []


def test_a_member_makes_lists_and_revokes_their_own_token(team, engine):
    ana = user(ANA, groups=["ml"])
    record, secret = tokens.make(ana, "laptop", engine=engine)
    assert (record.person, record.person_name, record.email, record.groups) == (ana.id, "Ana", ANA, ("ml",))
    assert secret.startswith("tdk_") and tokens.mine(ana, engine=engine) == [record]
    assert tokens.mine(user(BOB), engine=engine) == [] and tokens.mine(None, engine=engine) == []
    assert tokens.authenticate(secret, engine=engine) is not None
    assert tokens.revoke(ana, record.id, engine=engine) is True
    assert tokens.authenticate(secret, engine=engine) is None  # revoked: refused
    assert not tokens.mine(ana, engine=engine)[0].live
    assert tokens.revoke(ana, record.id, engine=engine) is False  # not live any more


def test_the_label_and_the_cap_are_the_stores_with_their_words(team, engine):
    ana = user(ANA)
    with pytest.raises(ValueError, match="give a name"):
        tokens.make(ana, "  ", engine=engine)
    for i in range(tokens.MAX_LIVE):
        tokens.make(ana, f"t{i}", engine=engine)
    with pytest.raises(tokens.TooManyTokens, match="revoke one"):
        tokens.make(ana, "one too many", engine=engine)


def test_only_a_member_makes_one(team, engine, monkeypatch):
    monkeypatch.setenv(auth.ALLOWED_USERS_ENV, BOB)
    with pytest.raises(auth.PermissionDenied, match="not a member"):
        tokens.make(user(ANA), "laptop", engine=engine)
    with pytest.raises(auth.PermissionDenied, match="sign in"):
        tokens.make(None, "laptop", engine=engine)  # type: ignore[arg-type]
    assert tokens.make(user(BOB), "laptop", engine=engine)[0].person == user(BOB).id


def test_another_person_cannot_revoke_my_token_and_an_admin_can(team, engine):
    ana = user(ANA)
    first, first_secret = tokens.make(ana, "first", engine=engine)
    second, second_secret = tokens.make(ana, "second", engine=engine)
    assert tokens.revoke(user(BOB), first.id, engine=engine) is False
    assert tokens.authenticate(first_secret, engine=engine).id == ana.id  # still live
    with pytest.raises(auth.PermissionDenied):
        tokens.revoke(None, first.id, engine=engine)
    admin = user(ADMIN)
    assert admin.is_admin and tokens.revoke(admin, first.id, engine=engine) is True
    assert tokens.authenticate(first_secret, engine=engine) is None
    assert tokens.authenticate(second_secret, engine=engine) is not None  # only the one revoked


def test_a_token_is_its_person_again_with_their_roles(team, engine):
    ana = user(ANA, groups=["ml", "lab"])
    _, secret = tokens.make(ana, "laptop", engine=engine)
    bob = projects.with_roles(user(BOB), engine)
    projects.create("vision", by=bob, engine=engine)
    projects.set_member("vision", ana.id, "viewer", by=bob, engine=engine)
    acting = tokens.authenticate(secret, engine=engine)
    assert (acting.id, acting.name, acting.email, acting.groups) == (ana.id, "Ana", ANA, frozenset({"ml", "lab"}))
    assert not acting.is_admin
    assert acting.role_in("default") == "member" and acting.role_in("vision") == "viewer"
    assert not auth.can_contribute(acting, "vision")
    assert tokens.authenticate(secret[:-1] + ("A" if secret[-1] != "A" else "B"), engine=engine) is None
    assert tokens.authenticate("", engine=engine) is None


def test_a_person_no_longer_a_member_is_refused_and_welcome_again_once_listed(team, engine, monkeypatch):
    _, secret = tokens.make(user(ANA, groups=["ml"]), "laptop", engine=engine)
    monkeypatch.setenv(auth.ALLOWED_GROUPS_ENV, "vision-team")
    assert tokens.authenticate(secret, engine=engine) is None  # not in the allowed group
    monkeypatch.setenv(auth.ALLOWED_GROUPS_ENV, "ml")
    assert tokens.authenticate(secret, engine=engine).id == user(ANA).id  # the groups stored with the token
    monkeypatch.delenv(auth.ALLOWED_GROUPS_ENV)
    monkeypatch.setenv(auth.ALLOWED_DOMAINS_ENV, "corp.example")
    assert tokens.authenticate(secret, engine=engine) is None
    monkeypatch.setenv(auth.ALLOWED_USERS_ENV, ANA)
    assert tokens.authenticate(secret, engine=engine) is not None  # by verified e-mail


def test_the_admin_right_is_what_torchdeck_admins_says_at_each_use(team, engine, monkeypatch):
    _, by_mail = tokens.make(user(ADMIN), "ops", engine=engine)
    assert tokens.authenticate(by_mail, engine=engine).is_admin  # listed by e-mail, in another case
    monkeypatch.setenv(auth.ADMINS_ENV, f"{ISS}#id-{BOB}")
    assert not tokens.authenticate(by_mail, engine=engine).is_admin
    _, bobs = tokens.make(user(BOB), "ci", engine=engine)
    assert tokens.authenticate(bobs, engine=engine).is_admin  # listed by key
    monkeypatch.setenv(auth.ALLOWED_USERS_ENV, "nobody@example.com")
    assert tokens.authenticate(bobs, engine=engine) is not None  # an admin is a member
    assert tokens.authenticate(by_mail, engine=engine) is None


def test_each_use_is_recorded_at_most_once_a_minute(team, engine, monkeypatch):
    record, secret = tokens.make(user(ANA), "laptop", engine=engine)
    assert record.last_used_at is None
    tokens.authenticate(secret, engine=engine)
    first = store.get_token(engine, record.id).last_used_at
    assert first is not None
    touch, writes = store.touch, []
    monkeypatch.setattr(store, "touch", lambda *a, **k: writes.append(a) or touch(*a, **k))
    for _ in range(5):
        assert tokens.authenticate(secret, engine=engine) is not None
    assert writes == []  # used a moment ago: not even an attempt to write
    with session_scope(engine) as session:  # as if its last use were two minutes ago
        session.get(ApiToken, record.id).last_used_at = first - timedelta(minutes=2)
    tokens.authenticate(secret, engine=engine)
    assert len(writes) == 1 and store.get_token(engine, record.id).last_used_at > first - timedelta(minutes=1)
