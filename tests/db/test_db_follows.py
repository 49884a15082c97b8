"""Follows: a person follows runs and reads, in one query, what became of them; on both backends."""

from __future__ import annotations

import pytest
from sqlalchemy import Engine, func, select

from db import repo
from db.engine import connection_scope
from db.models import Follow

SPEC = {"data": {"name": "digits"}, "model": {"name": "mlp"}, "optim": {"lr": 0.01}}


def test_following_twice_is_one_follow_and_unfollowing_ends_it(engine: Engine) -> None:
    run = repo.create_run(engine, SPEC, name="baseline", owner="ada")
    assert repo.followed(engine, "ada") == []
    assert repo.follow(engine, "ada", run.id) is True
    assert repo.follow(engine, "ada", run.id) is False  # already followed: nothing new
    assert repo.followed(engine, "ada") == [(run.id, "queued", "baseline", None)]
    assert repo.followed(engine, "bob") == []  # a follow is one person's
    assert repo.unfollow(engine, "ada", run.id) is True
    assert repo.unfollow(engine, "ada", run.id) is False
    assert repo.followed(engine, "ada") == []


def test_followed_runs_show_their_status_name_and_end(engine: Engine) -> None:
    first = repo.create_run(engine, SPEC, name="first", owner="ada")
    second = repo.create_run(engine, SPEC, name="second", owner="bob")  # anyone's run may be followed
    repo.follow(engine, "ada", first.id)
    repo.follow(engine, "ada", second.id)
    repo.follow(engine, "bob", second.id)
    repo.claim_run(engine, first.id, "w1", device="cpu")
    repo.finish_run(engine, first.id, "diverged", summary={"status": "diverged"})
    rows = repo.followed(engine, "ada")
    assert [r.run_id for r in rows] == [first.id, second.id]  # oldest follow first
    assert (rows[0].status, rows[0].name) == ("diverged", "first")
    assert rows[0].finished_at is not None and rows[0].finished_at.tzinfo is not None
    assert rows[0].finished_at == repo.get_run(engine, first.id).finished_at
    assert (rows[1].status, rows[1].finished_at) == ("queued", None)
    assert [r.run_id for r in repo.followed(engine, "bob")] == [second.id]


def test_a_missing_run_cannot_be_followed_and_a_deleted_run_loses_its_follows(engine: Engine) -> None:
    with pytest.raises(repo.RunNotFound):
        repo.follow(engine, "ada", "nosuchrun")
    with pytest.raises(ValueError):
        repo.follow(engine, "", "nosuchrun")
    run = repo.create_run(engine, SPEC, name="doomed", owner="ada")
    kept = repo.create_run(engine, SPEC, name="kept", owner="ada")
    for who in ("ada", "bob"):
        repo.follow(engine, who, run.id)
    repo.follow(engine, "ada", kept.id)
    repo.delete_run(engine, run.id)
    assert [r.run_id for r in repo.followed(engine, "ada")] == [kept.id]
    assert repo.followed(engine, "bob") == []
    with connection_scope(engine) as conn:
        assert conn.execute(select(func.count()).select_from(Follow).where(Follow.run_id == run.id)).scalar() == 0
