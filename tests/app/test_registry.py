"""The model registry through its service and its stable links: a finished run's verified ONNX export registered as
version 1, 2, …; refused for a run that did not finish or has no verified export; aliases moved by the model's
owner (or an admin), refused for another member in team mode, every move audited; and a link by alias that serves
the bytes of the version the alias points at when it is asked, through the real route."""

from __future__ import annotations

import hashlib
import os

import pytest
from seeding import seed_run
from starlette.applications import Starlette
from starlette.testclient import TestClient

from app import auth
from app.services import registry
from app.web import downloads, model_downloads
from db import repo
from db.types import MetricPoint

ISSUER = "https://sso.example.com/realms/lab"
REPORT = b'{"all_ok": true, "versions": {"torch": "2.9.0", "torchdeck": "0.9.1"}, "class_names": ["0", "1"]}'


def exported_run(
    engine, home, data: bytes, *, owner: str = "local", ok: bool = True, status: str = "completed", fingerprint=None
):
    """A run that ended with a verified (or failed, `ok=False`) ONNX export of `data`, its export report beside it,
    and a test score, as a worker records them."""
    run = seed_run(engine, "r", owner=owner, epochs=3, val_acc=0.91, status=status, fingerprint=fingerprint)
    folder = home / "artifacts" / "runs" / run.id / "export"
    folder.mkdir(parents=True, exist_ok=True)
    for name, kind, body, meta in (
        ("model.onnx", "onnx", data, {"ok": ok, "parity": {"passed": ok, "max_abs_diff": 1e-6}}),
        ("export.json", "export_report", REPORT, {}),
    ):
        (folder / name).write_bytes(body)
        digest = hashlib.sha256(body).hexdigest()
        repo.add_artifact(engine, run.id, kind, (folder / name).as_uri(), size=len(body), sha256=digest, meta=meta)
    repo.append_metrics(engine, run.id, [MetricPoint("test/acc", 10_000, 0.88, 3)])
    return repo.get_run(engine, run.id)


def member(sub: str, *, admin: bool = False) -> auth.User:
    claims = {"is_logged_in": True, "iss": ISSUER, "sub": sub, "name": sub.title()}
    claims |= {"email": f"{sub}@example.com", "email_verified": True}
    user = auth.user_from_claims(claims)
    return auth.User(user.id, user.name, is_admin=admin, email=user.email)


def test_a_finished_runs_verified_onnx_becomes_version_1_with_its_lineage(engine, home):
    run = exported_run(engine, home, b"onnx-v1")
    v = registry.register(run.id, "digits", auth.local_user(), engine)
    assert (v.model_name, v.version, v.run_id) == ("digits", 1, run.id)
    assert {e["filename"]: e["kind"] for e in v.artifacts} == {"model.onnx": "onnx", "export.json": "export_report"}
    onnx = registry.version_file(v, "model.onnx")
    assert onnx["sha256"] == hashlib.sha256(b"onnx-v1").hexdigest()
    line = v.lineage
    assert line["run_id"] == run.id and line["spec"]["data"]["name"] == "digits" and line["dataset"]["name"] == "digits"
    assert line["dataset_fingerprint"] is None and "not recorded" in line["dataset_fingerprint_note"]
    assert line["scores"]["val_acc_best"] == pytest.approx(0.91) and line["scores"]["test"] == {"test/acc": 0.88}
    assert line["scores"]["val_best"]["metric"] == "val/acc"
    assert line["export_versions"] == {"torch": "2.9.0", "torchdeck": "0.9.1"} and line["class_names"] == ["0", "1"]


def test_a_version_records_the_dataset_fingerprint_its_run_recorded(engine, home):
    run = exported_run(engine, home, b"onnx-v1", fingerprint="ab" * 32)
    line = registry.register(run.id, "digits", auth.local_user(), engine).lineage
    assert line["dataset_fingerprint"] == "ab" * 32 and line["dataset_fingerprint_note"] is None
    assert line["git_commit"] == registry.git_commit()
    assert (
        registry.register(exported_run(engine, home, b"onnx-v2").id, "digits", auth.local_user(), engine).version == 2
    )


@pytest.mark.parametrize(
    ("ok", "status", "words"),
    [(True, "failed", "is failed: only a run that finished successfully"), (False, "completed", "no verified export")],
)
def test_a_run_that_failed_or_has_no_verified_export_is_refused(engine, home, ok, status, words):
    run = exported_run(engine, home, b"onnx", ok=ok, status=status)
    with pytest.raises(registry.RegistryRefused, match=words):
        registry.register(run.id, "digits", auth.local_user(), engine)
    assert registry.list_models(engine) == []


def test_names_that_would_break_a_link_are_refused(engine, home):
    run = exported_run(engine, home, b"onnx")
    for name in ("a/b", "a@b", "", "../x"):
        with pytest.raises(registry.RegistryRefused, match="model name"):
            registry.register(run.id, name, auth.local_user(), engine)
    registry.register(run.id, "digits", auth.local_user(), engine)
    for alias in ("1", "prod/x", "a b"):
        with pytest.raises(registry.RegistryRefused, match="alias"):
            registry.set_alias("digits", alias, 1, auth.local_user(), engine)


