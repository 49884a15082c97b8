"""Sweep tests that need only a database run on a real SQLite file and on a real Postgres server: the
database fixtures of tests/db (a fresh database per test, migrated like a user's)."""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:  # `pytest` (unlike `python -m pytest`) does not put the repository root on sys.path
    sys.path.insert(0, str(ROOT))

from tests.db.conftest import database_url, engine  # noqa: E402,F401 - the fixtures, shared
