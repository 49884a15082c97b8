"""Projects in the services (app/services/projects.py and the checks every service makes with app/auth.py's rules):
in team mode, a viewer sees a project's runs and changes nothing, a member launches runs and acts on their own, a
maintainer acts on anyone's and manages the members, an admin does everything everywhere; someone outside a private
project gets "not found" for what it holds. The default project is open to every member, as the dashboard was before
projects; local mode never asks."""

from __future__ import annotations

import dataclasses

import pytest
from test_auth import ADMIN, ISS, claims, team  # noqa: F401 - `team` is a fixture
from test_datasets_page import GOOD, make_zip

from app import auth
from app.services import datasets as ds
from app.services import projects, registry
from app.services.projects import ProjectHidden, with_roles
from app.services.runs import cancel, readable_run, set_priority, set_tags, submit
from app.services.sweeps import cancel_sweep, readable_sweep, submit_sweep
from core.config import RunSpec, SpecError
from db import projects as store
from db import repo
from sweep.spec import SweepSpec

MAYA, MIKE, VIC, OTTO = "maya@example.com", "mike@example.com", "vic@example.com", "otto@example.com"
DIGITS = {"data": {"name": "digits", "image_size": 8}, "model": {"name": "mlp"}, "train": {"epochs": 1}}


def person(email: str) -> auth.User:
    """Someone signed in, as the provider names them (their roles looked up by the services)."""
    u = auth.user_from_claims({"is_logged_in": True, **claims(email)})
    assert u is not None
    return u


def key(email: str) -> str:
    return person(email).id


@pytest.fixture
def vision(team, engine, broker):  # noqa: F811 - `team` is a fixture
    """A private project: Maya maintains it, Mike is a member, Vic a viewer; Otto is in the dashboard, not in it."""
    admin = person(ADMIN)
    for who in (MAYA, MIKE, VIC, OTTO, ADMIN):  # as the gate records each member at sign-in
        repo.upsert_account(engine, key(who), who.split("@")[0].title(), who)
    projects.create("vision", by=person(MAYA), description="photos of parts", engine=engine)
    projects.set_member("vision", key(MIKE), "member", by=person(MAYA), engine=engine)
    projects.set_member("vision", VIC, "viewer", by=admin, engine=engine)  # by verified e-mail, as an admin may
    return "vision"


def digits() -> RunSpec:
    return RunSpec.from_dict(DIGITS)


def test_migration_puts_everything_in_the_default_project_open_to_every_member(engine):
    default = store.get_project(engine, "default")
    assert default.open_role == "member" and default.created_by == "torchdeck"
    assert repo.create_run(engine, DIGITS, owner="someone").project == "default"
    assert store.listed_roles(engine, ["anyone"]) == {"default": "member"}


def test_a_viewer_sees_and_changes_nothing_a_member_runs_and_acts_on_their_own(vision, engine):
    mikes = submit(digits(), owner=key(MIKE), engine=engine, project=vision)
    assert mikes.project == vision and readable_run(mikes.id, by=person(VIC), engine=engine).id == mikes.id
    with pytest.raises(
        auth.PermissionDenied, match="may not launch runs, sweeps or uploads in project vision: they are a viewer"
    ):
        submit(digits(), owner=key(VIC), engine=engine, project=vision)
    with pytest.raises(auth.PermissionDenied, match="may not cancel run"):
        cancel(mikes.id, engine=engine, by=person(VIC))
    with pytest.raises(auth.PermissionDenied, match="a maintainer of project vision"):
        set_tags(mikes.id, ["mine"], engine=engine, by=person(VIC))
    assert set_tags(mikes.id, ["mine"], engine=engine, by=person(MIKE)).tags == ("mine",)
    mayas = submit(digits(), owner=key(MAYA), engine=engine, project=vision)
    with pytest.raises(auth.PermissionDenied, match=f"may not cancel run {mayas.id}"):
        cancel(mayas.id, engine=engine, by=person(MIKE))  # a member acts on their own only
    assert cancel(mikes.id, engine=engine, by=person(MAYA)).cancel_requested  # a maintainer on anyone's
    assert repo.list_runs(engine, project=vision).total == 2 and repo.list_runs(engine, project="default").total == 0


