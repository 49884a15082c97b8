"""`torchdeck projects list|create|show|member|remove-member|describe`, and `--project` on `torchdeck submit`,
`torchdeck sweep` and `torchdeck runs`, as an operator runs them from a shell with the database's credentials (an
admin: it needs no place in a project), on a real database (SQLite and Postgres for managing projects; SQLite and a
real Redis where runs are queued). A refusal says what is wrong in red and exits 1, writing nothing."""

from __future__ import annotations

import getpass

import pytest
import yaml
from sweep_seeding import sweep_spec
from test_registry_cli import db  # noqa: F401 - `db` is a fixture: SQLite and a fresh Postgres
from typer.testing import CliRunner

from app.cli import app
from db import projects, repo

ANA_KEY = "https://sso.example.com/realms/lab#ana"


@pytest.fixture(autouse=True)
def wide(monkeypatch) -> None:
    monkeypatch.setenv("COLUMNS", "200")  # rich's tables as wide as a terminal's, not wrapped at 80 columns


def cli(*args: str):
    return CliRunner().invoke(app, list(args))


def table(output: str) -> dict[str, list[str]]:
    """The rows of a rich table in `output`, by their first cell: each row's cells."""
    rows = [[c.strip() for c in line.split("│")[1:-1]] for line in output.splitlines() if line.startswith("│")]
    return {cells[0]: cells for cells in rows}


def ok(*args: str) -> str:
    done = cli(*args)
    assert done.exit_code == 0, done.output
    return done.output


def test_an_operator_creates_a_project_lists_its_people_and_changes_them(db):
    made = ok("projects", "create", "vision", "--description", "Detectors for the line", "--maintainer", ANA_KEY)
    assert "project vision: seen by its listed people only (and admins)" in made and f"{ANA_KEY}: maintainer" in made
    assert ok("projects", "member", "vision", "bob@example.com", "viewer").strip() == (
        "bob@example.com: viewer of project vision"
    )
    ok("projects", "member", "vision", "bob@example.com", "member")  # a role changed, not a second listing
    shown = ok("projects", "show", "vision")
    assert "vision: Detectors for the line" in shown and "open to: listed people only" in shown
    listed = {person: cells[1] for person, cells in table(shown).items() if person != "person"}
    assert listed == {ANA_KEY: "maintainer", "bob@example.com": "member"} and "2 member(s)" in shown
    assert ok("projects", "describe", "vision", "Detectors and counters").strip() == "vision: Detectors and counters"
    assert ok("projects", "remove-member", "vision", "bob@example.com").strip() == (
        "bob@example.com: no longer listed in project vision"
    )
    shown = ok("projects", "show", "vision")
    assert "vision: Detectors and counters" in shown and "bob@example.com" not in shown and "1 member(s)" in shown
    again = cli("projects", "remove-member", "vision", "bob@example.com")
    assert again.exit_code == 1 and "bob@example.com is not listed in project vision" in again.output
    assert [(m.person, m.role) for m in projects.members(db, "vision")] == [(ANA_KEY, "maintainer")]


def test_the_list_shows_every_project_with_who_sees_it_and_its_runs(db):
    from tests.app.seeding import seed_run

    ok("projects", "create", "vision", "--description", "Detectors", "--open-role", "viewer")
    ok("projects", "create", "audio")
    seed_run(db, "done")  # the default project's
    queued = seed_run(db, "waiting", status="queued")
    with db.begin() as conn:
        from sqlalchemy import update

        from db.models import Run

        conn.execute(update(Run).where(Run.id == queued.id).values(project="vision"))
    listed = ok("projects", "list")
    rows = {name: cells[1:] for name, cells in table(listed).items() if name != "name"}
    assert set(rows) == {"audio", "default", "vision"} and "3 project(s)" in listed
    assert rows["vision"] == ["viewer", "Detectors", "1", "1", "0"]  # runs, queued, running
    assert rows["audio"] == ["- (listed people only)", "", "0", "0", "0"]
    assert rows["default"][0] == "member" and rows["default"][2:] == ["1", "0", "0"]


