"""Personal API tokens in the database (db/tokens.py, migration 0015), on SQLite and Postgres: a token is found by
its secret and by nothing else, its SHA-256 alone is stored, a revoked one is never found again, a person revokes
only their own (an admin path any), the label is checked, a person holds at most MAX_LIVE live tokens, and the last
use is written at most once a minute."""

from __future__ import annotations

import hashlib
from concurrent.futures import ThreadPoolExecutor
from datetime import timedelta

import pytest
import sqlalchemy as sa
from sqlalchemy import Engine

from db import tokens
from db.engine import connection_scope
from db.models import ApiToken
from db.types import utcnow

ANA, BOB = "https://sso.example.com#ana", "https://sso.example.com#bob"


def make(engine: Engine, person: str = ANA, label: str = "laptop", **more) -> tuple[tokens.TokenRecord, str]:
    name = person.rsplit("#", 1)[-1].title() or "Nobody"
    args = {"person_name": name, "email": None, "groups": ["ml", "lab"], **more}
    return tokens.create_token(engine, person=person, label=label, **args)


def test_a_token_is_found_by_its_secret_and_acts_as_its_person(engine: Engine) -> None:
    record, secret = make(engine, email="ana@example.com", groups=["lab", "ml", "lab"], label="  laptop  ")
    assert secret.startswith(f"tdk_{record.id}_") and len(secret) > 50
    assert record.label == "laptop" and record.live and record.last_used_at is None
    assert record.groups == ("lab", "ml")  # sorted, once each
    found = tokens.find_by_secret(engine, secret)
    assert found == record
    assert (found.person, found.person_name, found.email) == (ANA, "Ana", "ana@example.com")
    other, other_secret = make(engine)
    assert other.id != record.id and other_secret != secret
    assert tokens.find_by_secret(engine, other_secret).id == other.id


@pytest.mark.parametrize(
    "wrong",
    [
        "",
        "tdk_",
        "not-a-token",
        "Bearer tdk_x",
        "tdk_" + "0" * 16 + "_" + "A" * 43,  # well formed, unknown
        "tdk_" + "0" * 5000,  # too long to be ours
    ],
)
def test_strings_that_are_no_live_token_find_nothing(engine: Engine, wrong: str) -> None:
    make(engine)
    assert tokens.find_by_secret(engine, wrong) is None


def test_a_secret_altered_in_one_character_or_with_another_tokens_id_finds_nothing(engine: Engine) -> None:
    record, secret = make(engine)
    other, _ = make(engine, BOB)
    last = "A" if secret[-1] != "A" else "B"
    assert tokens.find_by_secret(engine, secret[:-1] + last) is None
    assert tokens.find_by_secret(engine, secret.replace(record.id, other.id)) is None
    assert tokens.find_by_secret(engine, secret + "x") is None


def test_only_the_sha256_of_the_secret_is_stored(engine: Engine) -> None:
    record, secret = make(engine)
    with connection_scope(engine) as conn:
        row = conn.execute(sa.select(ApiToken.__table__).where(ApiToken.id == record.id)).one()
    assert row.digest == hashlib.sha256(secret.encode()).hexdigest()
    secret_part = secret.split("_", 2)[2]  # tdk_<id>_<secret part>: the secret part may itself hold "_"
    assert len(secret_part) >= 43
    assert all(secret_part not in str(value) for value in row)  # nowhere in the row, not even partly
    assert not hasattr(record, "digest") and secret not in repr(record)


def test_a_revoked_token_is_never_found_again_and_stays_listed(engine: Engine) -> None:
    record, secret = make(engine)
    assert tokens.revoke(engine, record.id, ANA) is True
    assert tokens.find_by_secret(engine, secret) is None
    listed = tokens.list_tokens(engine, ANA)
    assert [t.id for t in listed] == [record.id] and not listed[0].live and listed[0].revoked_at is not None
    first = listed[0].revoked_at
    assert tokens.revoke(engine, record.id, ANA) is False  # already revoked: the first time stays
    assert tokens.get_token(engine, record.id).revoked_at == first


def test_a_person_revokes_only_their_own_and_the_admin_path_any(engine: Engine) -> None:
    anas, secret = make(engine)
    assert tokens.revoke(engine, anas.id, BOB) is False
    assert tokens.find_by_secret(engine, secret) is not None  # still live
    assert tokens.revoke(engine, "no-such-token", ANA) is False
    assert tokens.revoke(engine, anas.id, None) is True  # an admin: anyone's
    assert tokens.find_by_secret(engine, secret) is None


