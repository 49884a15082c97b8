"""Projects in the pages (app/ui/project_context.py, app/app_pages/project.py): every page lists the current
project's runs, sweeps, datasets and models; the project is in every URL and chosen in the sidebar among the
projects the person may read; a private project is invisible to whoever is not in it (its name, its runs by id and
its files are "not found", as if they did not exist); the controls the service would refuse are not offered; the
Project page shows the project's members, which its maintainers manage. Local mode has one project and no switcher.
"""

from __future__ import annotations

import hashlib
from types import SimpleNamespace

import pytest
import streamlit as st
from seeding import seed_run
from sqlalchemy import update
from sweep_seeding import seed_sweep
from test_auth import ANA, BOB, claims, team, team_page, user  # noqa: F401 - `team` is a fixture
from test_registry import exported_run

from app import auth
from app.services import projects, registry
from app.ui import overview_view
from db import repo
from db.engine import connection_scope
from db.models import Run

CAROL, DAN = "carol@example.com", "dan@example.com"
SWITCH = "project.switch"


@pytest.fixture
def vision(team, engine, home):
    """A private project: Bob its maintainer, Carol a viewer (by her account's key), Dan a member (by his verified
    e-mail); Ana is in the default project only. Its runs, sweep, dataset and model are all named `secret…`."""
    bob = projects.with_roles(user(BOB), engine)
    projects.create("vision", by=bob, description="Cats and *dogs*", engine=engine)
    projects.set_member("vision", user(CAROL).id, "viewer", by=bob, engine=engine)
    projects.set_member("vision", DAN, "member", by=bob, engine=engine)
    running = seed_run(engine, "secret-running", owner=bob.id, status="running", epochs=1, project="vision")
    queued = seed_run(engine, "secret-queued", owner=bob.id, status="queued", project="vision")
    dans = seed_run(engine, "secret-dans", owner=user(DAN).id, status="queued", project="vision")
    seed_sweep(engine, name="secret-sweep", owner=bob.id, project="vision")
    repo.create_dataset(engine, "secret-data", str(home / "d"), status="ready", owner=bob.id, project="vision")
    exported = exported_run(engine, home, b"onnx", owner=bob.id)
    with connection_scope(engine) as conn:  # (a run of the project: its model is the project's)
        conn.execute(update(Run).where(Run.id == exported.id).values(project="vision", name="secret-exported"))
    registry.register(exported.id, "secret-model", bob, engine)
    public = seed_run(engine, "public-run", owner=user(ANA).id)
    st.cache_data.clear()
    return SimpleNamespace(running=running, queued=queued, dans=dans, public=public, bob=bob)


def everything(at) -> str:
    """All a person can read on the page: its text, its tables' cells, its choices."""
    tables = "".join(df.value.to_string() for df in at.dataframe)
    choices = "".join(str(w.options) for w in [*at.selectbox, *at.multiselect])
    return str(at.main) + str(at.sidebar) + tables + choices


def _button(at, label: str):
    return next(b for b in at.button if b.label == label)


def _labels(at) -> list[str]:
    return [b.label for b in at.button]


def _select_row(at, row: int = 0):
    at.session_state["runs.table"] = {"selection": {"rows": [row], "columns": [], "cells": []}}
    return at.run()


# --- someone outside the project -------------------------------------------------------------------------------


@pytest.mark.parametrize("name", ["runs.py", "overview.py", "sweep.py", "datasets.py", "models.py", "workers.py"])
def test_someone_outside_a_private_project_sees_none_of_it(vision, name):
    at = team_page(name, claims(ANA))
    assert not at.exception and not at.error
    assert "secret" not in everything(at)
    assert at.selectbox(key=SWITCH).options == ["default"] and at.query_params["project"] == "default"


def test_the_queue_keeps_the_places_of_runs_ana_may_not_see_without_naming_them(vision):
    at = team_page("overview.py", claims(ANA))
    queue = next(df.value for df in at.dataframe if "position" in df.value)
    hidden = queue[queue["run"] == overview_view.OTHER_RUN]
    assert len(hidden) == len(queue) >= 2  # Bob's and Dan's queued runs (and the sweep's trials) wait ahead
    assert set(hidden["owner"]) == {""} and set(hidden["project"]) == {""} and hidden["open"].isna().all()
    assert all("its owner has" in why for why in hidden["why"])
    bobs = team_page("overview.py", claims(BOB))
    queue = next(df.value for df in bobs.dataframe if "position" in df.value)
    assert {"secret-queued", "secret-dans"} <= set(queue["run"]) and overview_view.OTHER_RUN not in set(queue["run"])


