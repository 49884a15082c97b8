"""The Overview page, live, in a real browser: on `torchdeck ui` (local mode, a database seeded beforehand with two
running runs claimed by a worker), driven by Chromium. New progress and objective values arrive in the database the
way a worker writes them; the page shows them for both runs without a reload; one run ends and moves to "Recently
finished" with its final status.

Nothing waits a fixed time: each step waits for what the user would see, with a generous bound."""

from __future__ import annotations

import time
from collections.abc import Iterator

import pytest
from conftest import SHOTS, serve_ui
from playwright.sync_api import Error as PlaywrightError

from db import repo
from db.engine import make_engine
from db.types import MetricPoint

SPEC = {"name": "seeded", "data": {"name": "digits", "image_size": 16}, "train": {"epochs": 4}}
OBJECTIVE = "val/loss"  # the default objective: early stopping's monitor
WORKER = "w1"
WAIT_S = 90  # for what the user would see: generous, a busy machine takes longer
pytestmark = pytest.mark.timeout(300)

# The page's tables draw on a canvas; their accessible (hidden) cells hold what the canvas shows. Each table as
# {"head": [column names], "rows": [[cell texts]]}.
TABLES_JS = """() => [...document.querySelectorAll('table')].map(t => {
    const rows = [...t.querySelectorAll('tr')].map(r => [...r.querySelectorAll('th,td')].map(c => c.textContent));
    return {head: rows[0] || [], rows: rows.slice(1)}; })"""


def _seed(url: str) -> dict[str, str]:
    engine = make_engine(url)
    try:
        ids = {}
        for name, loss in (("alpha", 0.8), ("beta", 0.9)):
            r = repo.create_run(engine, SPEC, name=name, owner="local")
            repo.claim_run(engine, r.id, WORKER, device="cpu")
            repo.append_metrics(engine, r.id, [MetricPoint(OBJECTIVE, 1, loss, 1)], worker_id=WORKER)
            repo.heartbeat(engine, r.id, worker_id=WORKER, progress=0.25)
            ids[name] = r.id
        return ids
    finally:
        engine.dispose()


@pytest.fixture(scope="module")
def dashboard() -> Iterator[dict]:
    with serve_ui("torchdeck-overview-", _seed) as (url, db_url, ids):
        yield {"url": url, "ids": ids, "db": db_url}


def _rows(page, marker: str) -> dict[str, dict[str, str]]:
    """The rows of the table with column `marker` ("ETA": Running, "finished": Recently finished), by run name."""
    try:
        tables = page.evaluate(TABLES_JS)
    except PlaywrightError:  # the page was between two renders
        return {}
    for t in tables:
        if marker in t["head"] and "run" in t["head"]:
            return {row[t["head"].index("run")]: dict(zip(t["head"], row)) for row in t["rows"] if row}
    return {}


def _wait(what: str, condition, page) -> None:
    deadline = time.monotonic() + WAIT_S
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(
                f"{what}: not seen within {WAIT_S} s; running {_rows(page, 'ETA')}, finished {_rows(page, 'finished')}"
            )
        page.wait_for_timeout(300)


def _shows(page, name: str, progress: float, value: float) -> bool:
    row = _rows(page, "ETA").get(name)
    return (
        row is not None
        and _number(row["progress"]) == pytest.approx(progress)
        and _number(row["value"]) == pytest.approx(value)
    )


def _number(text: str) -> float | None:
    try:
        return float(text)
    except ValueError:
        return None


def _as_worker(db_url: str, run_id: str, step: int, loss: float, progress: float) -> None:
    """What a worker writes while a run trains: a new objective point, then a heartbeat with its progress."""
    engine = make_engine(db_url)
    try:
        repo.append_metrics(engine, run_id, [MetricPoint(OBJECTIVE, step, loss, step)], worker_id=WORKER)
        repo.heartbeat(engine, run_id, worker_id=WORKER, progress=progress)
    finally:
        engine.dispose()


def test_the_overview_follows_two_running_runs_and_one_finishing_without_a_reload(dashboard, browser):
    """Broken, the Overview would freeze on the values it first drew, or keep a finished run under Running."""
    page = browser.new_page(viewport={"width": 1700, "height": 1200})
    ids, db_url = dashboard["ids"], dashboard["db"]
    try:
        page.goto(f"{dashboard['url']}/overview")
        _wait("both runs at 25 %", lambda: _shows(page, "alpha", 0.25, 0.8) and _shows(page, "beta", 0.25, 0.9), page)
        page.evaluate("() => { window.__notReloaded = true; }")  # gone if the page reloads
        _as_worker(db_url, ids["alpha"], 2, 0.4, 0.5)
        _as_worker(db_url, ids["beta"], 2, 0.3, 0.75)
        _wait(
            "both runs' new progress and objective",
            lambda: _shows(page, "alpha", 0.5, 0.4) and _shows(page, "beta", 0.75, 0.3),
            page,
        )
        assert _number(_rows(page, "ETA")["beta"]["best"]) == pytest.approx(0.3)  # a loss: lower is better
        engine = make_engine(db_url)
        try:
            repo.finish_run(engine, ids["alpha"], "completed", summary={"status": "completed"}, worker_id=WORKER)
        finally:
            engine.dispose()
        _wait(
            "alpha finished",
            lambda: (
                _rows(page, "finished").get("alpha", {}).get("status") == "completed"
                and "alpha" not in _rows(page, "ETA")
            ),
            page,
        )
        assert _shows(page, "beta", 0.75, 0.3)  # still running, as it was
        assert page.evaluate("() => window.__notReloaded === true")
        SHOTS.mkdir(parents=True, exist_ok=True)
        page.screenshot(path=str(SHOTS / "overview-live.png"), full_page=True)
    finally:
        page.close()
