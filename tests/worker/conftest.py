"""A real execution stack per test: a real Redis server, real Celery worker processes, and a
database on SQLite (a file) and on Postgres (a throwaway cluster) — every stack test runs on both."""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest
import redis

from db.engine import make_engine
from db.migrate import upgrade
from db.repo import get_run
from tests._servers import free_port

ROOT = Path(__file__).resolve().parents[2]
FINAL = ("completed", "early_stopped", "cancelled", "failed", "diverged", "pruned")

# Small, quick, deterministic runs: ~100 optimizer steps per epoch on 8×8 images.
RUN = {
    "name": "worker-test",
    "data": {"name": "synthetic", "num_classes": 3, "num_samples": 4000, "size": 8, "channels": 1},
    "model": {"name": "simple_cnn", "hidden": 16},
    "train": {"epochs": 3, "batch_size": 32, "log_every": 1, "diag_every": 25, "early_stopping": {"enabled": False}},
    "export": {"formats": []},
    "device": "cpu",
    "seed": 0,
}


def wait_for(condition, timeout: float, what: str, every: float = 0.1):
    """Poll until condition() is truthy (returns it); fail with `what` after `timeout` seconds. Bounds are
    generous on purpose: a test waits for a state, never for a duration."""
    deadline = time.monotonic() + timeout
    while True:
        value = condition()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"{what} (waited {timeout:.0f} s)")
        time.sleep(every)


def pg_ctl(pg, *args: str) -> None:
    """Stop or start a test Postgres cluster in place (its data kept): a database outage."""
    cmd = [*pg._as_user, str(pg.bin_dir / "pg_ctl"), args[0], "-D", str(pg.root / "data"), "-w", *args[1:]]
    subprocess.run(cmd, check=True, capture_output=True, timeout=60)


