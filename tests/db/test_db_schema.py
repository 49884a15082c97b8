"""Schema, migrations and engines: what an operator sees when starting torchdeck."""

from __future__ import annotations

import pytest
from alembic.autogenerate import compare_metadata
from alembic.runtime.migration import MigrationContext
from sqlalchemy import Engine, inspect, text
from sqlalchemy.engine import make_url
from typer.testing import CliRunner

from app.cli.db import db_app
from db import repo
from db.engine import make_engine, normalize_url
from db.errors import SchemaOutOfDate
from db.migrate import check_schema, current_revision, downgrade, head_revision, upgrade
from db.models import Base

TABLES = {
    "run",
    "run_tag",
    "metric",
    "metric_rollup",
    "event",
    "artifact",
    "worker",
    "dataset",
    "account",
    "sweep",
    "sweep_trial",
    "sweep_decision",
    "follow",
    "evaluation",
    "alert_rule",
    "alert_firing",
}


def test_upgrade_creates_every_table_at_head(database_url: str) -> None:
    assert current_revision(database_url) is None
    assert upgrade(database_url) == head_revision()
    engine = make_engine(database_url)
    try:
        assert TABLES <= set(inspect(engine).get_table_names())
        check_schema(engine)  # does not raise
    finally:
        engine.dispose()


def test_models_and_migrations_do_not_drift(engine: Engine) -> None:
    with engine.connect() as conn:
        context = MigrationContext.configure(conn, opts={"compare_type": True})
        assert compare_metadata(context, Base.metadata) == []


def test_an_empty_database_is_refused_with_the_command_to_run(database_url: str) -> None:
    with pytest.raises(SchemaOutOfDate) as caught:
        check_schema(database_url)
    assert "torchdeck db upgrade" in str(caught.value)
    assert "empty" in str(caught.value)


def test_an_older_schema_is_refused_and_upgrade_fixes_it(database_url: str) -> None:
    upgrade(database_url)
    assert downgrade(database_url, "base") is None
    with pytest.raises(SchemaOutOfDate, match="torchdeck db upgrade"):
        check_schema(database_url)
    upgrade(database_url)
    check_schema(database_url)


def test_upgrade_twice_keeps_the_data(engine: Engine) -> None:
    run = repo.create_run(engine, {"lr": 0.1})
    assert upgrade(engine) == head_revision()
    assert repo.get_run(engine, run.id).spec == {"lr": 0.1}


def test_the_environment_chooses_the_database(database_url: str, monkeypatch: pytest.MonkeyPatch, tmp_path) -> None:
    # Plain postgresql:// URLs (as users write them) go to psycopg 3.
    plain = database_url.replace("postgresql+psycopg://", "postgresql://")
    monkeypatch.setenv("TORCHDECK_DATABASE_URL", plain)
    assert upgrade() == head_revision()
    assert current_revision(database_url) == head_revision()
    engine = make_engine()
    try:
        assert engine.url == make_url(normalize_url(plain))
        if engine.dialect.name == "postgresql":
            assert engine.dialect.driver == "psycopg"
    finally:
        engine.dispose()


def test_without_a_url_the_database_is_a_file_in_torchdeck_home(
    database_url: str, monkeypatch: pytest.MonkeyPatch, tmp_path
) -> None:
    monkeypatch.delenv("TORCHDECK_DATABASE_URL", raising=False)
    monkeypatch.setenv("TORCHDECK_HOME", str(tmp_path / "home"))
    engine = make_engine()
    try:
        assert engine.url.database == str((tmp_path / "home" / "torchdeck.db").resolve())
        assert (tmp_path / "home").is_dir()
    finally:
        engine.dispose()


def test_connections_are_configured_for_their_backend(engine: Engine) -> None:
    with engine.connect() as conn:
        if engine.dialect.name == "sqlite":
            assert conn.execute(text("PRAGMA journal_mode")).scalar() == "wal"
            assert conn.execute(text("PRAGMA foreign_keys")).scalar() == 1
            assert conn.execute(text("PRAGMA synchronous")).scalar() == 1  # NORMAL
            assert conn.execute(text("PRAGMA busy_timeout")).scalar() >= 10_000
        else:
            assert engine.dialect.driver == "psycopg"
            assert conn.execute(text("SELECT 1")).scalar() == 1


def test_a_failed_transaction_leaves_nothing_behind(engine: Engine) -> None:
    from db.engine import session_scope
    from db.models import Run

    run = repo.create_run(engine, {})
    with pytest.raises(RuntimeError), session_scope(engine) as session:
        session.execute(Run.__table__.delete())
        raise RuntimeError("boom")
    assert repo.get_run(engine, run.id).status == "queued"


def test_cli_upgrade_and_current(database_url: str) -> None:
    runner = CliRunner()
    before = runner.invoke(db_app, ["current", "--url", database_url])
    assert before.exit_code == 1
    assert "torchdeck db upgrade" in before.output
    done = runner.invoke(db_app, ["upgrade", "--url", database_url])
    assert done.exit_code == 0, done.output
    assert head_revision() in done.output
    after = runner.invoke(db_app, ["current", "--url", database_url])
    assert after.exit_code == 0
    assert f"revision {head_revision()}" in after.output


def test_a_database_from_a_newer_torchdeck_is_refused_without_suggesting_upgrade(engine: Engine) -> None:
    with engine.begin() as conn:
        conn.execute(text("UPDATE alembic_version SET version_num = 'ffff_from_the_future'"))
    with pytest.raises(SchemaOutOfDate, match="a newer torchdeck upgraded it") as caught:
        check_schema(engine)
    assert "ffff_from_the_future" in str(caught.value)


def test_0003_keys_owners_on_identities_and_a_downgrade_keeps_them(database_url: str) -> None:
    """Owners are `<issuer>#<subject>` keys since 0003 (longer than the old 100 characters); datasets get an
    owner (NULL for those uploaded before). Going back to 0002 and up again keeps every owner."""
    upgrade(database_url, "0002")
    engine = make_engine(database_url)
    try:
        with engine.begin() as conn:  # the schema of 0002 (today's models have columns it lacks)
            conn.exec_driver_sql(
                "INSERT INTO run (id, name, owner, status, spec, spec_hash, created_at, attempt, summary, "
                "cancel_requested) VALUES ('r-old', 'old', 'ana@example.com', 'queued', '{}', 'h', "
                "'2026-01-01 00:00:00+00:00', 0, '{}', false)"
            )
            conn.exec_driver_sql(
                "INSERT INTO dataset (id, name, uri, classes, counts, status, created_at) VALUES "
                "('d1', 'pets', '/data/pets', '[]', '{}', 'ready', '2026-01-01 00:00:00+00:00')"
            )
        upgrade(database_url)
        key = "https://sso.example.com/realms/a-rather-long-realm-name/protocol/openid-connect#" + "f" * 250
        new = repo.create_run(engine, {"lr": 0.2}, owner=key)
        assert repo.get_dataset(engine, "d1").owner is None
        assert repo.upsert_account(engine, key, "Ana", "ana@example.com").email == "ana@example.com"
        assert downgrade(database_url, "0002") == "0002"
        upgrade(database_url)
        assert repo.get_run(engine, new.id).owner == key and repo.get_run(engine, "r-old").owner == "ana@example.com"
    finally:
        engine.dispose()
