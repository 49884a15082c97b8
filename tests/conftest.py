"""Shared test settings: tests run offline, single-threaded per process, on the CPU."""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest

from tests._servers import PostgresServer, PostgresUnavailable, start_postgres

# Keep the 2-core CI machine responsive and results repeatable across processes.
os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("MKL_NUM_THREADS", "1")
# Never reach a model/data hub from tests.
os.environ.setdefault("HF_HUB_OFFLINE", "1")


@pytest.fixture(scope="session")
def postgres() -> Iterator[PostgresServer]:
    """One throwaway Postgres cluster per test session (Debian's postgresql, installed by make test)."""
    try:
        server = start_postgres()
    except PostgresUnavailable as exc:
        pytest.fail(f"cannot start the test Postgres server: {exc}", pytrace=False)
    yield server
    server.stop()