def test_a_private_projects_run_sweep_artifact_and_name_are_not_found_like_missing_ones(vision, engine, home):
    ana = claims(ANA)
    path = home / "secret.onnx"
    path.write_bytes(b"secret")
    art = repo.add_artifact(
        engine, vision.running.id, "onnx", path.as_uri(), size=6, sha256=hashlib.sha256(b"secret").hexdigest()
    )
    sweep = repo.list_sweeps(engine)[0]
    unknown = "0123456789ab"
    for page_name, hidden, other in (
        ("run.py", vision.running.id, unknown),
        ("sweep.py", sweep.id, unknown),
        ("artifact.py", art.id, "0" * len(art.id)),
    ):
        seen = team_page(page_name, ana, id=hidden)
        missing = team_page(page_name, ana, id=other)
        assert [e.value.replace(hidden, "X") for e in seen.error] == [
            e.value.replace(other, "X") for e in missing.error
        ]
        assert seen.error and "secret" not in everything(seen)
    private = team_page("runs.py", ana, project="vision")
    nowhere = team_page("runs.py", ana, project="nope")
    assert [e.value.replace("vision", "X") for e in private.error] == [
        e.value.replace("nope", "X") for e in nowhere.error
    ]
    assert "not found" in private.error[0].value and not private.dataframe and "secret" not in everything(private)
    assert _labels(private) == ["Open project default", "Sign out"]


def test_compare_drops_the_runs_a_person_may_not_see_as_not_found(vision):
    at = team_page("compare.py", claims(ANA), ids=f"{vision.running.id},{vision.public.id}")
    assert not at.exception
    assert at.multiselect(key="cmp.ids").value == [vision.public.id]
    assert any("1 run(s) of the link not found" in w.value for w in at.warning)
    assert "secret" not in everything(at) and at.query_params["ids"] == vision.public.id


# --- viewers, members, maintainers -------------------------------------------------------------------------


def test_a_viewer_sees_the_projects_runs_but_no_control_that_would_change_them(vision, engine):
    carol = claims(CAROL)
    at = team_page("runs.py", carol, project="vision")
    assert not at.exception
    assert {"secret-running", "secret-queued"} <= set(at.dataframe[0].value["name"])
    assert "public-run" not in set(at.dataframe[0].value["name"])
    assert at.selectbox(key=SWITCH).options == ["default", "vision"] and at.selectbox(key=SWITCH).value == "vision"
    at = _select_row(at)
    assert [b for b in _labels(at) if b != "Sign out"] == ["Open", "Compare"]  # no Cancel, Re-run, Clone, Delete
    run = team_page("run.py", carol, id=vision.queued.id)
    assert run.title[0].value == "secret-queued"
    assert not {"Cancel", "Clone", "Re-run"} & set(_labels(run)) and "Follow" in _labels(run)
    new = team_page("new_run.py", carol, project="vision")
    assert any("You are a viewer of project vision" in i.value for i in new.info) and not new.text_input
    assert not team_page("datasets.py", carol, project="vision").get("file_uploader")


def test_a_member_cancels_their_own_runs_only(vision, engine):
    dan = claims(DAN)
    at = team_page("runs.py", dan, project="vision")
    names = list(at.dataframe[0].value["name"])
    at = _select_row(at, names.index("secret-queued"))  # Bob's
    assert _button(at, "Cancel").disabled and _button(at, "Delete").disabled and not _button(at, "Clone").disabled
    at = _select_row(at, names.index("secret-dans"))
    _button(at, "Cancel").click()
    at.run()
    assert repo.get_run(engine, vision.dans.id).status == "cancelled"
    assert repo.get_run(engine, vision.queued.id).status == "queued"
    assert _button(team_page("run.py", dan, id=vision.queued.id), "Cancel").disabled


def test_a_maintainer_cancels_anyones_run_in_the_project(vision, engine):
    at = team_page("run.py", claims(BOB), id=vision.dans.id)
    assert not _button(at, "Cancel").disabled
    _button(at, "Cancel").click()
    at.run()
    assert repo.get_run(engine, vision.dans.id).status == "cancelled"


# --- the current project, the switcher, the URL ----------------------------------------------------------------


def test_the_switcher_lists_the_readable_projects_and_the_url_carries_the_one_shown(vision):
    at = team_page("runs.py", claims(BOB))
    assert at.query_params["project"] == "default" and list(at.dataframe[0].value["name"]) == ["public-run"]
    at.selectbox(key=SWITCH).set_value("vision").run()
    assert at.query_params["project"] == "vision"
    assert "public-run" not in set(at.dataframe[0].value["name"]) and "secret-queued" in set(
        at.dataframe[0].value["name"]
    )
    at.switch_page("app_pages/sweep.py")
    at.run()  # another page: the session keeps the project, the URL says it again
    assert at.query_params["project"] == "vision" and "secret-sweep" in set(at.dataframe[0].value["name"])
    assert list(team_page("datasets.py", claims(BOB), project="vision").dataframe[0].value["name"]) == ["secret-data"]
    models = team_page("models.py", claims(BOB), project="vision")
    assert models.selectbox(key="models.name").options == ["secret-model"]