@dataclass
class RedisServer:
    port: int
    root: Path
    proc: subprocess.Popen | None = None

    def start(self) -> None:
        exe = shutil.which("redis-server")
        if exe is None:
            pytest.fail(
                "redis-server is not installed (make test installs it: apt-get install redis-server)", pytrace=False
            )
        self.proc = subprocess.Popen(
            [
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
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        import redis

        deadline = time.monotonic() + 60  # a bound, not a wait: a busy machine (xdist workers) starts it later
        while self.proc.poll() is None and time.monotonic() < deadline:
            try:
                redis.Redis(port=self.port).ping()
                return
            except redis.ConnectionError:
                time.sleep(0.05)
        raise RuntimeError(f"redis-server on port {self.port} did not start (exit {self.proc.poll()})")

    def stop(self) -> None:
        if self.proc and self.proc.poll() is None:
            self.proc.terminate()
            self.proc.wait(10)

    def url(self, db: int = 0) -> str:
        return f"redis://127.0.0.1:{self.port}/{db}"


@pytest.fixture(scope="session")
def redis_server() -> Iterator[RedisServer]:
    server = RedisServer(free_port(), Path(tempfile.mkdtemp(prefix="torchdeck-redis-")))
    server.start()
    yield server
    server.stop()
    shutil.rmtree(server.root, ignore_errors=True)


@pytest.fixture
def reaper(tmp_path, redis_server, monkeypatch):
    """A migrated SQLite database and the reaper's Celery app on a flushed real Redis: (engine, app, redis)."""
    from worker import reaper as worker_reaper
    from worker.celery_app import make_app
    from worker.settings import WorkerSettings

    url = f"sqlite:///{tmp_path / 'db.sqlite'}"
    upgrade(url)
    engine = make_engine(url)
    broker = redis_server.url(0)  # the stacks use 1-14, the jobs tests 15
    redis.Redis.from_url(broker).flushdb()
    app = make_app(WorkerSettings(broker_url=broker))
    monkeypatch.setattr(worker_reaper, "app", app)
    yield engine, app, redis.Redis.from_url(broker)
    engine.dispose()


@dataclass
class Stack:
    env: dict[str, str]
    url: str
    home: Path
    workers: dict[str, subprocess.Popen] = field(default_factory=dict)
    log_starts: dict[int, int] = field(default_factory=dict)  # worker pid: where its lines begin in its log

    @property
    def engine(self):
        return make_engine(self.url)

    def start_worker(self, name: str, node: str | None = None, **extra_env: str) -> subprocess.Popen:
        """A worker process; `node` (default: `name`) is its Celery node name, which two workers may share."""
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
            "gpu,cpu",
            "-n",
            f"{node or name}@%h",
            "--without-gossip",
            "--without-mingle",
            "-l",
            "INFO",
        ]
        log = open(self.home / f"{name}.log", "ab")  # noqa: SIM115 - kept open for the worker's life
        p = subprocess.Popen(
            cmd, cwd=ROOT, env={**self.env, **extra_env}, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
        )
        self.workers[name] = p
        self.log_starts[p.pid] = log.tell()  # (a log is appended to: a worker started again under a name has more)
        return p

    def ready(self, worker: subprocess.Popen) -> bool:
        """Whether the worker has logged Celery's `<node> ready.`: its startup, which starts its fork server and
        waits for that server's imports (worker.preload) and for the first spare it forks, is over. Its log is
        `<name>.log` (a worker started by a test itself, as `workers[name]`: its whole log)."""
        name = next(n for n, p in self.workers.items() if p is worker)
        with open(self.home / f"{name}.log", "rb") as f:
            f.seek(self.log_starts.get(worker.pid, 0))
            return re.search(rb"@\S+ ready\.$", f.read(), re.MULTILINE) is not None

    def kill_worker(self, name: str) -> None:
        """kill -9 of the worker and of the run's child (one process group)."""
        p = self.workers.pop(name)
        os.killpg(p.pid, signal.SIGKILL)
        p.wait()

    def stop_all(self) -> None:
        for p in self.workers.values():
            if p.poll() is None:
                os.killpg(p.pid, signal.SIGTERM)
        for p in self.workers.values():
            try:
                p.wait(15)
            except subprocess.TimeoutExpired:
                os.killpg(p.pid, signal.SIGKILL)
        self.workers.clear()

    def submit(self, *overrides: str, name: str | None = None) -> str:
        from app.services.runs import submit
        from core.config import RunSpec

        return submit(RunSpec.from_dict(RUN, list(overrides)), name=name, engine=self.engine).id

    def wait(self, run_id: str, timeout: float = 180, until: tuple[str, ...] = FINAL):
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            run = get_run(self.engine, run_id)
            if run.status in until:
                return run
            time.sleep(0.3)
        raise AssertionError(
            f"run {run_id} still {get_run(self.engine, run_id).status} after {timeout}s\n{self.logs()}"
        )

    def logs(self) -> str:
        return "\n".join(f"--- {p.name}\n{p.read_text()[-3000:]}" for p in self.home.glob("*.log"))

    def run_process(self, worker: subprocess.Popen, timeout: float = 120):
        """The worker's run process: the process of its current run (the older one: the next run's spare
        is started as a run starts), or its ready spare when it has no run. Run processes are forked by the
        worker's fork server (worker.tasks.start_context), or spawned by the worker (TORCHDECK_RUN_START=spawn).

        Only once the worker is ready: while its fork server imports torch it runs programs of its own (ctypes'
        `ldconfig -p`), children of the server too, which a busy machine keeps alive long enough to be found; one
        taken for a run process and stopped (SIGSTOP) would hang the server's imports and the worker's startup with
        them. A process the server forks keeps the server's command line; a program it runs has its own."""
        import psutil

        def find():
            if not self.ready(worker):
                return None
            try:
                kids = psutil.Process(worker.pid).children()
            except psutil.NoSuchProcess:
                return None
            runs = [k for k in kids if _live(k, "spawn_main")]
            for server in (k for k in kids if _live(k, "multiprocessing.forkserver")):
                try:
                    runs += [g for g in server.children() if _live(g, "multiprocessing.forkserver")]
                except psutil.NoSuchProcess:
                    continue
            return min(runs, key=lambda k: k.create_time()) if runs else None

        return wait_for(find, timeout, f"worker {worker.pid} has no run process\n{self.logs()}")

    def run_dir(self, run_id: str) -> Path:
        return self.home / "artifacts" / "runs" / run_id


def _live_spawned(proc) -> bool:
    """A spawned child that is still alive (a run's other ranks, spawned by its process)."""
    return _live(proc, "spawn_main")


def _live(proc, marker: str) -> bool:
    """A child that is still alive and whose command line has `marker`: one that ends (or turns zombie) while
    being read is not."""
    import psutil

    try:
        return proc.status() != psutil.STATUS_ZOMBIE and marker in " ".join(proc.cmdline())
    except (psutil.NoSuchProcess, psutil.ZombieProcess, psutil.AccessDenied):
        return False


@pytest.fixture(params=("sqlite", "postgres"))
def stack(request, tmp_path, redis_server, postgres, monkeypatch) -> Iterator[Stack]:
    home = tmp_path / "home"
    home.mkdir()
    if request.param == "sqlite":
        url = f"sqlite:///{home / 'torchdeck.db'}"
    else:
        url = postgres.create_database(f"w_{uuid.uuid4().hex[:10]}")
    upgrade(url)
    import redis

    db_index = 1 + (abs(hash(request.node.nodeid)) % 14)
    redis.Redis(port=redis_server.port, db=db_index).flushdb()
    env = {
        **os.environ,
        "TORCHDECK_HOME": str(home),
        "TORCHDECK_DATABASE_URL": url,
        "TORCHDECK_BROKER_URL": redis_server.url(db_index),
        "TORCHDECK_STALE_AFTER_S": "12",
        "TORCHDECK_REAP_EVERY_S": "1",
        "TORCHDECK_REQUEUE_AFTER_S": "20",
        "TORCHDECK_HEARTBEAT_S": "1",
        "TORCHDECK_CANCEL_GRACE_S": "5",
        "OMP_NUM_THREADS": "1",
        "CUDA_VISIBLE_DEVICES": "",
    }
    for k in ("TORCHDECK_HOME", "TORCHDECK_DATABASE_URL", "TORCHDECK_BROKER_URL"):
        monkeypatch.setenv(k, env[k])
    s = Stack(env=env, url=url, home=home)
    yield s
    s.stop_all()
