"""Team mode in the pages: with an allow-list, someone signed in who matches none of it gets a refusal
page (their key to add, a Sign out button) and no data; members are recorded as accounts once per
session, and the pages name owners by their account's name and verified e-mail, never by the key."""

from __future__ import annotations

from seeding import seed_run
from test_auth import ANA, BOB, ISS, claims, team, team_page  # noqa: F401 - `team` is a fixture

from app import auth, fmt
from db import repo


def test_a_non_member_gets_a_refusal_page_and_no_data(team, engine, monkeypatch):
    monkeypatch.setenv(auth.ALLOWED_DOMAINS_ENV, "example.com")
    seed_run(engine, "secret-run", owner=BOB)
    eve = claims("eve@elsewhere.org", name="Eve")
    at = team_page("runs.py", eve)
    assert not at.exception
    assert [e.value for e in at.error] == [
        "Eve is signed in but not a member of this dashboard; ask an admin to add you to TORCHDECK_ALLOWED_USERS "
        "(or your e-mail's domain to TORCHDECK_ALLOWED_DOMAINS, or you to a group of TORCHDECK_ALLOWED_GROUPS)."]
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
    assert any(f"owner {fmt.md_text(f'Bob ({BOB})')}" in c.value for c in at.caption)
    assert not any(ISS in c.value for c in at.caption)
