"""Shared test settings: tests run offline, single-threaded per process, on the CPU."""

from __future__ import annotations

import atexit
import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests._servers import PostgresServer, PostgresUnavailable, start_postgres

# Keep the 2-core CI machine responsive and results repeatable across processes.
os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("MKL_NUM_THREADS", "1")
# Never reach a model/data hub from tests.
os.environ.setdefault("HF_HUB_OFFLINE", "1")
# A test that names no TORCHDECK_HOME (most set their own) gets this process's own folder, not the default ./.torchdeck:
# nothing is written into the checkout, and no two pytest-xdist workers share a database or an artifact folder.
# (An xdist worker inherits its parent's: one this process's parent made is replaced, one a user set is kept.)
_MADE_HOME = "PYTEST_TORCHDECK_MADE_HOME"
if os.environ.get("TORCHDECK_HOME", "") in ("", os.environ.get(_MADE_HOME)):
    os.environ["TORCHDECK_HOME"] = os.environ[_MADE_HOME] = tempfile.mkdtemp(prefix="torchdeck-tests-home-")
    atexit.register(shutil.rmtree, os.environ[_MADE_HOME], ignore_errors=True)


MAX_AUTO_WORKERS = 4


@pytest.hookimpl(tryfirst=True)
def pytest_xdist_auto_num_workers(config: pytest.Config) -> int:
    """`-n auto` (make test): one worker per CPU this process may use (its affinity and its cgroup's CPU quota: a
    container's share, not the host's cores), plus one, since the tests mostly wait on servers, browsers and worker
    processes; at most MAX_AUTO_WORKERS (each worker runs its own Postgres, Redis, dashboards and browser).
    PYTEST_XDIST_AUTO_NUM_WORKERS=<n> overrides it."""
    given = os.environ.get("PYTEST_XDIST_AUTO_NUM_WORKERS", "")
    if given.isdigit():
        return int(given)
    return min(usable_cpus() + 1, MAX_AUTO_WORKERS)


def usable_cpus() -> int:
    cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    try:  # cgroup v2: "<quota> <period>", or "max <period>" without a quota
        quota, period = Path("/sys/fs/cgroup/cpu.max").read_text().split()[:2]
        if quota != "max":
            cpus = min(cpus, max(1, round(int(quota) / int(period))))
    except (OSError, ValueError):
        pass
    return max(1, cpus)


# Under pytest-xdist (make test: `-n auto --dist loadfile`), a test file is a unit of work: its tests run in one
# worker, in order, sharing its module's servers, browser and trained models (made once, not once per worker), and
# files go to workers as they come free. (Not --dist loadgroup: pytest-xdist 3.8 marks a test's group in its node
# id, which pytest 9.2 no longer lets it change, so groups are silently ignored: pytest-xdist issue #1386.)
# The files that start servers and train models come first, so that no worker is left with one of them at the end
# while the others wait: a stable sort, each file's tests kept together and in order, the same on every worker.
SLOW_FIRST = ("tests/worker/", "tests/e2e/", "tests/team/", "tests/store/")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if not os.environ.get("PYTEST_XDIST_WORKER"):
        return  # one process: the usual order

    def rank(item: pytest.Item) -> int:
        path = item.nodeid.split("::")[0]
        return next((i for i, folder in enumerate(SLOW_FIRST) if path.startswith(folder)), len(SLOW_FIRST))

    items.sort(key=rank)


@pytest.fixture(scope="session")
def postgres() -> Iterator[PostgresServer]:
    """One throwaway Postgres cluster per test session (Debian's postgresql, installed by make test)."""
    try:
        server = start_postgres()
    except PostgresUnavailable as exc:
        pytest.fail(f"cannot start the test Postgres server: {exc}", pytrace=False)
    yield server
    server.stop()
