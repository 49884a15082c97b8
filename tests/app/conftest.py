"""Dashboard tests: every page rendered by Streamlit's AppTest against a real SQLite database in
tmp_path (migrated with Alembic like a user's), runs seeded through db.repo, and a real Redis
(redis-server on a free port) wherever a run is enqueued."""

from __future__ import annotations

import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from sqlalchemy import Engine

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from streamlit.testing.v1 import AppTest

from db.engine import make_engine
from db.migrate import upgrade
from tests._servers import start_redis

MAIN = ROOT / "app" / "main.py"


@pytest.fixture(scope="session")
def redis_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A real Redis server for the whole session; each test that uses it gets an empty db 0."""
    proc, port = start_redis(tmp_path_factory.mktemp("redis"))
    yield f"redis://127.0.0.1:{port}/0"
    proc.terminate()
    proc.wait(10)


@pytest.fixture
def broker(redis_url: str, monkeypatch: pytest.MonkeyPatch):
    """TORCHDECK_BROKER_URL pointing at the test Redis, emptied; returns a client to inspect queues."""
    import redis

    monkeypatch.setenv("TORCHDECK_BROKER_URL", redis_url)
    client = redis.Redis.from_url(redis_url)
    client.flushdb()
    return client


@pytest.fixture
def home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("TORCHDECK_HOME", str(tmp_path))
    monkeypatch.setenv("TORCHDECK_DATABASE_URL", f"sqlite:///{tmp_path / 'torchdeck.db'}")
    monkeypatch.delenv("TORCHDECK_ARTIFACTS", raising=False)
    monkeypatch.setenv("TORCHDECK_BROKER_URL", "redis://127.0.0.1:1/0")  # unreachable unless `broker` is used
    upgrade()
    return tmp_path


@pytest.fixture
def engine(home: Path) -> Iterator[Engine]:
    e = make_engine()
    yield e
    e.dispose()


@pytest.fixture
def page(home: Path) -> Callable[..., AppTest]:
    """page("runs.py", id="abc") → an AppTest showing that page, already run."""

    def open_page(name: str, timeout: float = 60, **query: str) -> AppTest:
        at = AppTest.from_file(str(MAIN), default_timeout=timeout)
        at.run()
        at.switch_page(f"app_pages/{name}")
        for k, v in query.items():
            at.query_params[k] = v
        return at.run()

    return open_page


@pytest.fixture
def jobs_worker(home: Path, broker) -> Iterator[subprocess.Popen]:
    """A real jobs worker (what `torchdeck up` starts beside the run worker) on the test Redis, with this
    test's database and artifact folder: the pages' pre-flight and Export now are asked of it by task name."""
    import os

    from db.repo import list_workers

    env = {**os.environ, "CUDA_VISIBLE_DEVICES": "", "OMP_NUM_THREADS": "1"}
    log = open(home / "jobs-worker.log", "ab")  # noqa: SIM115 - kept open for the worker's life
    cmd = [
        sys.executable,
        "-m",
        "celery",
        "-A",
        "worker.celery_app",
        "worker",
        "-P",
        "solo",
        "-c",
        "1",
        "-Q",
        "jobs",
        "-n",
        "jobs@%h",
        "--without-gossip",
        "--without-mingle",
        "-l",
        "INFO",
    ]
    proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT)
    engine = make_engine()
    deadline = time.monotonic() + 120
    while not list_workers(engine):
        assert proc.poll() is None and time.monotonic() < deadline, (home / "jobs-worker.log").read_text()[-3000:]
        time.sleep(0.2)
    engine.dispose()
    yield proc
    proc.terminate()
    try:
        proc.wait(30)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
    log.close()
