"""The dashboard in Streamlit's dark theme, in a real browser: the live chart component draws its text in the
theme's light colour (it once hard-coded a white chart's dark text), and there is no "Deploy" button."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from conftest import SHOTS, free_port, stop_group, wait_http
from playwright.sync_api import Error as PlaywrightError
from test_compare_live_e2e import _seed

from db.migrate import upgrade

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
    home = Path(tempfile.mkdtemp(prefix="torchdeck-dark-"))
    db_url = f"sqlite:///{home / 'torchdeck.db'}"
    upgrade(db_url)
    run_id = _seed(db_url, "live", running=True)
    port = free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith("TORCHDECK_")}
    env.update(TORCHDECK_HOME=str(home), TORCHDECK_DATABASE_URL=db_url, TORCHDECK_BROKER_URL="redis://127.0.0.1:1/0",
               PYTHONUNBUFFERED="1", STREAMLIT_THEME_BASE="dark")
    log = home / "ui.log"
    with open(log, "wb") as out:
        proc = subprocess.Popen([sys.executable, "-m", "app.cli", "ui", "--port", str(port)], cwd=ROOT, env=env,
                                stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        wait_http(f"http://127.0.0.1:{port}/_stcore/health", 90, proc, log)
        yield {"url": f"http://127.0.0.1:{port}", "run": run_id}
    finally:
        stop_group(proc)
        shutil.rmtree(home, ignore_errors=True)


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
    r, g, b = (float(v) for v in rgb[rgb.index("(") + 1:rgb.index(")")].split(",")[:3])
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
