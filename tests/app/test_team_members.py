"""Team mode in the pages: with an allow-list, someone signed in who matches none of it gets a refusal
page (their key to add, a Sign out button) and no data; members are recorded as accounts once per
session, and the pages name owners by their account's name and verified e-mail, never by the key."""

from __future__ import annotations

from seeding import seed_run
from test_auth import ANA, BOB, ISS, claims, team, team_page  # noqa: F401 - `team` is a fixture

from app import auth
from app.present import text
from db import repo


def test_a_non_member_gets_a_refusal_page_and_no_data(team, engine, monkeypatch):
    monkeypatch.setenv(auth.ALLOWED_DOMAINS_ENV, "example.com")
    seed_run(engine, "secret-run", owner=BOB)
    eve = claims("eve@elsewhere.org", name="Eve")
    at = team_page("runs.py", eve)
    assert not at.exception
    assert [e.value for e in at.error] == [
        "Eve is signed in but not a member of this dashboard; ask an admin to add you to TORCHDECK_ALLOWED_USERS "
        "(or your e-mail's domain to TORCHDECK_ALLOWED_DOMAINS, or you to a group of TORCHDECK_ALLOWED_GROUPS)."
    ]
    assert any(f"`{ISS}#{eve['sub']}`" in c.value for c in at.caption)  # what the admin adds
    assert [b.label for b in at.button] == ["Sign out"]
    assert len(at.dataframe) == 0 and "secret-run" not in str(at.main) + str(at.sidebar)
    assert repo.accounts(engine, [f"{ISS}#{eve['sub']}"]) == {}  # a refused visitor is not recorded
    # The same e-mail unverified is no member either; a verified one of the domain is.
    unverified = {k: v for k, v in claims("mallory@example.com").items() if k != "email_verified"}
    assert any("not a member" in e.value for e in team_page("runs.py", unverified).error)
    at = team_page("runs.py", claims(ANA))
    assert not at.error and list(at.dataframe[0].value["name"]) == ["secret-run"]


def test_members_are_recorded_once_per_session_and_named_by_their_account(team, engine):
    bob = auth.user_from_claims({"is_logged_in": True, **claims(BOB)})
    run = seed_run(engine, "bobs", owner=bob.id, status="queued")
    seed_run(engine, "anas", owner=ANA)  # stored with an e-mail, before identities were keyed: shown as it is
    at = team_page("runs.py", claims(BOB))
    recorded = repo.accounts(engine, [bob.id])[bob.id]
    assert (recorded.name, recorded.email) == ("Bob", BOB)
    at.run()
    assert repo.accounts(engine, [bob.id])[bob.id].seen_at == recorded.seen_at  # not again in this session
    assert not any(ISS in c.value for c in at.sidebar.caption)  # the sidebar shows name and e-mail, not the key
    assert any(f"signed in as **Bob** ({BOB})" in c.value for c in at.sidebar.caption)
    at = team_page("runs.py", claims(ANA))
    assert set(at.dataframe[0].value["owner"]) == {ANA, f"Bob ({BOB})"}
    assert set(at.selectbox(key="runs.owner").options) == {ANA, f"Bob ({BOB})"}  # the filter lists labels…
    at.selectbox(key="runs.owner").set_value(bob.id).run()
    assert list(at.dataframe[0].value["name"]) == ["bobs"]  # …and filters on the key
    at = team_page("run.py", claims(ANA), id=run.id)
    assert any(f"owner {text.md_text(f'Bob ({BOB})')}" in c.value for c in at.caption)
    assert not any(ISS in c.value for c in at.caption)


def test_a_sign_in_older_than_the_limit_is_renewed_before_any_data(team, engine, monkeypatch):
    """Streamlit keeps the claims of the moment of sign-in for 30 days: someone removed from a group since
    must not keep the access it gave. Older than TORCHDECK_SESSION_MAX_AGE_H (default 12 h), sign in again."""
    import time

    seed_run(engine, "secret-run", owner=BOB)
    old = {**claims(ANA), "iat": int(time.time()) - 13 * 3600}
    at = team_page("runs.py", old)
    assert not at.exception
    assert any("Your sign-in is 13 hours old" in w.value and "every 12 hours" in w.value for w in at.warning)
    assert [b.label for b in at.button] == ["Sign in again"]
    assert len(at.dataframe) == 0 and "secret-run" not in str(at.main) + str(at.sidebar)
    monkeypatch.setenv(auth.SESSION_MAX_AGE_ENV, "24")
    assert list(team_page("runs.py", old).dataframe[0].value["name"]) == ["secret-run"]
    fresh = {**claims(ANA), "iat": int(time.time())}
    monkeypatch.delenv(auth.SESSION_MAX_AGE_ENV)
    assert list(team_page("runs.py", fresh).dataframe[0].value["name"]) == ["secret-run"]
    assert auth.sign_in_too_old({"iat": 0}, now=13 * 3600) and not auth.sign_in_too_old({"iat": 0}, now=11 * 3600)
    monkeypatch.setenv(auth.SESSION_MAX_AGE_ENV, "0")  # 0: no limit
    assert auth.sign_in_too_old({"iat": 0}, now=10**9) is None


def test_an_account_without_a_verified_e_mail_cannot_pass_for_someone_else(team, engine):
    """A name is whatever one types at the provider: `Bob (bob@example.com)` typed as a name is shown marked
    unverified, with a tag of its key, never as Bob's own label."""
    from app.services.owners import owner_labels

    bob = auth.user_from_claims({"is_logged_in": True, **claims(BOB)})
    mimic = {"is_logged_in": True, "iss": ISS, "sub": "mimic", "name": f"Bob ({BOB})"}
    fake = auth.user_from_claims(mimic)
    repo.upsert_account(engine, bob.id, bob.name, bob.email)
    repo.upsert_account(engine, fake.id, fake.name, fake.email)
    labels = owner_labels([bob.id, fake.id], engine)
    assert labels[bob.id] == f"Bob ({BOB})"
    assert labels[fake.id].startswith(f"Bob ({BOB}) (unverified ") and labels[fake.id] != labels[bob.id]
