"""End-to-end: the real stack started the way `make up` starts it (`torchdeck up`: a private Redis,
one worker, the Streamlit UI, SQLite under a temporary TORCHDECK_HOME), driven by Debian's
Chromium through Playwright. Screenshots go to test-output/screenshots/ (each test's own file names), the servers'
logs to test-output/e2e-logs/<test module>/ (pytest-xdist runs a module's tests in one worker, modules side by side).

Acting on a page: `settled(page)` before a click whose effect depends on where things are, and `click_still(page,
target)` to open a drop-down (selectbox, multiselect, popover, menu). Streamlit draws a page's widgets as
placeholders (skeletons) first and the widgets a moment later, so the page moves after its buttons appear; and an
open drop-down closes on any scroll of the page around it, including the one Playwright makes to bring its target
into view, when that scroll's event is delivered after the click (on a busy machine it is: a frame later)."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

from tests._servers import free_port, stop_group, wait_http  # the e2e tests import them from here

ROOT = Path(__file__).resolve().parents[2]
SHOTS = ROOT / "test-output" / "screenshots"
LOGS = ROOT / "test-output" / "e2e-logs"
CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
]


SETTLED_JS = """() => {
    const app = document.querySelector("[data-testid='stApp']");
    const main = document.querySelector("[data-testid='stMain']");
    if (!app || !main || app.getAttribute("data-test-script-state") !== "notRunning"
            || document.querySelector("[data-stale='true'], [data-testid='stSkeleton']")) {
        window.__torchdeckLayout = null;
        return false;
    }
    const layout = [main.scrollHeight, main.scrollTop, document.documentElement.scrollHeight].join();
    const same = window.__torchdeckLayout === layout;
    window.__torchdeckLayout = layout;
    return same; }"""
STILL_JS = """(el) => new Promise(done => {  // the same box over two animation frames: nothing moves it, and a scroll
    const box = () => JSON.stringify(el.getBoundingClientRect());  // made before has had its event delivered
    const before = box();
    requestAnimationFrame(() => requestAnimationFrame(() => done(before === box())));
})"""


def settled(page, timeout_ms: float = 90_000) -> None:
    """Until the page is drawn for good: the app's script run over (no rerun under way), nothing on the page stale
    (left from a previous run), no widget still a placeholder (skeleton), and the page the same size and scrolled
    the same over two animation frames. Generously bounded: a busy machine takes longer."""
    page.wait_for_function(SETTLED_JS, polling="raf", timeout=timeout_ms)


def click_still(page, target, timeout_ms: float = 90_000) -> None:
    """Click `target` (a drop-down's input or button) on a settled page, once it is in view and still: the scroll
    that brought it there has had its event delivered, so no late scroll closes what the click opens."""
    settled(page, timeout_ms)
    target.scroll_into_view_if_needed(timeout=timeout_ms)
    page.wait_for_function(STILL_JS, arg=target.element_handle(timeout=timeout_ms), timeout=timeout_ms)
    target.click(timeout=timeout_ms)


def keep_logs(module: str, files: list[Path]) -> None:
    """Copy the servers' logs to test-output/e2e-logs/<module>/ for a post-mortem (that module's folder only:
    modules running side by side never clear each other's)."""
    keep = LOGS / module
    shutil.rmtree(keep, ignore_errors=True)
    keep.mkdir(parents=True)
    for f in files:
        if f.is_file():
            shutil.copy(f, keep / f.name)


# Runs a command that the kernel stops (SIGTERM) when the process that started it dies (prctl PR_SET_PDEATHSIG, kept
# through exec), however it dies; a parent already gone by then stops it at once.
_ENDS_WITH_PARENT = (
    "import ctypes, os, signal, sys; ctypes.CDLL(None).prctl(1, signal.SIGTERM); "
    "os.getppid() == int(sys.argv[1]) or sys.exit(1); os.execv(sys.argv[2], sys.argv[2:])"
)


def ends_with_us(command: list[str]) -> list[str]:
    """`command`, stopped by the kernel when this test process dies, even killed without its fixtures' teardown (a
    CI timeout, kill -9): no dashboard is left running, eating the next tests' CPU. (`torchdeck ui` becomes
    Streamlit by exec; `torchdeck up` stops what it started itself.) Off Linux, or started from another thread than
    the main one (the signal comes when the thread that started it ends), `command` as it is."""
    if sys.platform != "linux" or threading.current_thread() is not threading.main_thread():
        return command
    return [sys.executable, "-c", _ENDS_WITH_PARENT, str(os.getpid()), *command]


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
    env.update(
        TORCHDECK_HOME=str(home),
        TORCHDECK_DATABASE_URL=db_url,
        TORCHDECK_BROKER_URL="redis://127.0.0.1:1/0",
        PYTHONUNBUFFERED="1",
        **env_extra,
    )
    log = home / "ui.log"
    with open(log, "wb") as out:
        proc = subprocess.Popen(
            ends_with_us([sys.executable, "-m", "app.cli", "ui", "--port", str(port)]),
            cwd=ROOT,
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    try:
        wait_http(f"http://127.0.0.1:{port}/_stcore/health", 90, proc, log)
        yield f"http://127.0.0.1:{port}", db_url, seeded
    finally:
        stop_group(proc)
        shutil.rmtree(home, ignore_errors=True)


@pytest.fixture(scope="module")
def stack(request: pytest.FixtureRequest) -> Iterator[dict]:
    home = Path(tempfile.mkdtemp(prefix="torchdeck-e2e-"))
    port = free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith("TORCHDECK_")}
    env.update(TORCHDECK_HOME=str(home), OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1")
    log = home / "up.log"
    exe = Path(sys.executable).parent / "torchdeck"
    with open(log, "wb") as out:
        proc = subprocess.Popen(
            ends_with_us([str(exe), "up", "--port", str(port)]), cwd=ROOT, env=env, stdout=out, stderr=subprocess.STDOUT
        )
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
        keep_logs(request.module.__name__, [log, *(home / "logs").glob("*.log")])  # the UI, worker and launcher logs
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