def test_outside_a_private_project_its_runs_do_not_exist(vision, engine):
    run = submit(digits(), owner=key(MIKE), engine=engine, project=vision)
    for what in (
        lambda: readable_run(run.id, by=person(OTTO), engine=engine),
        lambda: cancel(run.id, engine=engine, by=person(OTTO)),
        lambda: set_tags(run.id, ["x"], engine=engine, by=person(OTTO)),
    ):
        with pytest.raises(repo.RunNotFound, match=f"run '{run.id}' not found"):
            what()
    with pytest.raises(auth.PermissionDenied, match="they are not in it"):
        submit(digits(), owner=key(OTTO), engine=engine, project=vision)
    assert [p.name for p in projects.readable(person(OTTO), engine)] == ["default"]
    assert [p.name for p in projects.readable(person(VIC), engine)] == ["default", "vision"]
    assert [p.name for p in projects.readable(person(ADMIN), engine)] == ["default", "vision"]
    with pytest.raises(ProjectHidden, match="project 'vision' not found"):
        projects.get("vision", by=person(OTTO), engine=engine)
    with pytest.raises(store.ProjectNotFound, match="project 'nowhere' not found"):
        submit(digits(), owner=key(MIKE), engine=engine, project="nowhere")


def test_only_a_maintainer_or_an_admin_raises_a_run_and_manages_members(vision, engine):
    run = submit(digits(), owner=key(MIKE), engine=engine, project=vision)
    with pytest.raises(auth.PermissionDenied, match="only a maintainer of project vision or an admin may"):
        set_priority(run.id, "high", engine=engine, by=person(MIKE))
    assert set_priority(run.id, "high", engine=engine, by=person(MAYA)).priority == 1
    with pytest.raises(auth.PermissionDenied, match="may not manage the members of project vision"):
        projects.set_member("vision", key(OTTO), "member", by=person(MIKE), engine=engine)
    with pytest.raises(ValueError, match="role 'owner': use one of viewer, member, maintainer"):
        projects.set_member("vision", key(OTTO), "owner", by=person(MAYA), engine=engine)
    projects.set_member("vision", key(OTTO), "member", by=person(MAYA), engine=engine)
    assert readable_run(run.id, by=person(OTTO), engine=engine).id == run.id
    # Taken off the list, Mike keeps his run in the project but may no longer act on it; the maintainer may.
    assert projects.remove_member("vision", key(MIKE), by=person(MAYA), engine=engine)
    with pytest.raises(repo.RunNotFound):
        cancel(run.id, engine=engine, by=person(MIKE))
    assert cancel(run.id, engine=engine, by=person(MAYA)).cancel_requested
    members = {m.person: m.role for m in projects.members("vision", by=person(VIC), engine=engine)}
    assert members == {key(MAYA): "maintainer", key(OTTO): "member", VIC: "viewer"}


def test_anyone_may_make_a_project_only_an_admin_opens_one_to_everyone(team, engine):  # noqa: F811
    made = projects.create("speech", by=person(OTTO), engine=engine)
    assert made.open_role is None and with_roles(person(OTTO), engine).role_in("speech") == "maintainer"
    with pytest.raises(ValueError, match="a project named 'speech' already exists"):
        projects.create("speech", by=person(MIKE), engine=engine)
    with pytest.raises(ValueError, match="project name 'Not A Slug'"):
        projects.create("Not A Slug", by=person(MIKE), engine=engine)
    with pytest.raises(auth.PermissionDenied, match="only an admin"):
        projects.create("open", by=person(MIKE), open_role="viewer", engine=engine)
    with pytest.raises(auth.PermissionDenied, match="only an admin may"):
        projects.update("speech", by=person(OTTO), open_role="viewer", engine=engine)
    assert projects.update("speech", by=person(OTTO), description="asr", engine=engine).description == "asr"
    projects.update("speech", by=person(ADMIN), open_role="viewer", engine=engine)
    assert with_roles(person(MIKE), engine).role_in("speech") == "viewer"


