"""What the pages say, in a real browser: on `torchdeck ui` (local mode, a database seeded beforehand), driven by
Chromium. A value not there yet reads "–", never "None" (Overview's value and best of a run before its first
validation; the Workers page's current run of an idle worker); a worker without a GPU (`make up` on a laptop)
is said to take CPU runs; the navigation lists the pages, not the artifact download reached by link only; a chart
of one point counts whole steps (420, 421, 422), never 421.5. Screenshots: test-output/screenshots/words-*.png.

Nothing waits a fixed time: each step waits for what the user would see, with a generous bound."""

from __future__ import annotations

import re
import time
from collections.abc import Iterator

import pytest
from conftest import SHOTS, serve_ui, settled
from playwright.sync_api import Error as PlaywrightError
from playwright.sync_api import expect

from db import repo
from db.engine import make_engine
from db.types import MetricPoint

SPEC = {"name": "seeded", "data": {"name": "digits", "image_size": 16}, "train": {"epochs": 4}}
# For what the user would see: minutes, since a busy machine takes longer. A page's first drawing is the slowest
# (Streamlit's first run of it, Chromium starting the app): past 90 s on a 2-core machine busy with a docker build.
WAIT_MS = 240_000
pytestmark = pytest.mark.timeout(600)

# The page's tables draw on a canvas; their accessible (hidden) cells hold what the canvas shows.
TABLES_JS = """() => [...document.querySelectorAll('table')].map(t => {
    const rows = [...t.querySelectorAll('tr')].map(r => [...r.querySelectorAll('th,td')].map(c => c.textContent));
    return {head: rows[0] || [], rows: rows.slice(1)}; })"""
# A live chart's x-axis tick labels, by the chart's title (in the live-chart component's frame).
TICKS_JS = """(chart) => {
    for (const gd of document.querySelectorAll('.js-plotly-plot')) {
        const title = ((gd.layout && gd.layout.title && gd.layout.title.text) || '').replace(/<[^>]+>/g, '');
        if (title === chart) return [...gd.querySelectorAll('.xtick text')].map(t => t.textContent);
    }
    return null; }"""


def _seed(url: str) -> dict[str, str]:
    engine = make_engine(url)
    try:
        fresh = repo.create_run(engine, SPEC, name="just-started", owner="local")  # steps, no validation yet
        repo.claim_run(engine, fresh.id, "cpu@laptop", device="cpu")
        repo.append_metrics(engine, fresh.id, [MetricPoint("train/loss", s, 2.3 - 0.1 * s, 1) for s in range(1, 6)])
        repo.heartbeat(engine, fresh.id, worker_id="cpu@laptop", progress=0.05)
        first = repo.create_run(engine, SPEC, name="first-epoch", owner="local")  # one validation point, at 421
        repo.claim_run(engine, first.id, "cpu@laptop", device="cpu")
        repo.append_metrics(
            engine,
            first.id,
            [
                MetricPoint("train/loss", 420, 1.2, 1),
                MetricPoint("val/acc", 421, 0.31, 1),
                MetricPoint("val/loss", 421, 1.9, 1),
            ],
        )
        repo.heartbeat(engine, first.id, worker_id="cpu@laptop", progress=0.25)
        repo.upsert_worker(
            engine, "cpu@laptop", hostname="laptop", queues=["gpu", "cpu"], devices=[{"kind": "cpu", "cores": 8}]
        )  # `make up` without a GPU; idle
        return {"fresh": fresh.id, "first": first.id}
    finally:
        engine.dispose()


@pytest.fixture(scope="module")
def dashboard() -> Iterator[dict]:
    with serve_ui("torchdeck-words-", _seed) as (url, db_url, ids):
        yield {"url": url, "ids": ids, "db": db_url}


def _row(page, column: str, key: str, value: str) -> dict[str, str] | None:
    """The row whose `key` cell is `value` in the table with `column`, as {column: cell text}."""
    try:
        tables = page.evaluate(TABLES_JS)
    except PlaywrightError:  # the page was between two renders
        return None
    for t in tables:
        if column in t["head"] and key in t["head"]:
            for row in t["rows"]:
                cells = dict(zip(t["head"], row))
                if cells.get(key) == value:
                    return cells
    return None


def _wait_row(page, column: str, key: str, value: str) -> dict[str, str]:
    deadline = time.monotonic() + WAIT_MS / 1000
    while (row := _row(page, column, key, value)) is None:
        assert time.monotonic() < deadline, f"no row {key}={value} in a table with {column}"
        page.wait_for_timeout(300)
    return row


def test_empty_values_read_a_dash_and_a_cpu_worker_takes_cpu_runs(dashboard, browser):
    page = browser.new_page(viewport={"width": 1700, "height": 1100})
    try:
        page.goto(f"{dashboard['url']}/overview", timeout=WAIT_MS)
        row = _wait_row(page, "ETA", "run", "just-started")  # seeded, and nothing ends it: there until it is seen
        settled(page, WAIT_MS)
        SHOTS.mkdir(parents=True, exist_ok=True)
        page.screenshot(path=str(SHOTS / "words-overview-dash.png"), full_page=True)  # the canvas: "–" drawn
        # The table's accessible cells leave a missing value empty; the canvas draws the table's placeholder.
        assert (row["objective"], row["value"], row["best"]) == ("val/loss", "", ""), row
        nav = page.get_by_test_id("stSidebarNav")
        links = [t.strip().splitlines()[-1] for t in nav.get_by_role("link").all_inner_texts()]  # after the icon
        assert {"Overview", "Runs", "New run", "Run", "Compare", "Sweeps", "Workers", "Datasets"} <= set(links)
        assert not any("Artifact" in t for t in links), links  # a download reached by link only
        page.goto(f"{dashboard['url']}/workers", timeout=WAIT_MS)
        row = _wait_row(page, "takes", "worker", "cpu@laptop")  # listed however old its heartbeat ("silent")
        settled(page, WAIT_MS)
        page.screenshot(path=str(SHOTS / "words-workers-cpu.png"), full_page=True)
        assert row["takes"] == "CPU runs (the gpu queue's too, on its CPU)" and row["current run"] == "", row
    finally:
        page.close()


def test_a_chart_of_one_point_counts_whole_steps(dashboard, browser):
    page = browser.new_page(viewport={"width": 1500, "height": 1100})
    try:
        page.goto(f"{dashboard['url']}/run?id={dashboard['ids']['first']}")
        expect(page.get_by_role("heading", name="first-epoch")).to_be_visible(timeout=WAIT_MS)
        deadline = time.monotonic() + WAIT_MS / 1000
        ticks = None
        while not ticks:
            assert time.monotonic() < deadline, "the Accuracy chart was not drawn"
            for frame in page.frames:
                try:
                    ticks = frame.evaluate(TICKS_JS, "Accuracy") or ticks
                except PlaywrightError:  # a frame that navigated or closed meanwhile, or has no Plotly
                    continue
            page.wait_for_timeout(300)
        assert ticks and all(re.fullmatch(r"\d+", t.replace(",", "")) for t in ticks), ticks  # no 421.5
        assert "421" in ticks, ticks
        settled(page)
        page.screenshot(path=str(SHOTS / "words-run-one-point.png"), full_page=True)
    finally:
        page.close()
