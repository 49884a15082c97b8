"""Engines and transactions for SQLite (the default) and Postgres.

SQLite is used by several processes at once (the UI, one worker per GPU), so
every connection gets WAL (readers never block the writer), a long
`busy_timeout` (writers queue instead of failing) and foreign keys. Writers
start their transaction with `BEGIN IMMEDIATE`: a deferred transaction that
reads first and writes later cannot wait for the lock once another process has
committed in between, and fails at once with "database is locked" whatever the
busy timeout says. Readers use a plain `BEGIN` and never take the write lock.
"""

from __future__ import annotations

import math
import os
import sqlite3
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from sqlalchemy import Connection, Engine, create_engine, event
from sqlalchemy.engine import make_url
from sqlalchemy.orm import Session

DATABASE_URL_ENV = "TORCHDECK_DATABASE_URL"
HOME_ENV = "TORCHDECK_HOME"
DEFAULT_HOME = ".torchdeck"

# Long enough for 8 workers flushing at full speed to queue behind each other.
SQLITE_BUSY_TIMEOUT_MS = 60_000
# Execution option marking a connection whose transactions will write.
_WRITE_OPTION = "torchdeck_write"


def data_home() -> Path:
    """The data directory (`$TORCHDECK_HOME`, default `./.torchdeck`), created if missing, private to this
    user (0700: it holds the database, the sign-in secrets and the uploaded datasets)."""
    home = Path(os.environ.get(HOME_ENV) or DEFAULT_HOME).expanduser()
    home.mkdir(mode=0o700, parents=True, exist_ok=True)
    _private(home, 0o700)
    return home


def _private(path: Path, mode: int) -> None:
    """Take group and other permissions away from a file or folder of this user's (others' are left alone)."""
    st = path.stat()
    if st.st_mode & 0o077 and st.st_uid == os.getuid():
        path.chmod(mode)


def database_url() -> str:
    """`$TORCHDECK_DATABASE_URL`, or a SQLite file in the data directory."""
    url = os.environ.get(DATABASE_URL_ENV, "").strip()
    if url:
        return normalize_url(url)
    return f"sqlite:///{(data_home() / 'torchdeck.db').resolve()}"


def normalize_url(url: str) -> str:
    """Send plain `postgresql://` (and Heroku-style `postgres://`) URLs to psycopg 3."""
    for prefix in ("postgresql://", "postgres://"):
        if url.startswith(prefix):
            return "postgresql+psycopg://" + url[len(prefix) :]
    return url


def make_engine(url: str | None = None, *, echo: bool = False) -> Engine:
    """An engine for `url` (default: `database_url()`), configured for its backend."""
    sa_url = make_url(normalize_url(url or database_url()))
    if sa_url.get_backend_name() == "sqlite":
        return _sqlite_engine(sa_url, echo)
    if sa_url.get_backend_name() == "postgresql":
        # pre_ping: a long-lived UI process survives a Postgres restart.
        return create_engine(sa_url, echo=echo, pool_pre_ping=True)
    raise ValueError(
        f"unsupported database URL {sa_url.render_as_string(hide_password=True)!r}: "
        "use sqlite:///path/to/file.db or postgresql://user:password@host/dbname"
    )


def _sqlite_engine(sa_url: Any, echo: bool) -> Engine:
    if sa_url.database and sa_url.database != ":memory:":
        path = Path(sa_url.database).expanduser()
        path.parent.mkdir(parents=True, exist_ok=True)
        # Readable by this user only (SQLite gives its -wal and -shm files the same permissions).
        if not path.exists():
            os.close(os.open(path, os.O_CREAT | os.O_WRONLY, 0o600))
        _private(path, 0o600)
    engine = create_engine(sa_url, echo=echo)

    @event.listens_for(engine, "connect")
    def _on_connect(dbapi_connection: Any, _record: Any) -> None:
        # Take BEGIN away from the sqlite3 module (it would skip it for SELECTs
        # and DDL); `_on_begin` below emits the right kind.
        dbapi_connection.isolation_level = None
        cursor = dbapi_connection.cursor()
        cursor.execute("PRAGMA journal_mode=WAL")
        cursor.execute(f"PRAGMA busy_timeout={SQLITE_BUSY_TIMEOUT_MS}")
        cursor.execute("PRAGMA foreign_keys=ON")
        # Durable across application crashes; only an OS crash can lose the last commits.
        cursor.execute("PRAGMA synchronous=NORMAL")
        try:  # (SQLite has power() when built with its math functions, as Debian's and Python's builds are)
            cursor.execute("SELECT power(2, 1)")
        except sqlite3.OperationalError:  # db/queue_order.py weighs GPU time with it
            dbapi_connection.create_function("power", 2, math.pow, deterministic=True)
        cursor.close()

    @event.listens_for(engine, "begin")
    def _on_begin(conn: Connection) -> None:
        write = conn.get_execution_options().get(_WRITE_OPTION, False)
        conn.exec_driver_sql("BEGIN IMMEDIATE" if write else "BEGIN")

    return engine


def writer(engine: Engine) -> Engine:
    """The same engine (same pool), whose transactions announce they will write."""
    return engine.execution_options(**{_WRITE_OPTION: True})


@contextmanager
def connection_scope(engine: Engine, *, write: bool = False) -> Iterator[Connection]:
    """A Core connection inside one transaction: committed on success, rolled back on error."""
    with (writer(engine) if write else engine).begin() as conn:
        yield conn


@contextmanager
def session_scope(engine: Engine, *, write: bool = True) -> Iterator[Session]:
    """One ORM session and transaction: commit on success, rollback on error, always close.

    Pass `write=False` for read-only work so that SQLite readers do not queue
    behind writers.
    """
    session = Session(bind=writer(engine) if write else engine, expire_on_commit=False)
    try:
        yield session
        session.commit()
    except BaseException:
        session.rollback()
        raise
    finally:
        session.close()
