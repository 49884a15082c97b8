"""Alembic environment: runs migrations on the connection db.migrate hands over,
or on `sqlalchemy.url` / TORCHDECK_DATABASE_URL when run by the `alembic` command."""

from __future__ import annotations

from alembic import context
from sqlalchemy import Connection

from db.engine import make_engine, writer
from db.models import Base

config = context.config
target_metadata = Base.metadata


def run_on(connection: Connection) -> None:
    context.configure(
        connection=connection,
        target_metadata=target_metadata,
        # SQLite cannot ALTER most things: batch mode copies the table instead.
        render_as_batch=connection.dialect.name == "sqlite",
        compare_type=True,
    )
    with context.begin_transaction():
        context.run_migrations()


def run_online() -> None:
    connection = config.attributes.get("connection")
    if connection is not None:
        run_on(connection)
        return
    engine = make_engine(config.get_main_option("sqlalchemy.url") or None)
    try:
        with writer(engine).connect() as conn:
            run_on(conn)
            conn.commit()
    finally:
        engine.dispose()


if context.is_offline_mode():
    raise SystemExit("torchdeck migrations run against a live database (no --sql mode)")
run_online()
