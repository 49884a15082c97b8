"""Parity: the services of docker-compose.yml, started natively with the commands and environment
docker-compose itself resolves from the file, against a real Postgres, a real Redis (with a
password) and an S3 endpoint (moto's server) as the artifact store.

migrate runs to completion; worker-cpu starts and passes its own healthcheck; app (`torchdeck ui`,
team mode) answers /_stcore/health and passes its healthcheck; a run submitted through the app's
service completes on that worker, and its ONNX file downloads through the app's service by its
artifact id, from the bucket (each service has its own TORCHDECK_HOME, as containers would)."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest
import yaml

from tests._servers import free_port
from tests.team.conftest import ROOT, VENV_BIN, clean_env, stop, wait_http

pytestmark = pytest.mark.timeout(240)
FINAL = ("completed", "early_stopped", "cancelled", "failed", "diverged", "lost")
RUN = {  # tiny: ~1,400 real 12×12 digits, one epoch, ONNX export
    "name": "parity",
    "data": {"name": "digits", "image_size": 12},
    "model": {"name": "simple_cnn", "hidden": 16},
    "train": {"epochs": 1, "batch_size": 64},
    "export": {"formats": ["onnx"]},
    "device": "cpu",
    "seed": 0,
}


def resolved_services(env_file: Path) -> dict:
    exe = shutil.which("docker-compose")
    if exe is None:
        pytest.fail(
            "docker-compose is not installed (make test installs it: apt-get install docker-compose)", pytrace=False
        )
    done = subprocess.run(
        [exe, "--env-file", str(env_file), "-f", str(ROOT / "docker-compose.yml"), "config"],
        cwd=env_file.parent,
        env=clean_env(),
        check=False,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    return yaml.safe_load(done.stdout)["services"]


def native(argv: list[str], container_port: str | None = None, port: int | None = None) -> list[str]:
    """A container command on this machine: the venv's programs, and a free port for the container's."""
    programs = {"torchdeck": str(VENV_BIN / "torchdeck"), "python": sys.executable, "celery": str(VENV_BIN / "celery")}
    out = [programs.get(argv[0], argv[0]), *argv[1:]]
    return [str(port) if container_port and a == container_port else a for a in out]


class Services:
    def __init__(self, services: dict, tmp: Path):
        self.services, self.tmp, self.procs = services, tmp, {}

    def env(self, name: str) -> dict[str, str]:
        # Docker sets HOSTNAME; the image sets TORCHDECK_HOME (one per container here too).
        return clean_env(
            **self.services[name]["environment"],
            TORCHDECK_HOME=str(self.tmp / name),
            HOSTNAME=socket.gethostname(),
            PATH=f"{VENV_BIN}{os.pathsep}{os.environ['PATH']}",
        )

    def run(self, name: str, **kw) -> subprocess.CompletedProcess:
        return subprocess.run(
            native(self.services[name]["command"], **kw),
            cwd=ROOT,
            env=self.env(name),
            check=False,
            capture_output=True,
            text=True,
            timeout=120,
        )

    def start(self, name: str, **kw) -> subprocess.Popen:
        log = (self.tmp / f"{name}.log").open("wb")
        p = subprocess.Popen(
            native(self.services[name]["command"], **kw),
            cwd=ROOT,
            env=self.env(name),
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        self.procs[name] = p
        return p

    def healthcheck(self, name: str, port: int | None = None) -> subprocess.CompletedProcess:
        test = self.services[name]["healthcheck"]["test"]
        # `config` prints `$$` (a literal `$` in compose files); the container's shell gets `$`.
        test = [t.replace("$$", "$") for t in test]
        argv = ["sh", "-c", test[1]] if test[0] == "CMD-SHELL" else native(test[1:])
        if port is not None:
            argv = [a.replace(":8501/", f":{port}/") for a in argv]
        return subprocess.run(
            argv, cwd=ROOT, env=self.env(name), check=False, capture_output=True, text=True, timeout=60
        )

    def logs(self) -> str:
        return "\n".join(f"--- {p.name}\n{p.read_text(errors='replace')[-3000:]}" for p in self.tmp.glob("*.log"))

    def stop_all(self) -> None:
        import signal

        for p in self.procs.values():
            if p.poll() is None:
                os.killpg(p.pid, signal.SIGTERM)
        for p in self.procs.values():
            try:
                p.wait(20)
            except subprocess.TimeoutExpired:
                os.killpg(p.pid, signal.SIGKILL)
                p.wait()


@pytest.fixture
def deployment(tmp_path, postgres, redis_server, moto_s3):
    bucket = moto_s3.create_bucket()
    values = {
        "POSTGRES_PASSWORD": "unused-here",  # the compose postgres service; a native cluster stands in
        "REDIS_PASSWORD": redis_server.password,
        "TORCHDECK_DATABASE_URL": postgres.create_database(f"parity_{uuid.uuid4().hex[:8]}"),
        "TORCHDECK_BROKER_URL": redis_server.url(),
        "TORCHDECK_ARTIFACTS": f"s3://{bucket}/team",
        "TORCHDECK_S3_ENDPOINT_URL": moto_s3.endpoint_url,
        "AWS_ACCESS_KEY_ID": moto_s3.env()["AWS_ACCESS_KEY_ID"],
        "AWS_SECRET_ACCESS_KEY": moto_s3.env()["AWS_SECRET_ACCESS_KEY"],
        "TORCHDECK_MODE": "team",
        "TORCHDECK_OIDC_SERVER_METADATA_URL": "http://127.0.0.1:9/.well-known/openid-configuration",
        "TORCHDECK_OIDC_CLIENT_ID": "torchdeck",
        "TORCHDECK_OIDC_CLIENT_SECRET": "parity-client-secret",
        "TORCHDECK_OIDC_REDIRECT_URI": "https://torchdeck.example.com/oauth2callback",
        "TORCHDECK_OIDC_COOKIE_SECRET": "parity-cookie-secret",
        "TORCHDECK_ADMINS": "admin@example.com",
    }
    env_file = tmp_path / "test.env"
    env_file.write_text("".join(f"{k}={v}\n" for k, v in values.items()))
    services = Services(resolved_services(env_file), tmp_path)
    yield services, values
    services.stop_all()


def test_compose_services_run_natively_and_a_run_completes(deployment, monkeypatch):
    services, values = deployment
    s = services.services
    assert s["worker-cpu"]["environment"]["TORCHDECK_ARTIFACTS"] == values["TORCHDECK_ARTIFACTS"]

    migrated = services.run("migrate")
    assert migrated.returncode == 0, migrated.stdout + migrated.stderr
    assert "upgraded from empty to revision" in migrated.stdout

    t0 = time.monotonic()
    worker = services.start("worker-cpu")

    # The app's service, configured as the app container is; the run waits in the queue meanwhile.
    for k in list(os.environ):
        if k.startswith(("TORCHDECK_", "AWS_")):
            monkeypatch.delenv(k)
    for k, v in services.env("app").items():
        if k.startswith(("TORCHDECK_", "AWS_")):
            monkeypatch.setenv(k, v)
    from app.services.artifacts import read_artifact
    from app.services.runs import submit
    from core.config import RunSpec
    from db.engine import make_engine
    from db.repo import get_run, list_artifacts

    engine = make_engine(values["TORCHDECK_DATABASE_URL"])
    run = submit(RunSpec.from_dict(RUN), owner="alice@example.com", engine=engine)

    assert "8501" in s["app"]["command"]  # the container's port; a free one here
    port = free_port()
    app = services.start("app", container_port="8501", port=port)
    wait_http(f"http://127.0.0.1:{port}/_stcore/health", app, timeout=90, log=services.tmp / "app.log")
    app_health = services.healthcheck("app", port=port)
    assert app_health.returncode == 0, app_health.stderr
    print(f"app healthy after {time.monotonic() - t0:.1f}s")

    deadline = time.monotonic() + 150
    while (current := get_run(engine, run.id)).status not in FINAL:
        assert worker.poll() is None, services.logs()
        assert time.monotonic() < deadline, f"run still {current.status}\n{services.logs()}"
        time.sleep(0.5)
    assert current.status == "completed", f"{current.status}: {current.error}\n{services.logs()}"
    assert current.owner == "alice@example.com"
    print(f"run {current.status} after {time.monotonic() - t0:.1f}s")

    worker_health = services.healthcheck("worker-cpu")  # the compose healthcheck finds the worker by name
    assert worker_health.returncode == 0, worker_health.stdout + worker_health.stderr

    onnx = [a for a in list_artifacts(engine, run.id) if a.kind == "onnx"]
    assert len(onnx) == 1, list_artifacts(engine, run.id)
    assert onnx[0].uri.startswith(values["TORCHDECK_ARTIFACTS"] + "/")  # in the bucket, not on a host's disk
    data = read_artifact(onnx[0].id, engine=engine)
    assert len(data) == onnx[0].size
    import hashlib

    assert hashlib.sha256(data).hexdigest() == onnx[0].sha256
    import onnx as onnx_lib

    model = onnx_lib.load_model_from_string(data)
    onnx_lib.checker.check_model(model)
    stop(app)
    engine.dispose()
