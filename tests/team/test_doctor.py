"""`torchdeck doctor` against real servers: a healthy deployment passes; a stopped Redis, a wrong
database URL and an unwritable artifact store each give one clear ✗ line with its fix, and a
non-zero exit."""

from __future__ import annotations

import os
import subprocess
import uuid
from pathlib import Path

import pytest

from db.engine import make_engine
from db.migrate import upgrade
from db.repo import upsert_worker
from tests.team.conftest import ROOT, VENV_BIN, clean_env

pytestmark = pytest.mark.timeout(120)


# Team mode with its sign-in settings complete (no allow-list: a warning, not a failure).
TEAM_SIGN_IN = {
    "TORCHDECK_MODE": "team",
    "TORCHDECK_OIDC_ISSUER": "https://sso.example.com/realms/lab",
    "TORCHDECK_OIDC_CLIENT_ID": "torchdeck",
    "TORCHDECK_OIDC_CLIENT_SECRET": "s3cret",
    "TORCHDECK_OIDC_REDIRECT_URI": "https://torchdeck.example.com/oauth2callback",
    "TORCHDECK_OIDC_COOKIE_SECRET": "a-long-random-cookie-secret",
    "TORCHDECK_ADMINS": "root@example.com",
}


def doctor(env: dict[str, str]) -> tuple[int, str]:
    """The real command, as an operator runs it."""
    done = subprocess.run(
        [str(VENV_BIN / "torchdeck"), "doctor"],
        cwd=ROOT,
        env=clean_env(**env),
        check=False,
        capture_output=True,
        text=True,
        timeout=60,
    )
    return done.returncode, done.stdout + done.stderr


@pytest.fixture
def doctor_here(monkeypatch):
    """The same checks in this process (no 3 s interpreter start on a busy 2-core machine): the
    exit status and the lines the command would print."""
    from app.cli.doctor import run_checks

    def run(env: dict[str, str]) -> tuple[int, str]:
        for k in list(os.environ):
            if k.startswith(("TORCHDECK_", "AWS_")):
                monkeypatch.delenv(k)
        for k, v in env.items():
            monkeypatch.setenv(k, v)
        results = run_checks()
        return int(any(c.ok is False for c in results)), "\n".join(ln for c in results for ln in c.lines())

    return run


def line(out: str, mark: str, name: str) -> str:
    """The output line of check `name` with `mark`, and the lines that belong to it (notes, fix)."""
    lines = out.splitlines()
    for i, ln in enumerate(lines):
        if ln.startswith(f"{mark} {name}:"):
            block = [ln]
            for more in lines[i + 1 :]:
                if not more.startswith("    "):
                    break
                block.append(more)
            return "\n".join(block)
    raise AssertionError(f"no '{mark} {name}:' line in:\n{out}")


@pytest.fixture
def deployment(tmp_path: Path, redis_server) -> dict[str, str]:
    """A healthy small deployment: an upgraded SQLite database, Redis, a live CPU worker's heartbeat
    row (what a running worker writes every 2 s), a writable artifact folder."""
    url = f"sqlite:///{tmp_path / 'torchdeck.db'}"
    upgrade(url)
    engine = make_engine(url)
    upsert_worker(engine, "cpu@testhost", hostname="testhost", queues=["cpu"], devices=[{"kind": "cpu", "cores": 2}])
    upsert_worker(engine, "jobs@testhost", hostname="testhost", queues=["jobs"], devices=[{"kind": "cpu", "cores": 2}])
    engine.dispose()
    return {
        "TORCHDECK_HOME": str(tmp_path / "home"),
        "TORCHDECK_DATABASE_URL": url,
        "TORCHDECK_BROKER_URL": redis_server.url(),
        "TORCHDECK_ARTIFACTS": str(tmp_path / "artifacts"),
    }


def test_healthy_deployment_passes(deployment):
    code, out = doctor(deployment)
    assert code == 0, out
    for name in ("database", "broker", "worker cpu@testhost", "workers", "artifacts"):
        line(out, "✓", name)
    assert "schema" in line(out, "✓", "database") and "current" in line(out, "✓", "database")
    assert "CPU (2 cores)" in line(out, "✓", "worker cpu@testhost")
    assert "***" in line(out, "✓", "broker") and "test-redis-pw" not in out  # the password is never printed
    assert out.strip().endswith("all checks passed")


