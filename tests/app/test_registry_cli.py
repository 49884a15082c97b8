"""`torchdeck models list|show|register|alias|download` on a real database (SQLite and Postgres): what an operator
does from a shell, with the files checked against the SHA-256 the version recorded."""

from __future__ import annotations

import hashlib
import json
import uuid

import pytest
from test_registry import exported_run
from typer.testing import CliRunner

from app.cli import app
from db.engine import make_engine
from db.migrate import upgrade


@pytest.fixture(params=("sqlite", "postgres"))
def db(request, home, monkeypatch):
    """An engine on the database the CLI uses (TORCHDECK_DATABASE_URL): the test's SQLite file, or a fresh Postgres
    database migrated like a user's."""
    if request.param == "sqlite":
        engine = make_engine()
        yield engine
        engine.dispose()
        return
    server = request.getfixturevalue("postgres")
    name = f"test_{uuid.uuid4().hex[:12]}"
    url = server.create_database(name)
    monkeypatch.setenv("TORCHDECK_DATABASE_URL", url)
    upgrade(url)
    engine = make_engine(url)
    yield engine
    engine.dispose()
    server.drop_database(name)


def cli(*args: str):
    return CliRunner().invoke(app, ["models", *args], catch_exceptions=False)


def test_register_alias_show_list_and_download_from_a_shell(db, home, tmp_path, monkeypatch):
    one, two = exported_run(db, home, b"onnx-one"), exported_run(db, home, b"onnx-two")
    for run, version in ((one, 1), (two, 2)):
        done = cli("register", run.id, "digits")
        assert done.exit_code == 0 and f"digits version {version}: model.onnx, export.json" in done.output
    assert cli("alias", "digits", "production", "1").output.strip() == "digits@production: (new) → 1"
    out = tmp_path / "got.onnx"
    done = cli("download", "digits@production", "model.onnx", "--out", str(out))
    assert done.exit_code == 0 and out.read_bytes() == b"onnx-one"
    assert hashlib.sha256(b"onnx-one").hexdigest() in done.output
    assert cli("alias", "digits", "production", "2").output.strip() == "digits@production: 1 → 2"
    monkeypatch.chdir(tmp_path)
    assert cli("download", "digits@production").exit_code == 0 and (tmp_path / "model.onnx").read_bytes() == b"onnx-two"
    assert cli("download", "digits/1", "--out", str(out)).exit_code == 0 and out.read_bytes() == b"onnx-one"
    listed = cli("list").output
    assert "digits" in listed and "production→2" in listed
    shown = json.loads(cli("show", "digits", "--json").output)
    assert [v["run_id"] for v in shown["versions"]] == [one.id, two.id] and shown["aliases"] == {"production": 2}
    assert [(m["from_version"], m["to_version"]) for m in shown["moves"]] == [(1, 2), (None, 1)]
    assert "production 1 → 2" in cli("show", "digits").output


def test_refusals_say_why_and_write_nothing(db, home, tmp_path):
    failed = exported_run(db, home, b"onnx", status="failed")
    done = CliRunner().invoke(app, ["models", "register", failed.id, "digits"])
    assert done.exit_code == 2 and "only a run that finished successfully" in done.output
    good = exported_run(db, home, b"onnx-good")
    assert cli("register", good.id, "digits").exit_code == 0
    done = CliRunner().invoke(app, ["models", "alias", "digits", "production", "5"])
    assert done.exit_code == 2 and "no version 5" in done.output
    (home / "artifacts" / "runs" / good.id / "export" / "model.onnx").write_bytes(b"EVIL-good")
    out = tmp_path / "x.onnx"
    done = CliRunner().invoke(app, ["models", "download", "digits/1", "--out", str(out)])
    assert done.exit_code == 1 and "changed" in done.output and not out.exists()
    assert not list(tmp_path.glob(".*.part"))
