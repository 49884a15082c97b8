"""Compare, live, in a real browser: a running run beside a finished one on `torchdeck ui` (local mode, a database
seeded beforehand), driven by Chromium. The user zooms into the loss chart; new points arrive in the database;
the chart draws them and keeps the user's zoom.

Nothing waits a fixed time: each step waits for what the user would see, with a generous bound."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from conftest import SHOTS, serve_ui
from playwright.sync_api import Error as PlaywrightError

from db import repo
from db.engine import make_engine
from db.types import MetricPoint

ROOT = Path(__file__).resolve().parents[2]
SPEC = {"name": "seeded", "data": {"name": "digits", "image_size": 16}, "train": {"epochs": 1}}
WAIT_S = 60  # for what the user would see: generous, a busy machine takes longer
CHART = "train/loss"
pytestmark = pytest.mark.timeout(300)

# The live chart's div (in the live-chart component's frame) by its title: its trace's points and x range.
CHART_JS = """([chart, trace]) => {
    for (const gd of document.querySelectorAll('.js-plotly-plot')) {
        const title = ((gd.layout && gd.layout.title && gd.layout.title.text) || '').replace(/<[^>]+>/g, '');
        if (title !== chart) continue;
        const t = (gd._fullData || []).find(d => d.name === trace);
        if (!t || !t.x.length) return null;
        let last = -Infinity;
        for (const v of t.x) last = Math.max(last, Number(v));
        return {last: last, range: gd._fullLayout.xaxis.range.map(Number)};
    }
    return null; }"""
ZOOM_JS = """([chart, range]) => {
    for (const gd of document.querySelectorAll('.js-plotly-plot')) {
        const title = ((gd.layout && gd.layout.title && gd.layout.title.text) || '').replace(/<[^>]+>/g, '');
        if (title === chart) { Plotly.relayout(gd, {'xaxis.range': range}); return true; }
    }
    return false; }"""


def _seed(url: str, name: str, running: bool) -> str:
    engine = make_engine(url)
    try:
        r = repo.create_run(engine, SPEC, name=name, owner="local")
        repo.claim_run(engine, r.id, "w1", device="cpu")
        repo.append_metrics(engine, r.id, [MetricPoint(CHART, s, 2.0 / s, 1) for s in range(1, 21)])
        if running:
            repo.heartbeat(engine, r.id, worker_id="w1", progress=0.2)
        else:
            repo.finish_run(engine, r.id, "completed", summary={"status": "completed"})
        return r.id
    finally:
        engine.dispose()


@pytest.fixture(scope="module")
def dashboard() -> Iterator[dict]:
    def seed(db_url: str) -> dict:
        return {"live": _seed(db_url, "live", running=True), "done": _seed(db_url, "done", running=False)}

    with serve_ui("torchdeck-compare-", seed) as (url, db_url, ids):
        yield {"url": url, "ids": ids, "db": db_url}


def _chart(page, trace: str) -> dict | None:
    """The chart's state in the browser right now, from whichever frame draws it; None while not drawn."""
    for frame in page.frames:
        try:
            found = frame.evaluate(CHART_JS, [CHART, trace])
        except PlaywrightError:  # a frame that navigated or closed meanwhile, or has no Plotly
            continue
        if found:
            return found
    return None


def _zoom(page, x_range: list[float]) -> None:
    for frame in page.frames:
        try:
            if frame.evaluate(ZOOM_JS, [CHART, x_range]):
                return
        except PlaywrightError:
            continue
    raise AssertionError("no chart to zoom")


def _wait(what: str, condition) -> dict:
    deadline = time.monotonic() + WAIT_S
    while not (found := condition()):
        assert time.monotonic() < deadline, f"{what}: not seen within {WAIT_S} s"
        time.sleep(0.3)
    return found


def test_a_zoomed_live_compare_chart_draws_new_points_and_keeps_the_zoom(dashboard, browser):
    page = browser.new_page(viewport={"width": 1400, "height": 1200})
    ids = dashboard["ids"]
    try:
        page.goto(f"{dashboard['url']}/compare?ids={ids['live']},{ids['done']}")
        _wait("the live run's loss curve", lambda: (c := _chart(page, "live")) and c["last"] == 20)
        _zoom(page, [5, 12])
        _wait("the zoom", lambda: (c := _chart(page, "live")) and c["range"] == pytest.approx([5, 12]))
        engine = make_engine(dashboard["db"])
        try:
            repo.append_metrics(engine, ids["live"], [MetricPoint(CHART, s, 2.0 / s, 1) for s in range(21, 41)])
        finally:
            engine.dispose()
        state = _wait("the new points", lambda: (c := _chart(page, "live")) and c["last"] == 40 and c)
        assert state["range"] == pytest.approx([5, 12])  # drawn in place: the user's zoom survives
        assert _chart(page, "done")["last"] == 20
        SHOTS.mkdir(parents=True, exist_ok=True)
        page.screenshot(path=str(SHOTS / "compare-live-zoom.png"), full_page=True)
    finally:
        page.close()


def _run_chart(page) -> dict | None:
    """The Run page's Loss chart (train/loss trace), from whichever frame draws it; None while not drawn."""
    for frame in page.frames:
        try:
            found = frame.evaluate(CHART_JS, ["Loss", CHART])
        except PlaywrightError:
            continue
        if found:
            return found
    return None


def test_the_live_run_page_follows_new_points_from_its_route_and_keeps_the_zoom(dashboard, browser):
    """The Run page of a running run: its charts are fed by the dashboard's live route (no page rerun per
    point), draw new points in place with the user's zoom kept, and the page shows the end of the run."""
    page = browser.new_page(viewport={"width": 1400, "height": 1200})
    fed = []
    page.on("response", lambda r: fed.append(r.status) if "/_torchdeck/live?" in r.url else None)
    run_id = dashboard["ids"]["live"]
    engine = make_engine(dashboard["db"])
    try:
        page.goto(f"{dashboard['url']}/run?id={run_id}")
        start = _wait("the live run's loss curve", lambda: (c := _run_chart(page)) and c["last"] >= 40 and c)
        last = int(start["last"])  # the Compare test before may have added points
        zoom = [5, last - 5]
        for frame in page.frames:
            try:
                if frame.evaluate(ZOOM_JS, ["Loss", zoom]):
                    break
            except PlaywrightError:
                continue
        _wait("the zoom", lambda: (c := _run_chart(page)) and c["range"] == pytest.approx(zoom))
        repo.append_metrics(engine, run_id, [MetricPoint(CHART, s, 2.0 / s, 1) for s in range(last + 1, last + 21)])
        state = _wait("the new points", lambda: (c := _run_chart(page)) and c["last"] == last + 20 and c)
        assert state["range"] == pytest.approx(zoom)  # drawn in place: the user's zoom survives
        assert 200 in fed  # the points came from the live route
        assert page.get_by_text("completed").count() == 0
        repo.finish_run(engine, run_id, "completed", summary={"status": "completed"})
        page.get_by_text("completed").first.wait_for(timeout=WAIT_S * 1000)
    finally:
        engine.dispose()
        page.close()