def test_datasets_belong_to_a_project_and_a_run_reads_only_its_own_projects(vision, engine, home):
    buf = make_zip(GOOD)
    with pytest.raises(auth.PermissionDenied, match="they are a viewer"):
        ds.store_upload(engine, "parts", buf, len(buf.getvalue()), owner=key(VIC), project=vision)
    parts = ds.store_upload(engine, "parts", make_zip(GOOD), len(buf.getvalue()), owner=key(MIKE), project=vision)
    assert parts.project == vision and [d.name for d in repo.list_datasets(engine, project="default")] == []
    with pytest.raises(repo.DatasetNotFound):
        ds.remove(engine, parts.id, by=person(OTTO))
    spec = RunSpec.from_dict({"data": {"name": "imagefolder", "path": parts.uri}, "model": {"name": "mlp"}})
    with pytest.raises(SpecError, match="data.path"):  # Otto's run in the default project may not read it
        submit(spec, owner=key(OTTO), engine=engine)
    assert submit(spec, owner=key(MIKE), engine=engine, project=vision).spec["data"]["path"] == parts.uri
    ds.remove(engine, parts.id, by=person(MAYA))  # a maintainer deletes anyone's
    assert repo.list_datasets(engine) == []


def test_a_run_starts_only_from_a_checkpoint_of_its_own_project(vision, engine, home):
    from app.services.artifacts import artifact_root

    theirs = submit(digits(), owner=key(MIKE), engine=engine, project=vision)
    weights = artifact_root() / "runs" / theirs.id / "checkpoints" / "best.pt"
    spec = RunSpec.from_dict({**DIGITS, "model": {"name": "mlp", "weights_file": str(weights)}})
    with pytest.raises(SpecError, match=f"a checkpoint of run {theirs.id}, of another project than default"):
        submit(spec, owner=key(OTTO), engine=engine)
    assert submit(spec, owner=key(MIKE), engine=engine, project=vision).project == vision


def test_a_sweep_and_its_trials_are_its_projects(vision, engine):
    spec = SweepSpec.model_validate(
        {
            "base": digits().model_dump(mode="json"),
            "space": {"optim.lr": {"choice": [0.1, 0.01]}},
            "method": "grid",
            "objective": {"metric": "val/acc"},
        }
    )
    with pytest.raises(auth.PermissionDenied, match="they are a viewer"):
        submit_sweep(spec, owner=key(VIC), engine=engine, project=vision)
    sweep = submit_sweep(spec, owner=key(MIKE), engine=engine, project=vision)
    trials = repo.list_runs(engine, sweep_id=sweep.id).runs
    assert sweep.project == vision and trials and {r.project for r in trials} == {vision}
    with pytest.raises(repo.SweepNotFound):
        readable_sweep(sweep.id, by=person(OTTO), engine=engine)
    with pytest.raises(auth.PermissionDenied, match="may not cancel sweep"):
        cancel_sweep(sweep.id, by=person(VIC), engine=engine)
    assert cancel_sweep(sweep.id, by=person(MAYA), engine=engine).status == "cancelled"