def test_stopped_redis(deployment, redis_server):
    redis_server.stop()
    code, out = doctor(deployment)
    assert code == 1, out
    broker = line(out, "✗", "broker")
    assert f"cannot reach redis://:***@127.0.0.1:{redis_server.port}/0" in broker
    assert "refused" in broker.lower()
    assert "fix: start Redis" in broker and "TORCHDECK_BROKER_URL" in broker
    line(out, "✓", "database")  # the other checks still run and pass
    line(out, "✓", "artifacts")
    assert out.strip().endswith("1 problem(s): broker")


def test_wrong_redis_password(deployment, redis_server, doctor_here):
    code, out = doctor_here({**deployment, "TORCHDECK_BROKER_URL": f"redis://:wrong@127.0.0.1:{redis_server.port}/0"})
    assert code == 1
    broker = line(out, "✗", "broker")
    assert "refused the password" in broker and "REDIS_PASSWORD" in broker


def test_wrong_database_url_postgres(deployment, postgres):
    name = f"missing_{uuid.uuid4().hex[:8]}"  # a database that does not exist on a real server
    code, out = doctor({**deployment, "TORCHDECK_DATABASE_URL": postgres.tcp_url(name)})
    assert code == 1, out
    db = line(out, "✗", "database")
    assert f"cannot connect to postgresql+psycopg://postgres@127.0.0.1:{postgres.port}/{name}" in db
    assert f'database "{name}" does not exist' in db
    assert "fix: check host, port, user, password and database name in TORCHDECK_DATABASE_URL" in db
    assert "not checked" in line(out, "–", "workers")  # it needs the database
    line(out, "✓", "broker")


def test_wrong_database_port(deployment, doctor_here):
    from tests._servers import free_port

    port = free_port()  # nothing listens there
    code, out = doctor_here(
        {**deployment, "TORCHDECK_DATABASE_URL": f"postgresql://torchdeck:secret-pw@127.0.0.1:{port}/torchdeck"}
    )
    assert code == 1
    db = line(out, "✗", "database")
    assert f"cannot connect to postgresql+psycopg://torchdeck:***@127.0.0.1:{port}/torchdeck" in db
    assert "refused" in db.lower()
    assert "secret-pw" not in out


def test_database_without_schema(deployment, postgres, doctor_here):
    url = postgres.create_database(f"empty_{uuid.uuid4().hex[:8]}")
    code, out = doctor_here({**deployment, "TORCHDECK_DATABASE_URL": url})
    assert code == 1
    db = line(out, "✗", "database")
    assert "no torchdeck tables" in db and "fix: run `torchdeck db upgrade`" in db


def test_unwritable_artifact_folder(deployment, tmp_path):
    blocker = tmp_path / "not-a-folder"
    blocker.write_text("a file where the artifact folder should be")
    code, out = doctor({**deployment, "TORCHDECK_ARTIFACTS": str(blocker / "artifacts")})
    assert code == 1, out
    art = line(out, "✗", "artifacts")
    assert f"{blocker / 'artifacts'}: cannot write to it" in art and "Not a directory" in art
    assert "fix: make" in art and "writable" in art


@pytest.mark.skipif(
    os.geteuid() == 0, reason="root writes through permission bits; the file-in-the-way case covers root"
)
def test_read_only_artifact_folder(deployment, tmp_path, doctor_here):
    ro = tmp_path / "ro"
    ro.mkdir()
    ro.chmod(0o555)
    try:
        code, out = doctor_here({**deployment, "TORCHDECK_ARTIFACTS": str(ro)})
    finally:
        ro.chmod(0o755)
    assert code == 1
    assert "Permission denied" in line(out, "✗", "artifacts")


