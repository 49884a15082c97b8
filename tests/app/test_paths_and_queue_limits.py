"""What a run may read and how many a person may queue, enforced in app/services/runs.py before a run is stored
(and in app/services/jobs.py before a pre-flight is sent): `data.path` and `model.weights_file` only under the allowed
folders (team mode: uploaded datasets and run checkpoints), and, in team mode, a per-owner queued-runs limit."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from app import auth
from app.services import jobs, paths
from app.services.admission import MAX_QUEUED_ENV
from app.services.artifacts import artifact_root
from app.services.runs import submit
from core.config import RunSpec, SpecError
from db import repo


def imagefolder(path: str | Path, **model) -> RunSpec:
    return RunSpec.from_dict({"data": {"name": "imagefolder", "path": str(path)}, "model": model})


def digits(**model) -> RunSpec:
    return RunSpec.from_dict({"data": {"name": "digits", "image_size": 8}, "model": model})


@pytest.fixture
def team(monkeypatch):
    monkeypatch.setenv(auth.MODE_ENV, "team")


def test_a_run_reading_outside_the_allowed_folders_is_refused_before_it_is_stored(engine, home, monkeypatch):
    monkeypatch.delenv(paths.ROOTS_ENV, raising=False)
    with pytest.raises(SpecError) as refused:
        submit(imagefolder("/"), engine=engine)
    ((field, message),) = refused.value.errors
    assert field == "data.path" and str(home) in message and "TORCHDECK_PATH_ROOTS" in message
    assert not any(f" {entry}" in message or f"/{entry}," in message for entry in ("proc", "usr", "bin", "etc"))
    assert repo.list_runs(engine).total == 0  # nothing stored, nothing queued
    link = home / "innocent"
    link.symlink_to("/etc")  # a link out of an allowed folder is outside it
    with pytest.raises(SpecError, match="data.path"):
        submit(imagefolder(link), engine=engine)
    with pytest.raises(SpecError, match="model.weights_file"):
        submit(digits(weights_file="/etc/passwd"), engine=engine)
    with pytest.raises(SpecError, match="data.path"):
        submit(imagefolder(home / ".." / ".." / "etc"), engine=engine)


def test_local_mode_reads_the_data_folder_the_current_folder_and_the_configured_roots(
    engine, home, tmp_path_factory, monkeypatch
):
    elsewhere = tmp_path_factory.mktemp("shared-data")
    monkeypatch.delenv(paths.ROOTS_ENV, raising=False)
    art = artifact_root()
    assert paths.path_problems(imagefolder(home / "datasets" / "pets"), engine, art) == []
    assert paths.path_problems(imagefolder(Path.cwd() / "data" / "pets"), engine, art) == []
    assert paths.path_problems(imagefolder("data/pets"), engine, art) == []  # relative: the current folder
    assert [f for f, _ in paths.path_problems(imagefolder(elsewhere), engine, art)] == ["data.path"]
    monkeypatch.setenv(paths.ROOTS_ENV, os.pathsep.join([str(elsewhere), "/nonexistent-root"]))
    assert paths.path_problems(imagefolder(elsewhere / "pets"), engine, art) == []
    assert paths.path_problems(digits(weights_file=str(elsewhere / "w.safetensors")), engine, art) == []


def test_team_mode_reads_uploaded_datasets_and_checkpoints_only(team, engine, home, monkeypatch):
    monkeypatch.delenv(paths.ROOTS_ENV, raising=False)
    art = artifact_root()
    uploaded = home / "datasets" / "pets"
    repo.create_dataset(
        engine,
        "pets",
        str(uploaded),
        classes=["cat", "dog"],
        counts={"cat": 1, "dog": 1},
        status="ready",
        owner="someone",
    )
    assert paths.path_problems(imagefolder(uploaded), engine, art) == []
    # In team mode the data folder itself is no longer open: it holds the database and the sign-in secrets.
    for other in (home / "datasets", home / "auth", Path.cwd()):
        ((field, message),) = paths.path_problems(imagefolder(other), engine, art)
        assert field == "data.path" and "uploaded dataset" in message
    checkpoint = art / "runs" / "abc" / "checkpoints" / "best.pt"
    assert paths.path_problems(digits(weights_file=str(checkpoint)), engine, art) == []
    assert [f for f, _ in paths.path_problems(digits(weights_file=str(home / "torchdeck.db")), engine, art)] == [
        "model.weights_file"
    ]


def test_a_preflight_reading_outside_is_refused_without_sending_anything(engine, home, broker, monkeypatch):
    monkeypatch.delenv(paths.ROOTS_ENV, raising=False)
    result = jobs.preflight(imagefolder("/etc"))
    assert result["ok"] is False and "data.path" in result["error"]
    assert broker.llen("jobs") == 0 and broker.dbsize() == 0


def test_team_mode_limits_each_persons_queued_runs(team, engine, home, broker, monkeypatch):
    monkeypatch.setenv(MAX_QUEUED_ENV, "2")
    spec = digits()
    for _ in range(2):
        submit(spec, owner="ana", engine=engine)
    with pytest.raises(repo.QueueLimitReached, match="ana has 2 queued runs; this dashboard allows 2"):
        submit(spec, owner="ana", engine=engine)
    assert broker.llen(spec.resource) == 2 and repo.list_runs(engine, owner="ana").total == 2
    submit(spec, owner="bob", engine=engine)  # the limit is per person
    first = repo.list_runs(engine, owner="ana").runs[0]
    repo.request_cancel(engine, first.id)  # a queued run that ends frees its place
    submit(spec, owner="ana", engine=engine)
    monkeypatch.setenv(MAX_QUEUED_ENV, "0")  # 0: no limit
    submit(spec, owner="ana", engine=engine)
    monkeypatch.setenv(MAX_QUEUED_ENV, "many")
    with pytest.raises(ValueError, match="TORCHDECK_MAX_QUEUED_PER_OWNER='many' is not a whole number"):
        submit(spec, owner="ana", engine=engine)


def test_local_mode_has_no_queued_limit(engine, home, broker, monkeypatch):
    monkeypatch.delenv(auth.MODE_ENV, raising=False)
    monkeypatch.setenv(MAX_QUEUED_ENV, "1")
    for _ in range(3):
        submit(digits(), owner="local", engine=engine)
    assert repo.list_runs(engine).total == 3


def test_cli_submissions_say_whose_they_are_and_respect_the_limits(team, engine, home, broker, monkeypatch, tmp_path):
    import getpass

    from typer.testing import CliRunner

    from app.cli import app

    spec_file = tmp_path / "run.yaml"
    spec_file.write_text(digits().to_yaml())
    monkeypatch.setenv(MAX_QUEUED_ENV, "1")
    done = CliRunner().invoke(app, ["submit", str(spec_file)])
    assert done.exit_code == 0, done.output
    run = repo.get_run(engine, done.output.strip().splitlines()[-1])
    assert run.owner == f"cli:{getpass.getuser()}"  # not a signed-in identity: only an admin may cancel it
    refused = CliRunner().invoke(app, ["submit", str(spec_file)])
    assert refused.exit_code == 1 and "allows 1 per person" in refused.output
    named = CliRunner().invoke(app, ["submit", str(spec_file), "--owner", "ana"])
    assert named.exit_code == 0 and repo.list_runs(engine, owner="ana").total == 1
    outside = CliRunner().invoke(
        app, ["submit", str(spec_file), "--owner", "ana2", "--set", "model.weights_file=/etc/passwd"]
    )
    assert outside.exit_code == 1 and "model.weights_file" in outside.output


def test_a_relative_path_is_stored_as_it_was_checked(engine, home, broker, monkeypatch):
    """A worker runs in another folder (or on another host): the run keeps the absolute path that was checked."""
    monkeypatch.chdir(home)
    run = submit(imagefolder("datasets/pets"), engine=engine)
    assert repo.get_run(engine, run.id).spec["data"]["path"] == str(home / "datasets" / "pets")


def test_an_uploaded_dataset_is_never_a_download_folder(team, engine, home, monkeypatch):
    """A torchvision dataset with download=true pointed at someone's uploaded folder would write into it."""
    monkeypatch.delenv(paths.ROOTS_ENV, raising=False)
    uploaded = home / "datasets" / "pets"
    repo.create_dataset(
        engine, "pets", str(uploaded), classes=["cat", "dog"], counts={"cat": 1, "dog": 1}, status="ready", owner="ana"
    )
    spec = RunSpec.from_dict({"data": {"name": "mnist", "path": str(uploaded), "download": True}})
    assert [f for f, _ in paths.path_problems(spec, engine, artifact_root())] == ["data.path"]