def test_each_person_lists_their_own_newest_first(engine: Engine) -> None:
    first, _ = make(engine, label="first")
    second, _ = make(engine, label="second")
    bobs, _ = make(engine, BOB, label="bob's")
    tokens.revoke(engine, first.id, ANA)
    assert [t.label for t in tokens.list_tokens(engine, ANA)] == ["second", "first"]
    assert [t.id for t in tokens.list_tokens(engine, BOB)] == [bobs.id]
    assert tokens.list_tokens(engine, "https://sso.example.com#nobody") == []
    assert second.live


@pytest.mark.parametrize(
    "label, words",
    [
        ("", "give a name"),
        ("   ", "give a name"),
        ("x" * (tokens.LABEL_LEN + 1), f"at most {tokens.LABEL_LEN} characters"),
        ("two\nlines", "printable characters only"),
        ("tab\there", "printable characters only"),
        ("bell\x07", "printable characters only"),
        (None, "give a text"),
    ],
)
def test_a_label_that_is_no_label_is_refused_and_nothing_is_stored(engine: Engine, label, words: str) -> None:
    with pytest.raises(ValueError, match=words):
        make(engine, label=label)
    assert tokens.list_tokens(engine, ANA) == []


def test_labels_at_the_bounds_are_kept(engine: Engine) -> None:
    longest = "é" * tokens.LABEL_LEN
    assert make(engine, label=f" {longest} ")[0].label == longest
    assert make(engine, label="x")[0].label == "x"
    assert make(engine, label="GPU box — ünïcode ✓")[0].label == "GPU box — ünïcode ✓"


def test_a_person_holds_at_most_max_live_tokens_and_revoking_one_makes_room(engine: Engine) -> None:
    made = [make(engine, label=f"t{i}")[0] for i in range(tokens.MAX_LIVE)]
    with pytest.raises(tokens.TooManyTokens, match=f"most one person may hold \\({tokens.MAX_LIVE}\\).*revoke one"):
        make(engine, label="one too many")
    assert len(tokens.list_tokens(engine, ANA)) == tokens.MAX_LIVE
    assert make(engine, BOB)[0].live  # another person's count is their own
    tokens.revoke(engine, made[0].id, ANA)
    assert make(engine, label="in its place")[0].live
    with pytest.raises(tokens.TooManyTokens):
        make(engine, label="again one too many")


def test_concurrent_makes_by_one_person_never_overshoot_the_cap(engine: Engine) -> None:
    for i in range(tokens.MAX_LIVE - 2):
        make(engine, label=f"t{i}")

    def attempt(i: int) -> bool:
        try:
            make(engine, label=f"racer {i}")
        except tokens.TooManyTokens:
            return False
        return True

    with ThreadPoolExecutor(6) as pool:
        results = list(pool.map(attempt, range(6)))
    assert sum(results) == 2
    assert sum(t.live for t in tokens.list_tokens(engine, ANA)) == tokens.MAX_LIVE


def test_the_last_use_is_written_at_most_once_a_minute(engine: Engine) -> None:
    record, secret = make(engine)
    assert tokens.needs_touch(record)
    now = utcnow()
    assert tokens.touch(engine, record.id, now=now) is True
    used = tokens.find_by_secret(engine, secret)
    assert used.last_used_at == now and not tokens.needs_touch(used, now + timedelta(seconds=30))
    assert tokens.touch(engine, record.id, now=now + timedelta(seconds=30)) is False
    assert tokens.get_token(engine, record.id).last_used_at == now
    later = now + tokens.TOUCH_EVERY + timedelta(seconds=1)
    assert tokens.needs_touch(used, later)
    assert tokens.touch(engine, record.id, now=later) is True
    assert tokens.get_token(engine, record.id).last_used_at == later
    assert tokens.touch(engine, "no-such-token") is False


def test_whose_it_is_is_checked_before_anything_is_stored(engine: Engine) -> None:
    with pytest.raises(ValueError, match="person"):
        make(engine, person="")
    with pytest.raises(ValueError, match="person_name"):
        make(engine, person_name=" ")
    with pytest.raises(ValueError, match="groups"):
        make(engine, groups=["ok", 3])
    assert tokens.list_tokens(engine, ANA) == []