def test_team_mode_only_the_owner_or_an_admin_registers_and_moves_aliases(engine, home, monkeypatch):
    monkeypatch.setenv("TORCHDECK_MODE", "team")
    ana, bo, admin = member("ana"), member("bo"), member("root", admin=True)
    first = exported_run(engine, home, b"onnx-1", owner=ana.id)
    second = exported_run(engine, home, b"onnx-2", owner=ana.id)
    registry.register(first.id, "digits", ana, engine)
    with pytest.raises(
        auth.PermissionDenied,
        match="only its owner \\(a member of project default\\), a maintainer of the project or an admin",
    ):
        registry.register(second.id, "digits", bo, engine)
    registry.register(second.id, "digits", ana, engine)
    assert registry.set_alias("digits", "production", 1, ana, engine).to_version == 1
    with pytest.raises(auth.PermissionDenied, match="may not move the aliases of model digits"):
        registry.set_alias("digits", "production", 2, bo, engine)
    assert registry.resolve("digits", "production", engine).version == 1  # the refused move changed nothing
    registry.set_alias("digits", "production", 2, admin, engine)
    shown = registry.show("digits", engine)
    assert shown["model"].owner == ana.id and shown["aliases"] == {"production": 2}
    assert [(m.from_version, m.to_version, m.moved_by) for m in shown["moves"]] == [(1, 2, admin.id), (None, 1, ana.id)]
    assert registry.may_modify(ana, shown["model"]) and not registry.may_modify(bo, shown["model"])


@pytest.fixture
def client(home, monkeypatch):
    monkeypatch.setenv(downloads.SERVED_ENV, "0")
    with TestClient(Starlette(routes=model_downloads.routes()), client=("127.0.0.1", 50000)) as c:
        yield c


def test_a_link_by_alias_serves_the_version_the_alias_points_at_when_asked(client, engine, home):
    one, two = os.urandom(2 << 20), os.urandom(1 << 20)
    for data in (one, two):
        registry.register(exported_run(engine, home, data).id, "digits", auth.local_user(), engine)
    registry.set_alias("digits", "production", 1, auth.local_user(), engine)
    link = model_downloads.url("digits", "production", "model.onnx")
    assert link == "/_torchdeck/models/digits@production/model.onnx"
    got = client.get(link)
    assert got.status_code == 200 and got.content == one
    assert got.headers["content-type"] == "application/octet-stream"
    assert got.headers["content-disposition"].startswith('attachment; filename="model.onnx"')
    registry.set_alias("digits", "production", 2, auth.local_user(), engine)
    assert client.get(link).content == two
    assert client.get(model_downloads.url("digits", 1, "model.onnx")).content == one


def test_links_that_name_nothing_or_a_changed_file_are_refused(client, engine, home):
    run = exported_run(engine, home, b"onnx-bytes")
    registry.register(run.id, "digits", auth.local_user(), engine)
    for path, status, words in (
        ("digits@production/model.onnx", 404, "no alias 'production'"),
        ("digits/7/model.onnx", 404, "no version 7"),
        ("pets@production/model.onnx", 404, "no registered model 'pets'"),
        ("digits/1/best.pt", 404, "has no file 'best.pt'"),
        ("digits/model.onnx", 400, "name a version"),
        ("digits@1/model.onnx", 400, "alias '1'"),
    ):
        got = client.get(f"{model_downloads.PATH}/{path}")
        assert got.status_code == status and words in got.text, (path, got.status_code, got.text)
    (home / "artifacts" / "runs" / run.id / "export" / "model.onnx").write_bytes(b"EVIL-bytes")
    got = client.get(model_downloads.url("digits", 1, "model.onnx"))
    assert got.status_code == 409 and b"EVIL" not in got.content


def test_the_links_answer_this_machine_only_in_local_mode(engine, home, monkeypatch):
    registry.register(exported_run(engine, home, b"onnx").id, "digits", auth.local_user(), engine)
    with TestClient(Starlette(routes=model_downloads.routes()), client=("203.0.113.9", 4000)) as remote:
        got = remote.get(model_downloads.url("digits", 1, "model.onnx"))
    assert got.status_code == 403 and "only answers on this machine" in got.text


def test_the_commit_is_read_from_a_checkout_and_none_elsewhere(tmp_path):
    sha = "ab" * 20
    assert registry.git_commit(tmp_path) is None  # an installed package: no .git
    git = tmp_path / ".git"
    (git / "refs" / "heads").mkdir(parents=True)
    (git / "HEAD").write_text("ref: refs/heads/main\n")
    (git / "packed-refs").write_text(f"# pack-refs with: peeled\n{sha} refs/heads/main\n")
    assert registry.git_commit(tmp_path) == sha
    (git / "refs" / "heads" / "main").write_text("cd" * 20 + "\n")
    assert registry.git_commit(tmp_path) == "cd" * 20
    (git / "HEAD").write_text(sha)  # a detached head
    assert registry.git_commit(tmp_path) == sha


def test_a_run_holding_a_registered_version_is_not_deleted(engine, home):
    from app.services.runs import refused_removal

    run = exported_run(engine, home, b"onnx-v1")
    registry.register(run.id, "digits", auth.local_user(), engine)
    why = refused_removal(run.id, by=auth.local_user(), engine=engine)
    assert why is not None and "digits v1" in why and "break their download links" in why
    assert repo.get_run(engine, run.id).status == "completed"  # nothing of it was removed
    assert registry.version_file(registry.resolve("digits", 1, engine), "model.onnx")["sha256"]
    other = exported_run(engine, home, b"onnx-v2")  # a run no version holds is deleted as before
    assert refused_removal(other.id, by=auth.local_user(), engine=engine) is None