def test_a_model_is_in_the_project_of_its_runs(vision, engine, monkeypatch):
    run = repo.create_run(engine, DIGITS, owner=key(MIKE), project=vision)
    monkeypatch.setattr(registry, "verified_exports", lambda run_id, engine: [{"kind": "onnx", "filename": "m.onnx"}])
    repo.finish_run(engine, run.id, "completed")
    with pytest.raises(repo.RunNotFound):
        registry.register(run.id, "parts-net", person(OTTO), engine)
    with pytest.raises(auth.PermissionDenied, match="may not register models in project vision"):
        registry.register(run.id, "parts-net", person(VIC), engine)
    version = registry.register(run.id, "parts-net", person(MIKE), engine)
    assert (
        version.version == 1 and registry.readable_model("parts-net", by=person(VIC), engine=engine).project == vision
    )
    with pytest.raises(registry.ModelNotFound):
        registry.readable_model("parts-net", by=person(OTTO), engine=engine)
    assert [m.name for m in registry.list_models(engine, project="default")] == []
    other = repo.create_run(engine, DIGITS, owner=key(MIKE))
    repo.finish_run(engine, other.id, "completed")
    with pytest.raises(ValueError, match="model 'parts-net' is in project vision, and run .* in project default"):
        registry.register(other.id, "parts-net", person(MIKE), engine)
    assert registry.set_alias("parts-net", "production", 1, person(MAYA), engine).to_version == 1


def test_local_mode_has_one_project_and_never_asks(engine, broker, monkeypatch):
    monkeypatch.delenv(auth.MODE_ENV, raising=False)
    run = submit(digits(), engine=engine)
    assert run.project == "default" and projects.role(auth.local_user(), "default") == "admin"
    assert [p.name for p in projects.readable(auth.local_user(), engine)] == ["default"]
    assert cancel(run.id, engine=engine, by=auth.local_user()).cancel_requested


def test_an_owner_is_judged_by_their_account_as_admins_are_listed(vision, engine):
    """A run submitted for an owner key (the CLI's --owner, a clone) is judged by that person's rights: an admin
    by the verified e-mail their account was seen with, anyone else by their projects' roles."""
    root = person(ADMIN)
    repo.upsert_account(engine, root.id, "Root", ADMIN)
    assert projects.owner_as_user(root.id, engine).is_admin
    assert submit(digits(), owner=root.id, engine=engine, project=vision).project == vision
    nobody = dataclasses.replace(person(OTTO), id=f"{ISS}#never-seen")
    with pytest.raises(auth.PermissionDenied, match="they are not in it"):
        submit(digits(), owner=nobody.id, engine=engine, project=vision)


def test_a_projects_maintainer_makes_its_alert_rules_and_hears_of_them(vision, engine):
    from datetime import timedelta

    from app.services import alerts
    from db.types import utcnow
    from worker.alerts import evaluate

    rule = alerts.RuleInput("queued", project=vision, minutes=1)
    with pytest.raises(auth.PermissionDenied, match="may not add alert rules of project vision: only its maintainers"):
        alerts.add_rule(person(MIKE), rule, engine)
    with pytest.raises(ProjectHidden):
        alerts.add_rule(person(OTTO), rule, engine)
    with pytest.raises(ValueError, match="a worker_silent rule is global: workers serve every project"):
        alerts.add_rule(person(MAYA), alerts.RuleInput("worker_silent", project=vision, minutes=5), engine)
    made = alerts.add_rule(person(MAYA), rule, engine)
    assert alerts.describe(made) == "project vision: queued for 1 min (cooldown 60 min)"
    since = utcnow() - timedelta(minutes=1)
    run = submit(digits(), owner=key(MIKE), engine=engine, project=vision)
    (fired,) = evaluate(engine, run.created_at + timedelta(minutes=2))
    assert fired.condition.run_id == run.id
    assert [n.run_id for n in alerts.notices(person(MAYA), since, engine)] == [run.id]  # the rule she made
    assert alerts.notices(person(OTTO), since, engine) == []  # neither his rule nor a run he follows
    with pytest.raises(auth.PermissionDenied):
        alerts.remove_rule(person(MIKE), made.id, engine)
    assert alerts.remove_rule(person(MAYA), made.id, engine)
