"""Schema migrations (Alembic, shipped inside the package) and the start-up check.

The app and the workers call `check_schema()` before anything else and refuse
to start on an out-of-date database; `torchdeck db upgrade` calls `upgrade()`.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from alembic import command
from alembic.config import Config
from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory
from sqlalchemy import Connection, Engine, text

from db.engine import make_engine, writer
from db.errors import SchemaOutOfDate

MIGRATIONS_DIR = Path(__file__).resolve().parent / "migrations"
# Postgres advisory lock held while migrating: app and workers may all start at once.
_PG_MIGRATION_LOCK = "SELECT pg_advisory_xact_lock(29797, 0)"  # appends use 29796

Target = Engine | str | None  # an engine, a database URL, or None for database_url()


def alembic_config() -> Config:
    config = Config()
    config.set_main_option("script_location", str(MIGRATIONS_DIR))
    return config


def head_revision() -> str:
    """The revision this code needs."""
    head = ScriptDirectory.from_config(alembic_config()).get_current_head()
    assert head is not None, "db/migrations/versions holds no migration"
    return head


@contextmanager
def _engine(target: Target) -> Iterator[Engine]:
    if isinstance(target, Engine):
        yield target
        return
    engine = make_engine(target)
    try:
        yield engine
    finally:
        engine.dispose()


def current_revision(target: Target = None) -> str | None:
    """The database's revision; None for a database without torchdeck tables."""
    with _engine(target) as engine, engine.connect() as conn:
        return MigrationContext.configure(conn).get_current_revision()


def check_schema(target: Target = None) -> None:
    """Raise SchemaOutOfDate (whose message says to run `torchdeck db upgrade`)
    unless the database is at the revision this code needs."""
    head = head_revision()
    with _engine(target) as engine:
        current = current_revision(engine)
        if current != head:
            url = engine.url.render_as_string(hide_password=True)
            raise SchemaOutOfDate(current, head, url, newer=current is not None and not _known(current))


def _known(revision: str) -> bool:
    try:
        return ScriptDirectory.from_config(alembic_config()).get_revision(revision) is not None
    except Exception:  # alembic raises several kinds for an unknown id
        return False


def upgrade(target: Target = None, revision: str = "head") -> str:
    """Migrate the database to `revision` (default: the newest); returns the revision reached."""
    _run(target, lambda config: command.upgrade(config, revision))
    with _engine(target) as engine:
        reached = current_revision(engine)
    assert reached is not None
    return reached


def downgrade(target: Target, revision: str) -> str | None:
    """Migrate the database back to `revision` ("base": no tables); returns the revision reached."""
    _run(target, lambda config: command.downgrade(config, revision))
    return current_revision(target)


def _run(target: Target, step: object) -> None:
    """Run an Alembic command in one transaction (Postgres and SQLite both have
    transactional DDL: a failed migration leaves the schema as it was)."""
    config = alembic_config()
    with _engine(target) as engine, writer(engine).connect() as conn:
        with _sqlite_foreign_keys_off(conn):
            with conn.begin():
                if conn.dialect.name == "postgresql":
                    conn.execute(text(_PG_MIGRATION_LOCK))
                config.attributes["connection"] = conn
                step(config)  # type: ignore[operator]


@contextmanager
def _sqlite_foreign_keys_off(conn: Connection) -> Iterator[None]:
    """SQLite's batch migrations copy a table, drop it and rename the copy; with
    foreign keys on, dropping the `run` table would cascade-delete every metric.
    The pragma only works outside a transaction, hence the raw connection."""
    if conn.dialect.name != "sqlite":
        yield
        return
    raw = conn.connection.dbapi_connection
    assert raw is not None
    raw.execute("PRAGMA foreign_keys=OFF")
    try:
        yield
        broken = raw.execute("PRAGMA foreign_key_check").fetchall()
        if broken:
            raise RuntimeError(f"migration left rows with broken references: {broken[:5]}")
    finally:
        raw.execute("PRAGMA foreign_keys=ON")
