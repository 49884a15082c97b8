"""Real servers for tests and benchmarks: a throwaway PostgreSQL cluster.

    with postgres_server() as pg:
        url = pg.create_database("t1")    # postgresql+psycopg://...

The cluster lives in a fresh temporary directory (data, unix socket, log), on
a free TCP port of 127.0.0.1, with trust authentication for the `postgres`
user; stopping it removes everything. Run as root, the server programs run as
the `postgres` system user (PostgreSQL refuses to run as root).

Missing PostgreSQL programs are an error, never a skip: CI installs them
(`apt-get install postgresql`), and a test suite that silently skips its
Postgres half proves nothing about Postgres.
"""

from __future__ import annotations

import atexit
import glob
import os
import pwd
import random
import shutil
import signal
import socket
import subprocess
import tempfile
import time
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path

PG_BIN_ENV = "TORCHDECK_PG_BIN"  # a folder holding initdb, pg_ctl, postgres
START_TIMEOUT_S = 120  # a bound, never a wait: a busy machine (pytest-xdist's workers) starts servers slower


class PostgresUnavailable(RuntimeError):
    pass


def find_pg_bin() -> Path:
    """The folder of the PostgreSQL server programs, or PostgresUnavailable saying how to get them."""
    candidates = [os.environ.get(PG_BIN_ENV, "")]
    candidates += sorted(glob.glob("/usr/lib/postgresql/*/bin"), key=_version, reverse=True)
    on_path = shutil.which("pg_ctl")
    candidates.append(str(Path(on_path).parent) if on_path else "")
    for folder in filter(None, candidates):
        if all((Path(folder) / tool).exists() for tool in ("initdb", "pg_ctl", "postgres")):
            return Path(folder)
    raise PostgresUnavailable(
        "PostgreSQL server programs (initdb, pg_ctl, postgres) not found in "
        f"${PG_BIN_ENV}, /usr/lib/postgresql/*/bin or PATH. Install them "
        "(Debian/Ubuntu: apt-get install postgresql) or set "
        f"{PG_BIN_ENV} to their folder."
    )


def _version(folder: str) -> int:
    try:
        return int(Path(folder).parent.name)
    except ValueError:
        return 0


_LOWEST_PORT = 10_000  # below it: the well-known ports of services a developer may run (5432, 6379, 8501...)
_handed_out: set[int] = set()


def worker_index() -> tuple[int, int]:
    """(this pytest-xdist worker's number, how many workers): (0, 1) without xdist."""
    name = os.environ.get("PYTEST_XDIST_WORKER", "")  # gw0, gw1, ...
    count = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1") or 1)
    index = int(name[2:]) if name.startswith("gw") and name[2:].isdigit() else 0
    return index, max(count, index + 1)


def _ephemeral_low() -> int:
    try:
        return int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768


def free_port() -> int:
    """A TCP port of 127.0.0.1 that nothing listens on, for a server a test is about to start.

    Never one the kernel hands out as the source port of an outgoing connection (below its ephemeral range:
    a connection made meanwhile cannot take it), and with pytest-xdist, from a slice of that range of this
    worker's own (two workers never pick the same port), at a random place in it (nor do two test sessions on one
    machine walk the same ports); never the same port twice in a process. Where the ephemeral range leaves too
    few ports below it, the kernel picks one, as before."""
    index, count = worker_index()
    low = _ephemeral_low()
    size = (low - _LOWEST_PORT) // count
    if size >= 200:
        start = _LOWEST_PORT + index * size
        offset = random.randrange(size)
        for i in range(size):
            port = start + (offset + i) % size
            if port not in _handed_out and _bindable(port):
                _handed_out.add(port)
                return port
    while True:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        if port not in _handed_out:
            _handed_out.add(port)
            return port


def _bindable(port: int) -> bool:
    with socket.socket() as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


@dataclass
class PostgresServer:
    bin_dir: Path
    root: Path  # everything of this cluster lives here
    port: int
    user: str = "postgres"
    _as_user: list[str] = field(default_factory=list)

    @property
    def socket_dir(self) -> Path:
        return self.root / "socket"

    def url(self, database: str = "postgres") -> str:
        """SQLAlchemy URL (psycopg 3) over the unix socket: no TCP overhead."""
        return f"postgresql+psycopg://{self.user}@/{database}?host={self.socket_dir}&port={self.port}"

    def tcp_url(self, database: str = "postgres") -> str:
        return f"postgresql+psycopg://{self.user}@127.0.0.1:{self.port}/{database}"

    def execute(self, sql: str, database: str = "postgres") -> None:
        """Run one statement outside a transaction (CREATE/DROP DATABASE need that)."""
        import psycopg

        with psycopg.connect(
            host=str(self.socket_dir), port=self.port, user=self.user, dbname=database, autocommit=True
        ) as conn:
            conn.execute(sql)  # type: ignore[arg-type]

    def create_database(self, name: str) -> str:
        # FILE_COPY (Postgres 15+): with fsync off, 5x faster than the default
        # for the small databases tests make.
        strategy = " STRATEGY FILE_COPY" if self.major_version >= 15 else ""
        self.execute(f'CREATE DATABASE "{name}"{strategy}')
        return self.url(name)

    @cached_property
    def major_version(self) -> int:
        done = subprocess.run([str(self.bin_dir / "postgres"), "--version"], capture_output=True, text=True, check=True)
        return int(done.stdout.split()[-1].split(".")[0])

    def drop_database(self, name: str) -> None:
        self.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')

    def stop(self) -> None:
        subprocess.run(
            [
                *self._as_user,
                str(self.bin_dir / "pg_ctl"),
                "stop",
                "-D",
                str(self.root / "data"),
                "-m",
                "immediate",
                "-w",
            ],
            capture_output=True,
            timeout=START_TIMEOUT_S,
        )
        shutil.rmtree(self.root, ignore_errors=True)


