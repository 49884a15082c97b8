"""End-to-end: the real stack started the way `make up` starts it (`torchdeck up`: a private Redis,
one worker, the Streamlit UI, SQLite under a temporary TORCHDECK_HOME), driven by Debian's
Chromium through Playwright. Screenshots go to test-output/screenshots/."""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[2]
SHOTS = ROOT / "test-output" / "screenshots"
CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = ["--no-sandbox", "--disable-gpu", "--disable-background-networking", "--disable-component-update",
                 "--disable-sync", "--no-first-run"]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


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
            raise RuntimeError(f"torchdeck up exited with {proc.returncode}:\n{log.read_text()[-4000:]}")
        try:
            with urllib.request.urlopen(url, timeout=2) as r:
                if r.status == 200:
                    return
        except OSError:
            time.sleep(0.5)
    raise RuntimeError(f"{url} did not answer within {timeout_s:.0f} s:\n{log.read_text()[-4000:]}")


@contextmanager
def serve_ui(prefix: str, seed: Callable[[str], Any], **env_extra: str) -> Iterator[tuple[str, str, Any]]:
    """`torchdeck ui` (this checkout's CLI, local mode, no broker) on a fresh SQLite database that `seed(db_url)`
    fills first; yields (the dashboard's URL, the database URL, what seed returned)."""
    home = Path(tempfile.mkdtemp(prefix=prefix))
    db_url = f"sqlite:///{home / 'torchdeck.db'}"
    from db.migrate import upgrade

    upgrade(db_url)
    seeded = seed(db_url)
    port = free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith("TORCHDECK_")}
    env.update(TORCHDECK_HOME=str(home), TORCHDECK_DATABASE_URL=db_url, TORCHDECK_BROKER_URL="redis://127.0.0.1:1/0",
               PYTHONUNBUFFERED="1", **env_extra)
    log = home / "ui.log"
    with open(log, "wb") as out:
        proc = subprocess.Popen([sys.executable, "-m", "app.cli", "ui", "--port", str(port)], cwd=ROOT, env=env,
                                stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        wait_http(f"http://127.0.0.1:{port}/_stcore/health", 90, proc, log)
        yield f"http://127.0.0.1:{port}", db_url, seeded
    finally:
        stop_group(proc)
        shutil.rmtree(home, ignore_errors=True)


@pytest.fixture(scope="module")
def stack() -> Iterator[dict]:
    home = Path(tempfile.mkdtemp(prefix="torchdeck-e2e-"))
    port = free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith("TORCHDECK_")}
    env.update(TORCHDECK_HOME=str(home), OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1")
    log = home / "up.log"
    exe = Path(sys.executable).parent / "torchdeck"
    with open(log, "wb") as out:
        proc = subprocess.Popen([str(exe), "up", "--port", str(port)], cwd=ROOT, env=env, stdout=out,
                                stderr=subprocess.STDOUT)
    try:
        wait_http(f"http://127.0.0.1:{port}/_stcore/health", 90, proc, log)
        yield {"url": f"http://127.0.0.1:{port}", "home": home, "log": log, "proc": proc}
    finally:
        proc.send_signal(signal.SIGTERM)  # the launcher stops Redis, the worker and the UI
        try:
            proc.wait(timeout=40)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        keep = ROOT / "test-output" / "e2e-logs"  # for a post-mortem: the UI, worker and launcher logs
        shutil.rmtree(keep, ignore_errors=True)
        keep.mkdir(parents=True)
        for f in [log, *(home / "logs").glob("*.log")]:
            shutil.copy(f, keep / f.name)
        shutil.rmtree(home, ignore_errors=True)


@pytest.fixture(scope="module")
def browser() -> Iterator:
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        b = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        yield b
        b.close()


@pytest.fixture
def shots() -> Path:
    SHOTS.mkdir(parents=True, exist_ok=True)
    return SHOTS