def test_team_mode_refuses_a_sweep_whose_runs_in_flight_exceed_the_limit(team, engine, home, broker, monkeypatch):
    from app.services import sweeps
    from sweep.spec import SweepSpec

    monkeypatch.setenv(MAX_QUEUED_ENV, "4")
    spec = SweepSpec.model_validate(
        {
            "base": digits().model_dump(mode="json"),
            "seeds": 3,
            "budget": {"parallel": 2},
            "space": {"optim.lr": {"choice": [0.1, 0.01, 0.001]}},
            "method": "grid",
        }
    )
    with pytest.raises(ValueError, match="budget.parallel × seeds = 6 runs in flight"):
        sweeps.submit_sweep(spec, owner="ana", engine=engine)
    assert repo.list_sweeps(engine) == [] and broker.llen(spec.base.resource) == 0
    ok = sweeps.submit_sweep(spec.model_copy(update={"seeds": 2}), owner="ana", engine=engine)
    assert broker.llen(spec.base.resource) == 4 and len(repo.sweep_runs(engine, ok.id)) == 4


def test_what_an_upload_may_do_follows_the_catalogs_dataset_kind_not_a_name(team, engine, home, page, monkeypatch):
    """Any dataset core/catalog.py says is read from a folder (today imagefolder) is treated as an uploaded one:
    its registered folder may be read, a similar run is one of the same folder, and New run's `?dataset=` never
    picks it as a built-in dataset."""
    from app.present import new_run_hints
    from core import catalog

    monkeypatch.setitem(catalog.DATASETS, "digits", catalog.DatasetEntry("folder", ("all",), 3, 64, None))
    monkeypatch.delenv(paths.ROOTS_ENV, raising=False)
    uploaded, other = home / "datasets" / "pets", home / "datasets" / "cars"
    for name, folder in (("pets", uploaded), ("cars", other)):
        repo.create_dataset(
            engine, name, str(folder), classes=["a", "b"], counts={"a": 1, "b": 1}, status="ready", owner="someone"
        )
    as_folder = RunSpec.from_dict({"data": {"name": "digits", "path": str(uploaded)}})
    assert paths.path_problems(as_folder, engine, artifact_root()) == []
    for folder in (uploaded, other):
        r = repo.create_run(
            engine,
            RunSpec.from_dict({"data": {"name": "digits", "path": str(folder)}}).model_dump(mode="json"),
            name=folder.name,
        )
        repo.claim_run(engine, r.id, "w1")
        repo.finish_run(engine, r.id, "completed", summary={})
    similar = new_run_hints.similar_runs(
        engine, {"data.name": "digits", "model.name": as_folder.model.name, "data.path": str(uploaded)}
    )
    assert [r.name for r in similar] == ["pets"]  # the same folder only
    monkeypatch.delenv(auth.MODE_ENV)  # the New run page, in local mode (no sign-in)
    at = page("new_run.py", dataset="digits")
    assert any("No dataset" in w.value and "digits" in w.value and "is ready" in w.value for w in at.warning)
