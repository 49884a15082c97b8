"""Datasets have owners: the uploader (or an admin) alone may delete one, enforced in app/services/datasets.py and
reflected on the Datasets page; a dataset uploaded before datasets had owners may be deleted by an admin only."""

from __future__ import annotations

from pathlib import Path

import pytest
from streamlit.testing.v1 import AppTest
from test_datasets_page import GOOD, make_zip

from app import auth
from app.services import datasets as ds
from db import repo

ISSUER = "https://sso.example.com/realms/lab"
ANA = {"iss": ISSUER, "sub": "ana-1", "email": "ana@example.com", "email_verified": True, "name": "Ana"}
BOB = {"iss": ISSUER, "sub": "bob-2", "email": "bob@example.com", "email_verified": True, "name": "Bob"}
ROOT = {"iss": ISSUER, "sub": "root-3", "email": "root@example.com", "email_verified": True, "name": "Root"}


@pytest.fixture
def team(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(auth.MODE_ENV, "team")
    monkeypatch.setenv(auth.ADMINS_ENV, ROOT["email"])


def who(claims: dict) -> auth.User:
    user = auth.user_from_claims({"is_logged_in": True, **claims})
    assert user is not None
    return user


def upload(engine, name: str, owner: auth.User) -> repo.DatasetRecord:
    buf = make_zip(GOOD)
    return ds.store_upload(engine, name, buf, len(buf.getvalue()), owner=owner.id)


def test_only_the_uploader_or_an_admin_deletes_a_dataset(team, engine, home):
    pets = upload(engine, "pets", who(ANA))
    assert pets.owner == who(ANA).id
    with pytest.raises(auth.PermissionDenied, match="may not delete dataset 'pets'"):
        ds.remove(engine, pets.id, by=who(BOB))
    with pytest.raises(repo.DatasetNotFound):  # an anonymous visitor sees no dataset at all
        ds.remove(engine, pets.id, by=None)
    assert repo.get_dataset(engine, pets.id).status == "ready" and (Path(pets.uri) / "cat").is_dir()
    ds.remove(engine, pets.id, by=who(ANA))
    assert repo.list_datasets(engine) == [] and not Path(pets.uri).exists()
    birds = upload(engine, "birds", who(BOB))
    ds.remove(engine, birds.id, by=who(ROOT))  # an admin may delete anyone's
    assert repo.list_datasets(engine) == []


def test_a_dataset_without_an_owner_is_an_admins_to_delete(team, engine, home):
    legacy = upload(engine, "legacy", who(ANA))
    with engine.begin() as conn:  # as stored before datasets had owners (migration 0003 leaves NULL)
        conn.exec_driver_sql("UPDATE dataset SET owner = NULL")
    assert repo.get_dataset(engine, legacy.id).owner is None
    with pytest.raises(auth.PermissionDenied, match="uploaded before datasets had owners"):
        ds.remove(engine, legacy.id, by=who(ANA))
    ds.remove(engine, legacy.id, by=who(ROOT))
    assert repo.list_datasets(engine) == []


def datasets_page(claims: dict) -> AppTest:
    at = AppTest.from_file(str(auth.__file__).replace("auth.py", "main.py"), default_timeout=60)
    at.secrets["auth"] = {"client_id": "torchdeck"}
    at.user = {"is_logged_in": True, **claims}
    at.run()
    at.switch_page("app_pages/datasets.py")
    return at.run()


def test_the_page_offers_delete_to_the_owner_only(team, engine, home):
    upload(engine, "pets", who(ANA))
    other = datasets_page(BOB)
    assert not other.exception
    assert any(
        "Only its owner (a member of the project), a maintainer of the project or an admin may delete this dataset"
        in c.value
        for c in other.caption
    )
    assert "Delete permanently" not in [b.label for b in other.button]
    owner = datasets_page(ANA)
    assert not any("Only its owner" in c.value for c in owner.caption)
    next(b for b in owner.button if b.label == "Delete permanently").click()
    owner.run()
    assert repo.list_datasets(engine) == []
