"""Projects in the database (db/projects.py, migration 0014): existing rows go to the default project, open to every
member; a person's role is the highest of their listings (by key or verified e-mail) and the project's open role;
the migration goes down and up again keeping the runs (SQLite and Postgres)."""

from __future__ import annotations

import pytest
import sqlalchemy as sa
from sqlalchemy import Engine

from db import projects, repo
from db.engine import make_engine
from db.migrate import downgrade, upgrade

SPEC = {"data": {"name": "digits"}, "model": {"name": "mlp"}}


def test_0014_puts_existing_runs_in_the_default_project_and_goes_down_and_up_again(database_url: str) -> None:
    from db.models import UTCDateTime

    upgrade(database_url, "0013")
    engine = make_engine(database_url)
    try:
        old = sa.table(  # the run table as 0013 left it: no project
            "run",
            *(sa.column(c) for c in ("id", "name", "owner", "status", "spec_hash", "attempt", "cancel_requested")),
            sa.column("spec", sa.JSON),
            sa.column("summary", sa.JSON),
            sa.column("created_at", UTCDateTime()),
        )
        with engine.begin() as c:
            c.execute(
                sa.insert(old).values(
                    id="before",
                    name="before",
                    owner="ada",
                    status="completed",
                    spec=SPEC,
                    spec_hash="0" * 64,
                    attempt=0,
                    cancel_requested=False,
                    summary={},
                    created_at=sa.func.now(),
                )
            )
        upgrade(database_url)
        assert repo.get_run(engine, "before").project == "default"
        assert projects.get_project(engine, "default").open_role == "member"
        projects.create_project(engine, "vision", by="ada")
        downgrade(database_url, "0013")
        assert "project" not in sa.inspect(engine).get_table_names()
        assert "project" not in {c["name"] for c in sa.inspect(engine).get_columns("run")}
        upgrade(database_url)
        assert repo.get_run(engine, "before").project == "default"
        assert [p.name for p in projects.list_projects(engine)] == ["default"]
    finally:
        engine.dispose()


def test_roles_are_the_highest_of_listings_and_the_open_role(engine: Engine) -> None:
    projects.create_project(engine, "vision", by="maya#1")
    projects.create_project(engine, "speech", by="admin", maintainer=False, open_role="viewer")
    projects.set_member(engine, "vision", "mike#2", "viewer", by="maya#1")
    projects.set_member(engine, "vision", "mike@example.com", "member", by="maya#1")  # by his verified e-mail
    projects.set_member(engine, "speech", "mike#2", "maintainer", by="admin")
    assert projects.listed_roles(engine, ["mike#2", "mike@example.com"]) == {
        "default": "member",
        "speech": "maintainer",
        "vision": "member",
    }
    assert projects.listed_roles(engine, ["otto#3"]) == {"default": "member", "speech": "viewer"}
    assert projects.listed_roles(engine, ["maya#1"])["vision"] == "maintainer"
    projects.set_member(engine, "vision", "mike#2", "maintainer", by="maya#1")  # a role changes in place
    assert [(m.person, m.role) for m in projects.members(engine, "vision")] == [
        ("maya#1", "maintainer"),
        ("mike#2", "maintainer"),
        ("mike@example.com", "member"),
    ]
    assert projects.remove_member(engine, "vision", "mike#2") and not projects.remove_member(engine, "vision", "x")


def test_names_roles_and_counts_are_checked(engine: Engine) -> None:
    for bad in ("", "Vision", "-a", "a-", "a b", "x" * 41, "ü"):
        with pytest.raises(ValueError, match="project name"):
            projects.create_project(engine, bad, by="a")
    with pytest.raises(ValueError, match="open_role 'everyone'"):
        projects.create_project(engine, "p", by="a", open_role="everyone")
    with pytest.raises(projects.ProjectNotFound):
        projects.set_member(engine, "nowhere", "a", "viewer", by="a")
    projects.create_project(engine, "p", by="a")
    run = repo.create_run(engine, SPEC, owner="a", project="p")
    repo.create_run(engine, SPEC, owner="a")
    repo.claim_run(engine, run.id, "w1")
    assert projects.counts(engine, ["p", "default"]) == {
        "p": {"runs": 1, "queued": 0, "running": 1, "sweeps": 0, "datasets": 0},
        "default": {"runs": 1, "queued": 1, "running": 0, "sweeps": 0, "datasets": 0},
    }
    assert projects.project_of(engine, "run", run.id) == "p" and projects.project_of(engine, "run", "gone") is None
    with pytest.raises(sa.exc.IntegrityError):  # a run of a project that does not exist is refused by the database
        repo.create_run(engine, SPEC, owner="a", project="nowhere")
