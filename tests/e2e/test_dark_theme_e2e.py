"""The dashboard in Streamlit's dark theme, in a real browser: the live chart component draws its text in the
theme's light colour (it once hard-coded a white chart's dark text), and there is no "Deploy" button."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from conftest import SHOTS, serve_ui
from playwright.sync_api import Error as PlaywrightError
from test_compare_live_e2e import _seed

ROOT = Path(__file__).resolve().parents[2]
WAIT_S = 60
pytestmark = pytest.mark.timeout(300)

# The colour of the loss chart's tick labels as drawn (an SVG fill), in whichever frame draws it.
TICK_FILL = """(chart) => {
    for (const gd of document.querySelectorAll('.js-plotly-plot')) {
        const title = ((gd.layout && gd.layout.title && gd.layout.title.text) || '').replace(/<[^>]+>/g, '');
        const tick = gd.querySelector('.xtick text');
        if (title === chart && tick) return getComputedStyle(tick).fill;
    }
    return null; }"""


@pytest.fixture(scope="module")
def dark_dashboard() -> Iterator[dict]:
    with serve_ui(
        "torchdeck-dark-", lambda db_url: _seed(db_url, "live", running=True), STREAMLIT_THEME_BASE="dark"
    ) as (url, _, run_id):
        yield {"url": url, "run": run_id}


def _tick_fill(page) -> str | None:
    for frame in page.frames:
        try:
            found = frame.evaluate(TICK_FILL, "Loss")  # the Run page's loss chart
        except PlaywrightError:
            continue
        if found:
            return found
    return None


def _brightness(rgb: str) -> float:
    r, g, b = (float(v) for v in rgb[rgb.index("(") + 1 : rgb.index(")")].split(",")[:3])
    return (r + g + b) / 3


def test_the_live_chart_follows_the_dark_theme_and_there_is_no_deploy_button(dark_dashboard, browser):
    page = browser.new_page(viewport={"width": 1400, "height": 1200})
    try:
        page.goto(f"{dark_dashboard['url']}/run?id={dark_dashboard['run']}")
        deadline = time.monotonic() + WAIT_S
        while (fill := _tick_fill(page)) is None:
            assert time.monotonic() < deadline, f"the live loss chart was not drawn within {WAIT_S} s"
            time.sleep(0.3)
        assert _brightness(fill) > 160, f"tick labels drawn in {fill}: dark text on the dark theme"
        assert page.get_by_role("button", name="Deploy").count() == 0
        SHOTS.mkdir(parents=True, exist_ok=True)
        page.screenshot(path=str(SHOTS / "run-dark-theme.png"), full_page=True)
    finally:
        page.close()