def test_refusals_say_what_is_wrong_and_change_nothing(db):
    for args, words in (
        (("projects", "show", "nope"), "project 'nope' not found: `torchdeck projects list` shows the projects"),
        (("projects", "member", "nope", "bob@example.com", "viewer"), "project 'nope' not found"),
        (("projects", "describe", "nope", "words"), "project 'nope' not found"),
        (("projects", "create", "Vision Team"), "project name 'Vision Team': 1 to 40 lower-case letters"),
        (("projects", "create", "vision", "--open-role", "owner"), "--open-role 'owner': use one of viewer, member"),
    ):
        done = cli(*args)
        assert done.exit_code == 1 and words in done.output, (args, done.output)
    assert [p.name for p in projects.list_projects(db)] == ["default"]
    ok("projects", "create", "vision")
    for args, words in (
        (("projects", "member", "vision", "bob@example.com", "owner"), "role 'owner': use one of viewer, member, "),
        (("projects", "member", "vision", " ", "viewer"), "give a person's account key"),
        (("projects", "create", "vision"), "a project named 'vision' already exists"),
    ):
        done = cli(*args)
        assert done.exit_code == 1 and words in done.output, (args, done.output)
    assert projects.members(db, "vision") == []


# --- runs and sweeps into a project --------------------------------------------------------------------------


@pytest.fixture
def spec_file(tmp_path):
    path = tmp_path / "run.yaml"
    path.write_text(yaml.safe_dump({"name": "detector", "data": {"name": "digits"}, "device": "cpu"}))
    return path


def test_submit_puts_a_run_in_its_project_and_runs_lists_one_project(engine, broker, spec_file):
    ok("projects", "create", "vision")
    done = ok("submit", str(spec_file), "--project", "vision")
    assert "in project vision" in done
    into = repo.get_run(engine, done.strip().splitlines()[-1])
    elsewhere = repo.get_run(engine, ok("submit", str(spec_file), "--name", "other").strip().splitlines()[-1])
    assert (into.project, into.status, elsewhere.project) == ("vision", "queued", "default")
    listed = ok("runs", "--project", "vision")
    assert into.id in listed and elsewhere.id not in listed and "1 run(s)" in listed
    everything = ok("runs")
    assert into.id in everything and elsewhere.id in everything and "2 run(s)" in everything
    unknown = cli("runs", "--project", "nope")
    assert unknown.exit_code == 1 and "project 'nope' not found" in unknown.output


def test_an_unknown_project_is_refused_before_anything_is_queued(engine, broker, spec_file, tmp_path):
    done = cli("submit", str(spec_file), "--project", "nope")
    assert done.exit_code == 1 and "project 'nope' not found: `torchdeck projects list` shows the projects" in (
        done.output
    )
    space = tmp_path / "sweep.yaml"
    space.write_text(yaml.safe_dump(sweep_spec().model_dump(mode="json", by_alias=True, exclude_none=True)))
    done = cli("sweep", str(space), "--project", "nope")
    assert done.exit_code == 1 and "project 'nope' not found" in done.output
    assert repo.list_runs(engine).total == 0 and broker.llen("cpu") == 0


def test_in_team_mode_a_runs_owner_must_be_a_member_of_its_project(engine, broker, spec_file, tmp_path, monkeypatch):
    monkeypatch.setenv("TORCHDECK_MODE", "team")
    ok("projects", "create", "vision")
    operator = f"cli:{getpass.getuser()}"
    refused = cli("submit", str(spec_file), "--project", "vision")
    assert refused.exit_code == 1 and f"{operator} may not launch runs, sweeps or uploads in project vision" in (
        refused.output
    )
    ok("projects", "member", "vision", operator, "viewer")
    refused = cli("submit", str(spec_file), "--project", "vision")
    assert refused.exit_code == 1 and "they are a viewer there" in refused.output
    assert repo.list_runs(engine).total == 0 and broker.llen("cpu") == 0
    ok("projects", "member", "vision", operator, "member")
    run = repo.get_run(engine, ok("submit", str(spec_file), "--project", "vision").strip().splitlines()[-1])
    assert (run.project, run.owner) == ("vision", operator)
    space = tmp_path / "sweep.yaml"
    space.write_text(yaml.safe_dump(sweep_spec().model_dump(mode="json", by_alias=True, exclude_none=True)))
    launched = ok("sweep", str(space), "--project", "vision")
    sweep = repo.get_sweep(engine, launched.strip().splitlines()[-1])
    assert sweep.project == "vision" and "in project vision" in launched
    assert {r.project for r in repo.sweep_runs(engine, sweep.id)} == {"vision"}
    refused = cli("sweep", str(space), "--project", "vision", "--owner", ANA_KEY)  # Ana is not in it
    assert refused.exit_code == 1 and "may not launch runs, sweeps or uploads in project vision" in refused.output