def test_s3_bucket_missing(deployment, moto_s3, doctor_here):
    code, out = doctor_here({**deployment, **moto_s3.env(), "TORCHDECK_ARTIFACTS": "s3://no-such-bucket/torchdeck"})
    assert code == 1
    art = line(out, "✗", "artifacts")
    assert "s3://no-such-bucket/torchdeck" in art and "create the bucket 'no-such-bucket'" in art


def test_s3_bucket_works(deployment, moto_s3, doctor_here):
    moto_s3.client().create_bucket(Bucket="doctor-ok")
    code, out = doctor_here({**deployment, **moto_s3.env(), "TORCHDECK_ARTIFACTS": "s3://doctor-ok/team"})
    assert code == 0, out
    assert "s3://doctor-ok/team: write, read back and delete work" in line(out, "✓", "artifacts")


def test_no_live_worker_and_gpu_worker_without_gpu(deployment, doctor_here):
    from datetime import UTC, datetime, timedelta

    from sqlalchemy import update

    from db.models import Worker

    engine = make_engine(deployment["TORCHDECK_DATABASE_URL"])
    with engine.begin() as conn:  # the CPU worker stopped a minute ago
        conn.execute(update(Worker).values(heartbeat_at=datetime.now(UTC) - timedelta(minutes=1)))
    code, out = doctor_here(deployment)
    assert code == 1
    workers = line(out, "✗", "workers")
    assert "no worker has sent a heartbeat" in workers and "cpu@testhost" in workers and "fix: start one" in workers
    upsert_worker(engine, "gpu0@box", hostname="box", queues=["gpu"], devices=[{"kind": "cpu", "cores": 8}])
    engine.dispose()
    code, out = doctor_here({**deployment, **TEAM_SIGN_IN})  # a team deployment: its gpu queue is its GPU hosts'
    assert code == 1
    line(out, "✓", "sign-in")
    assert "sees no GPU" in line(out, "✗", "worker gpu0@box")
    jobs = line(out, "✗", "jobs")  # the jobs worker stopped with the CPU one
    assert "no live worker serves the jobs queue" in jobs and "fix: `torchdeck worker`" in jobs


def test_local_mode_passes_the_worker_make_up_starts_on_a_machine_without_a_gpu(deployment, doctor_here):
    """`make up` on a laptop: one worker consuming gpu and cpu that sees no GPU, beside the jobs worker. The Workers
    page says it takes CPU runs, the gpu queue's too, on its CPU; so does the doctor, as a note, and it passes."""
    engine = make_engine(deployment["TORCHDECK_DATABASE_URL"])
    upsert_worker(
        engine, "cpu@testhost", hostname="testhost", queues=["gpu", "cpu"], devices=[{"kind": "cpu", "cores": 2}]
    )
    engine.dispose()
    code, out = doctor_here(deployment)
    assert code == 0, out
    laptop = line(out, "✓", "worker cpu@testhost")
    assert "takes CPU runs (the gpu queue's too, on its CPU)" in laptop and "trains those runs on its CPU" in laptop
    assert "fix:" not in laptop


def test_team_mode_without_sign_in_settings(deployment, doctor_here):
    code, out = doctor_here({**deployment, "TORCHDECK_MODE": "team", "TORCHDECK_OIDC_CLIENT_ID": "torchdeck"})
    assert code == 1
    sign_in = line(out, "✗", "sign-in")
    assert (
        "TORCHDECK_OIDC_SERVER_METADATA_URL" in sign_in and "TORCHDECK_OIDC_CLIENT_ID" not in sign_in.split("fix:")[0]
    )


def test_team_mode_warns_when_everyone_signed_in_is_a_member(deployment, doctor_here):
    team = {**deployment, **TEAM_SIGN_IN}
    code, out = doctor_here(team)
    assert code == 0, out  # a warning, not a failure
    sign_in = line(out, "✓", "sign-in")
    assert "warning: no allow-list" in sign_in and "everyone who can sign in at the provider is a member" in sign_in
    code, out = doctor_here({**team, "TORCHDECK_ALLOWED_DOMAINS": "example.com"})
    sign_in = line(out, "✓", "sign-in")
    assert code == 0 and "warning" not in sign_in and "TORCHDECK_ALLOWED_DOMAINS=example.com" in sign_in
