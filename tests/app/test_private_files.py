"""The data folder holds the database, the sign-in secrets and the uploaded datasets: it is private to its
user (0700), the SQLite file (and its -wal/-shm files) 0600, and no artifact row can make the dashboard
serve a file of it that is not an artifact, whatever its URI says."""

from __future__ import annotations

import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest
from seeding import seed_run

from app.services.artifacts import ArtifactUnavailable, artifact_problem, open_artifact, read_artifact
from db import repo

TORCHDECK = str(Path(sys.executable).parent / "torchdeck")
CLIENT_SECRET = "oidc-client-s3cr3t"


def mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


@pytest.fixture
def usual_umask():
    """The umask most systems give users (022: new files readable by everyone) for the test's duration."""
    old = os.umask(0o022)
    yield
    os.umask(old)


@pytest.fixture
def fresh_home(tmp_path, monkeypatch, usual_umask) -> Path:
    """A TORCHDECK_HOME that does not exist yet, and the default database inside it."""
    home = tmp_path / "somewhere" / ".torchdeck"
    monkeypatch.setenv("TORCHDECK_HOME", str(home))
    monkeypatch.delenv("TORCHDECK_DATABASE_URL", raising=False)
    monkeypatch.delenv("TORCHDECK_ARTIFACTS", raising=False)
    return home


def test_the_data_folder_is_created_private(fresh_home):
    from db.engine import data_home

    assert data_home() == fresh_home
    assert mode(fresh_home) == 0o700


def test_the_sqlite_file_and_its_wal_files_are_private(fresh_home):
    from db.engine import make_engine
    from db.migrate import upgrade

    upgrade()
    engine = make_engine()
    try:
        seed_run(engine, "a run")  # writes: the -wal and -shm files exist while the engine is connected
        db = fresh_home / "torchdeck.db"
        assert mode(fresh_home) == 0o700 and mode(db) == 0o600
        wal = [p for p in (fresh_home / "torchdeck.db-wal", fresh_home / "torchdeck.db-shm") if p.exists()]
        assert wal, "SQLite in WAL mode keeps -wal/-shm files while connected"
        for p in wal:
            assert mode(p) == 0o600, f"{p.name}: {oct(mode(p))}"
    finally:
        engine.dispose()


def test_torchdeck_db_upgrade_in_a_new_folder_leaves_it_private(fresh_home):
    done = subprocess.run(
        [TORCHDECK, "db", "upgrade"],
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ},
        cwd=fresh_home.parent.parent,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert mode(fresh_home) == 0o700 and mode(fresh_home / "torchdeck.db") == 0o600


def test_an_existing_world_readable_folder_and_database_are_made_private(fresh_home):
    from db.engine import data_home, make_engine

    fresh_home.mkdir(parents=True)
    fresh_home.chmod(0o755)
    db = fresh_home / "torchdeck.db"
    db.touch()
    db.chmod(0o644)
    data_home()
    make_engine().dispose()
    assert mode(fresh_home) == 0o700 and mode(db) == 0o600


# --- artifacts: only the artifact root is served ---------------------------------------------------------


@pytest.fixture
def secrets_file(home, monkeypatch) -> Path:
    """The sign-in secrets as team mode writes them: $TORCHDECK_HOME/auth/secrets.toml."""
    from app.auth import write_secrets

    monkeypatch.setenv("TORCHDECK_OIDC_CLIENT_SECRET", CLIENT_SECRET)
    monkeypatch.setenv("TORCHDECK_OIDC_COOKIE_SECRET", "cookie-" + CLIENT_SECRET)
    path = write_secrets(home)
    assert CLIENT_SECRET in path.read_text()
    return path


def _outside_artifacts(home: Path, secrets_file: Path) -> dict[str, str]:
    """URIs of files of the data folder that are no artifacts, in the forms a row could hold them."""
    link = home / "artifacts" / "runs" / "x" / "export" / "model.onnx"
    link.parent.mkdir(parents=True)
    link.symlink_to(secrets_file)  # a link inside the artifact root pointing out of it
    return {
        "secrets": secrets_file.as_uri(),
        "secrets as a path": str(secrets_file),
        "database": (home / "torchdeck.db").as_uri(),
        "dot-dot": f"file://{home}/artifacts/../auth/secrets.toml",
        "link": link.as_uri(),
    }


def test_files_of_the_data_folder_outside_the_artifact_root_are_never_served(home, engine, secrets_file):
    run = seed_run(engine, "r")
    for what, uri in _outside_artifacts(home, secrets_file).items():
        art = repo.add_artifact(engine, run.id, "checkpoint_best", uri, size=10)
        with pytest.raises(ArtifactUnavailable, match="cannot be downloaded here"):
            read_artifact(art.id, engine=engine)
        with pytest.raises(ArtifactUnavailable, match="cannot be downloaded here"):
            open_artifact(art.id, engine=engine)
        assert artifact_problem(art) == "not on this machine nor in this installation's artifact store", what


def test_artifacts_under_the_artifact_root_are_still_served(home, engine):
    run = seed_run(engine, "r")
    onnx = home / "artifacts" / "runs" / run.id / "export" / "model.onnx"
    onnx.parent.mkdir(parents=True)
    onnx.write_bytes(b"onnx-bytes")
    art = repo.add_artifact(engine, run.id, "onnx", onnx.as_uri(), size=10)
    assert read_artifact(art.id, engine=engine) == b"onnx-bytes"
    assert artifact_problem(art) is None


def test_the_artifact_link_and_the_run_page_refuse_the_secrets_file(home, engine, secrets_file, page):
    run = seed_run(engine, "r")
    art = repo.add_artifact(engine, run.id, "checkpoint_best", secrets_file.as_uri(), size=10)
    at = page("artifact.py", id=art.id)
    assert not at.exception
    assert any("cannot be downloaded here" in e.value for e in at.error), [e.value for e in at.error]
    assert not at.get("download_button")
    at = page("run.py", id=run.id)
    at.session_state["run.tab"] = "Artifacts"
    at.run()
    assert not at.exception
    assert any("not on this machine" in c.value for c in at.caption)
    assert "Download" not in [b.label for b in at.get("download_button")]
