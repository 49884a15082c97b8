"""Export now is for the run's owner or an admin: app/services/jobs.export_now refuses anyone else before anything is
sent (a real Redis shows the queue stays empty), and the Run page leaves the form out for them, saying why.
The files an export superseded stay listed on the Run page, with their links."""

from __future__ import annotations

import hashlib

import pytest
from seeding import seed_run
from streamlit.testing.v1 import AppTest

from app import auth
from app.services import jobs
from app.services.artifacts import artifact_store
from db import repo

ANA, BOB, ADMIN = "ana@example.com", "bob@example.com", "root@example.com"
ISS = "https://sso.example.com/realms/lab"


@pytest.fixture
def team(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(auth.MODE_ENV, "team")
    monkeypatch.setenv(auth.ADMINS_ENV, ADMIN)


def claims(email: str) -> dict:
    """A signed-in person as the provider's ID token describes them (a stable subject, a verified e-mail)."""
    return {
        "is_logged_in": True,
        "iss": ISS,
        "sub": f"id-{email}",
        "email": email,
        "email_verified": True,
        "name": email.split("@")[0].title(),
    }


def user(email: str) -> auth.User:
    u = auth.user_from_claims(claims(email))
    assert u is not None
    return u


def artifacts_tab(email: str, run_id: str) -> AppTest:
    """The Run page's Artifacts tab as the signed-in `email` sees it."""
    at = AppTest.from_file(str(auth.__file__).replace("auth.py", "main.py"), default_timeout=60)
    at.secrets["auth"] = {"client_id": "torchdeck"}  # what `torchdeck ui` passes to Streamlit
    at.user = claims(email)
    at.run()
    at.switch_page("app_pages/run.py")
    at.query_params["id"] = run_id
    at.run()
    at.session_state["run.tab"] = "Artifacts"
    return at.run()


def test_a_non_owners_export_is_refused_and_nothing_is_queued(team, engine, broker, monkeypatch):
    bobs = seed_run(engine, "bobs", owner=BOB)
    with pytest.raises(auth.PermissionDenied, match=f"may not export run {bobs.id}"):
        jobs.export_now(bobs.id, ["onnx"], by=user(ANA), engine=engine)
    assert broker.llen("jobs") == 0 and broker.dbsize() == 0  # no message at all
    assert artifact_store().list("jobs") == []
    # The owner's and an admin's are sent (no jobs worker here: the answer says so after the pickup limit).
    monkeypatch.setenv(jobs.PICKUP_ENV, "0.5")
    for who in (BOB, ADMIN):
        ok, output = jobs.export_now(bobs.id, ["onnx"], by=user(who), engine=engine)
        assert not ok and "no worker is serving the jobs queue" in output
    assert broker.llen("jobs") == 2


def test_an_unknown_run_is_answered_without_sending_anything(team, engine, broker):
    ok, output = jobs.export_now("nosuchrun", ["onnx"], by=user(ADMIN), engine=engine)
    assert not ok and "there is no run 'nosuchrun'" in output
    assert broker.dbsize() == 0


def test_run_page_offers_export_now_to_the_owner_and_admins_only(team, engine):
    bobs = seed_run(engine, "bobs", owner=BOB)
    at = artifacts_tab(ANA, bobs.id)
    assert not at.exception
    assert "Export now" not in [b.label for b in at.button]
    assert any("**Export now** is for" in c.value and "or an admin" in c.value for c in at.caption)
    for who in (BOB, ADMIN):
        at = artifacts_tab(who, bobs.id)
        assert not at.exception and "Export now" in [b.label for b in at.button]
        assert not any("**Export now** is for" in c.value for c in at.caption)


def test_an_earlier_export_stays_listed_with_its_link(page, engine, home):
    r = seed_run(engine, "twice")
    ids = []
    for token, data in (("20250101T000000Z-aaaa", b"first-onnx"), ("20250102T000000Z-bbbb", b"second-onnx")):
        path = home / "artifacts" / "runs" / r.id / "exports" / token / "model.onnx"
        path.parent.mkdir(parents=True)
        path.write_bytes(data)
        ids.append(
            repo.add_artifact(
                engine, r.id, "onnx", path.as_uri(), size=len(data), sha256=hashlib.sha256(data).hexdigest()
            ).id
        )
    at = page("run.py", id=r.id)
    at.session_state["run.tab"] = "Artifacts"
    at.run()
    assert not at.exception
    assert [b.label for b in at.get("download_button")].count("Download") == 1  # the newest ONNX file
    assert any(e.label.startswith("Earlier files (1)") for e in at.expander)
    first = hashlib.sha256(b"first-onnx").hexdigest()[:12]
    links = [el.proto for el in at.get("page_link")]
    assert any(first in link.label and ids[0] in link.query_string for link in links), links