def start_postgres(*, durable: bool = False) -> PostgresServer:
    """Start a new cluster. `durable=False` (tests) turns fsync off: a crash
    loses the throwaway data, and tests run several times faster."""
    bin_dir = find_pg_bin()
    # Not under pytest's tmp_path: its parents are private to root, and the
    # server runs as `postgres`.
    root = Path(tempfile.mkdtemp(prefix="torchdeck-pg-"))
    as_user = _drop_root(root)
    (root / "socket").mkdir()
    _chown(root / "socket")
    server = PostgresServer(bin_dir=bin_dir, root=root, port=free_port(), _as_user=as_user)
    try:
        _run(
            [
                *as_user,
                str(bin_dir / "initdb"),
                "-D",
                str(root / "data"),
                "-U",
                "postgres",
                "--auth=trust",
                "--encoding=UTF8",
                "--no-sync",
            ],
            "initdb",
        )
        for attempt in range(3):
            options = f"-p {server.port} -k {server.socket_dir} -c listen_addresses=127.0.0.1"
            if not durable:
                options += " -c fsync=off -c synchronous_commit=off -c full_page_writes=off"
            try:
                _run(
                    [
                        *as_user,
                        str(bin_dir / "pg_ctl"),
                        "start",
                        "-D",
                        str(root / "data"),
                        "-w",
                        "-t",
                        str(START_TIMEOUT_S),
                        "-l",
                        str(root / "server.log"),
                        "-o",
                        options,
                    ],
                    "pg_ctl start",
                    root / "server.log",
                )
                break
            except PostgresUnavailable as e:
                # Its port taken meanwhile by another program of this machine: another port.
                if attempt == 2 or "could not bind" not in str(e):
                    raise
                server.port = free_port()
    except BaseException:
        server.stop()
        raise
    # Stop it even when the caller never gets to (an error between start and
    # its `finally`); stopping twice is harmless.
    atexit.register(server.stop)
    return server


def _drop_root(root: Path) -> list[str]:
    if os.geteuid() != 0:
        return []
    _chown(root)
    return ["runuser", "-u", "postgres", "--"]


def _chown(path: Path) -> None:
    if os.geteuid() != 0:
        return
    try:
        entry = pwd.getpwnam("postgres")
    except KeyError:
        raise PostgresUnavailable(
            "running as root, the server needs a `postgres` system user "
            "(created by apt-get install postgresql; or: useradd --system postgres)"
        ) from None
    os.chown(path, entry.pw_uid, entry.pw_gid)


def _run(command: list[str], what: str, log: Path | None = None) -> None:
    done = subprocess.run(command, capture_output=True, text=True, timeout=START_TIMEOUT_S + 60)
    if done.returncode != 0:
        detail = done.stderr or done.stdout
        if log is not None and log.exists():
            detail += "\n--- server log ---\n" + log.read_text()[-4000:]
        raise PostgresUnavailable(f"{what} failed ({done.returncode}): {detail}")


@contextmanager
def postgres_server(*, durable: bool = False) -> Iterator[PostgresServer]:
    server = start_postgres(durable=durable)
    try:
        yield server
    finally:
        server.stop()


def start_redis(folder: Path, *, password: str | None = None, timeout_s: float = 60) -> tuple[subprocess.Popen, int]:
    """A real redis-server on a free port of 127.0.0.1 (nothing persisted), once it answers PING. Should another
    program take the port between its choice and the server's start (the server then exits), another port."""
    import time

    import redis

    exe = shutil.which("redis-server")
    assert exe, "redis-server not found on PATH (apt-get install redis-server)"
    auth = ["--requirepass", password] if password else []
    for _ in range(3):
        port = free_port()
        proc = subprocess.Popen(
            [
                exe,
                "--port",
                str(port),
                "--bind",
                "127.0.0.1",
                *auth,
                "--dir",
                str(folder),
                "--save",
                "",
                "--appendonly",
                "no",
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        client = redis.Redis(port=port, password=password)
        deadline = time.monotonic() + timeout_s
        while proc.poll() is None:
            try:
                client.ping()
                return proc, port
            except redis.ConnectionError:
                if time.monotonic() > deadline:
                    proc.kill()
                    proc.wait()
                    raise AssertionError(f"redis-server did not answer within {timeout_s:.0f} s") from None
                time.sleep(0.05)
        proc.wait()
    raise AssertionError(f"redis-server exited at start three times (last: {proc.returncode}): no free port?")


def stop_group(proc: subprocess.Popen, timeout_s: float = 30) -> None:
    """Stop a process started with start_new_session=True, and its children: TERM, then KILL."""
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


def wait_http(url: str, timeout_s: float, proc: subprocess.Popen, log: Path) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(
                f"{' '.join(map(str, proc.args[:4]))} exited with {proc.returncode}:\n{log.read_text()[-4000:]}"
            )
        try:
            with urllib.request.urlopen(url, timeout=2) as r:
                if r.status == 200:
                    return
        except OSError:
            time.sleep(0.5)
    raise RuntimeError(f"{url} did not answer within {timeout_s:.0f} s:\n{log.read_text()[-4000:]}")
