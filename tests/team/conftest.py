"""Team-mode tests: real servers (redis-server, Postgres, nginx, an S3 endpoint from moto's server)
and the deployment files at the repository root."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests._servers import free_port
from tests.store.conftest import moto_s3  # noqa: F401 - the S3 endpoint (moto's server) of the store tests

ROOT = Path(__file__).resolve().parents[2]
VENV_BIN = Path(sys.executable).parent


@dataclass
class Redis:
    port: int
    root: Path
    password: str | None = None
    proc: subprocess.Popen | None = None

    def start(self) -> None:
        exe = shutil.which("redis-server")
        if exe is None:
            pytest.fail(
                "redis-server is not installed (make test installs it: apt-get install redis-server)", pytrace=False
            )
        cmd = [
            exe,
            "--port",
            str(self.port),
            "--bind",
            "127.0.0.1",
            "--save",
            "",
            "--appendonly",
            "no",
            "--dir",
            str(self.root),
        ]
        if self.password:
            cmd += ["--requirepass", self.password]
        self.proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        import redis

        client = redis.Redis(port=self.port, password=self.password)
        deadline = time.monotonic() + 60
        while self.proc.poll() is None and time.monotonic() < deadline:
            try:
                client.ping()
                return
            except redis.ConnectionError:
                time.sleep(0.05)
        raise RuntimeError(f"redis-server did not start within 60 s (exit {self.proc.poll()})")

    def stop(self) -> None:
        if self.proc and self.proc.poll() is None:
            self.proc.terminate()
            self.proc.wait(10)

    def url(self, db: int = 0) -> str:
        auth = f":{self.password}@" if self.password else ""
        return f"redis://{auth}127.0.0.1:{self.port}/{db}"


@pytest.fixture
def redis_server() -> Iterator[Redis]:
    """A redis-server of this test alone (tests stop it), with a password as in docker-compose.yml."""
    server = Redis(free_port(), Path(tempfile.mkdtemp(prefix="torchdeck-redis-")), password="test-redis-pw")
    server.start()
    yield server
    server.stop()
    shutil.rmtree(server.root, ignore_errors=True)


def clean_env(**extra: str) -> dict[str, str]:
    """The parent's environment minus every torchdeck/AWS setting, plus `extra`: a subprocess sees
    exactly the configuration a test gives it."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("TORCHDECK_", "AWS_", "POSTGRES_", "REDIS_", "PG"))}
    env.update({"OMP_NUM_THREADS": "1", "CUDA_VISIBLE_DEVICES": ""})
    env.update(extra)
    return env


def wait_http(url: str, proc: subprocess.Popen | None = None, timeout: float = 60, log: Path | None = None) -> str:
    """GET url until it answers 200 (the body is returned); fails early when `proc` exits."""
    import urllib.request

    deadline = time.monotonic() + timeout
    last: Exception | None = None
    while time.monotonic() < deadline:
        if proc is not None and proc.poll() is not None:
            break
        try:
            with urllib.request.urlopen(url, timeout=5) as r:
                return r.read().decode()
        except OSError as e:
            last = e
            time.sleep(0.3)
    tail = log.read_text()[-3000:] if log and log.exists() else ""
    raise AssertionError(
        f"{url} did not answer within {timeout}s ({last}; exit {proc.poll() if proc else '-'})\n{tail}"
    )


def stop(proc: subprocess.Popen, grace: float = 10) -> None:
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(grace)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