def test_a_shared_link_to_a_run_opens_its_project(vision):
    at = team_page("run.py", claims(BOB), id=vision.queued.id)  # Bob's session was on the default project
    assert at.title[0].value == "secret-queued"
    assert at.query_params["project"] == "vision" and at.selectbox(key=SWITCH).value == "vision"
    compare = team_page("compare.py", claims(BOB), ids=f"{vision.running.id},{vision.queued.id}")
    assert compare.query_params["project"] == "vision"
    assert compare.multiselect(key="cmp.ids").value == [vision.running.id, vision.queued.id]


# --- the Project page ------------------------------------------------------------------------------------------


def test_the_project_page_lists_members_and_a_maintainer_adds_one(vision, engine):
    at = team_page("project.py", claims(BOB), project="vision")
    assert not at.exception and at.title[0].value == "Project vision"
    assert any("Cats and \\*dogs\\*" in m.value for m in at.markdown)  # its text, never Markdown
    members = next(df.value for df in at.dataframe if "person" in df.value and "role" in df.value)
    roles = dict(zip(members["person"], members["role"]))
    assert roles[f"Bob ({BOB})"] == "maintainer" and roles[DAN] == "member" and roles[user(CAROL).id] == "viewer"
    share = next(df.value for df in at.dataframe if "device hours" in df.value).set_index("person")
    assert share.loc[f"Bob ({BOB})", "running"] == 1 and share.loc[user(DAN).id, "waiting"] == 1  # (never signed in)
    at.text_input(key="project.person.vision").set_value(ANA)
    at.selectbox(key="project.role.vision").set_value("viewer")
    next(b for b in at.button if b.label == "Add").click()
    at.run()
    assert not at.error
    assert {m.person: m.role for m in projects.members("vision", by=vision.bob, engine=engine)}[ANA] == "viewer"
    ana = team_page("runs.py", claims(ANA), project="vision")  # now she sees it, as a viewer
    assert ana.selectbox(key=SWITCH).options == ["default", "vision"] and "secret-queued" in everything(ana)
    carol = team_page("project.py", claims(CAROL), project="vision")
    assert not [t for t in carol.text_input if t.key == "project.person.vision"]  # a viewer manages nobody


def test_a_maintainer_adds_the_projects_alert_rules_on_its_page_and_a_viewer_only_reads_them(vision, engine):
    from app.services import alerts

    at = team_page("project.py", claims(BOB), project="vision")
    at.selectbox(key="alerts.project.kind").set_value("queued")
    at.number_input(key="alerts.project.minutes").set_value(45.0)
    next(b for b in at.button if b.label == "Add rule").click()
    at.run()
    assert not at.exception and not at.error
    (rule,) = alerts.list_rules(engine=engine, project="vision")
    assert (rule.scope, rule.project, rule.kind, rule.minutes) == ("project", "vision", "queued", 45.0)
    assert "sweep_finished" in at.selectbox(key="alerts.project.kind").options  # a project's sweeps
    assert "worker_silent" not in at.selectbox(key="alerts.project.kind").options  # workers serve every project
    carol = team_page("project.py", claims(CAROL), project="vision")
    assert any("project vision\\: queued for 45 min" in m.value for m in carol.markdown)  # (as text)
    assert not [b for b in carol.button if b.label in ("Add rule", "Remove")]
    workers = team_page("workers.py", claims(BOB))
    assert not any("project vision\\:" in m.value for m in workers.markdown)  # not among the global rules


def test_anyone_makes_a_project_and_becomes_its_maintainer(vision, engine):
    at = team_page("project.py", claims(ANA))
    assert at.title[0].value == "Project default"
    at.text_input(key="project.new_name").set_value("nlp")
    next(b for b in at.button if b.label == "Create project").click()
    at.run()
    assert not at.exception and at.title[0].value == "Project nlp" and at.query_params["project"] == "nlp"
    assert at.selectbox(key=SWITCH).options == ["default", "nlp"]
    ana = projects.with_roles(user(ANA), engine)
    assert auth.has_role(ana, "nlp", "maintainer")
    at.text_input(key="project.new_name").set_value("Not A Name")
    next(b for b in at.button if b.label == "Create project").click()
    at.run()
    assert any("Project not created" in e.value and "lower-case" in e.value for e in at.error)


# --- local mode -------------------------------------------------------------------------------------------


def test_local_mode_with_one_project_has_no_switcher_and_a_second_one_adds_it(page, engine):
    seed_run(engine, "mine")
    at = page("runs.py")
    assert not at.exception and not [s for s in at.selectbox if s.key == SWITCH]
    assert at.query_params["project"] == "default" and list(at.dataframe[0].value["name"]) == ["mine"]
    projects.create("side", by=auth.local_user(), engine=engine)
    seed_run(engine, "elsewhere", project="side")
    st.cache_data.clear()
    at = page("runs.py")
    assert at.selectbox(key=SWITCH).options == ["default", "side"]
    assert list(at.dataframe[0].value["name"]) == ["mine"]
    at.selectbox(key=SWITCH).set_value("side").run()
    assert list(at.dataframe[0].value["name"]) == ["elsewhere"] and at.query_params["project"] == "side"
