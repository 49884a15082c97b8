"""Sweep tests that need only a database run on a real SQLite file and on a real Postgres server."""

from __future__ import annotations

import sys
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from sqlalchemy import Engine

# `pytest` (unlike `python -m pytest`) does not put the repository root on
# sys.path, and tests/ is not a package.
ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from db.engine import make_engine  # noqa: E402
from db.migrate import upgrade  # noqa: E402
from tests._servers import PostgresServer  # noqa: E402

BACKENDS = ("sqlite", "postgres")


@pytest.fixture(params=BACKENDS)
def database_url(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    """The URL of an empty database (no tables yet) on each backend."""
    if request.param == "sqlite":
        yield f"sqlite:///{tmp_path / 'torchdeck.db'}"
        return
    server: PostgresServer = request.getfixturevalue("postgres")
    name = f"test_{uuid.uuid4().hex[:12]}"
    url = server.create_database(name)
    yield url
    server.drop_database(name)


@pytest.fixture
def engine(database_url: str) -> Iterator[Engine]:
    """An engine on a database migrated to the newest revision."""
    upgrade(database_url)
    engine = make_engine(database_url)
    yield engine
    engine.dispose()
