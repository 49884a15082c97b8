"""Sweeps in a real browser: the dashboard (`torchdeck ui`, local mode) on a database holding a sweep played by
hand (tests/app/sweep_seeding.py), driven by Chromium. The sweep's page shows its trials table with the pruned
trial marked and its charts; a sweep made in the New run form (sweep ticked beside the learning rate) is
launched and its page opened from the link the form shows.

No broker and no worker: a launched sweep's first trial stays queued, which is all the page needs. Nothing
waits a fixed time: each step waits for what a user would see, with a generous bound."""

from __future__ import annotations

import importlib.util
import os
import re
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest
from conftest import SHOTS, ends_with_us, free_port, settled, stop_group, wait_http
from playwright.sync_api import expect

from db.engine import make_engine
from db.migrate import upgrade

ROOT = Path(__file__).resolve().parents[2]
WAIT_MS = 90_000  # for what a user would see: generous, a busy machine takes longer
pytestmark = pytest.mark.timeout(400)


def _seeding():
    spec = importlib.util.spec_from_file_location("sweep_seeding", ROOT / "tests" / "app" / "sweep_seeding.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def dashboard() -> Iterator[dict]:
    home = Path(tempfile.mkdtemp(prefix="torchdeck-sweep-"))
    db_url = f"sqlite:///{home / 'torchdeck.db'}"
    upgrade(db_url)
    engine = make_engine(db_url)
    try:
        sweep_id = _seeding().seed_sweep(engine, name="seeded-sweep").sweep_id
    finally:
        engine.dispose()
    port = free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith("TORCHDECK_")}
    env.update(
        TORCHDECK_HOME=str(home),
        TORCHDECK_DATABASE_URL=db_url,
        TORCHDECK_BROKER_URL="redis://127.0.0.1:1/0",
        PYTHONUNBUFFERED="1",
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
        yield {"url": f"http://127.0.0.1:{port}", "sweep_id": sweep_id, "log": log}
    finally:
        stop_group(proc)
        shutil.rmtree(home, ignore_errors=True)


def _widget(page, key: str):
    return page.locator(f".st-key-{key.replace('.', '-')}")


def _page(browser):
    page = browser.new_page(viewport={"width": 1500, "height": 1400})
    page.set_default_timeout(WAIT_MS)
    return page


def _shot(page, name: str) -> None:
    SHOTS.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=str(SHOTS / name), full_page=True)


def test_the_sweep_page_shows_the_trials_with_the_pruned_one_marked_and_its_charts(dashboard, browser):
    page = _page(browser)
    try:
        page.goto(f"{dashboard['url']}/sweep")
        page.locator("td[role='gridcell']", has_text="seeded-sweep").first.wait_for(state="attached")
        page.goto(f"{dashboard['url']}/sweep?id={dashboard['sweep_id']}")
        page.get_by_role("heading", name="seeded-sweep").wait_for()
        # The tables draw on a canvas; their accessible (hidden) cells hold what the canvas shows.
        page.locator("td[role='gridcell']", has_text="pruned at epoch 1").first.wait_for(state="attached")
        page.locator("td[role='gridcell']", has_text="below the median").first.wait_for(state="attached")
        page.get_by_text("Shaded rows").wait_for()
        charts = page.locator(".js-plotly-plot")
        expect(charts).to_have_count(4, timeout=WAIT_MS)  # best so far, every curve, parallel, importances
        page.locator(".js-plotly-plot .parcoords").first.wait_for(state="attached")
        for title in ("Best so far", "per epoch, every trial", "Parameter importances"):
            page.locator(".js-plotly-plot .gtitle", has_text=title).first.wait_for(state="attached")
        page.get_by_text("Best so far: trial #2").wait_for()
        _shot(page, "sweep-01-page.png")
    except BaseException:
        _shot(page, "sweep-zz-page-failure.png")
        raise
    finally:
        page.close()


def test_a_sweep_made_in_the_new_run_form_opens_on_its_page(dashboard, browser):
    page = _page(browser)
    try:
        page.goto(f"{dashboard['url']}/new")
        page.get_by_role("button", name="Launch run").wait_for()
        settled(page)  # every widget drawn (the page's button comes before them), nothing moving
        _widget(page, "nr.f.name").locator("input").fill("form-sweep")
        box = _widget(page, "nr.sw.on.optim.lr")
        box.locator("label").first.click()
        expect(box.get_by_role("checkbox")).to_be_checked(timeout=WAIT_MS)
        page.get_by_role("button", name="Set up sweep").click()
        _widget(page, "nr.sw.r.optim.lr.low").locator("input").wait_for()
        expect(_widget(page, "nr.sw.r.optim.lr.high").locator("input")).to_have_value("0.01", timeout=WAIT_MS)
        page.get_by_text(re.compile(r"3 trials × 1 seed\(s\) = 3 runs")).wait_for()
        _shot(page, "sweep-02-form.png")
        settled(page)
        page.get_by_role("button", name="Launch sweep").click()
        page.get_by_text("launched: 3 trials").wait_for()
        settled(page)
        page.get_by_role("link", name="Open the sweep").click()
        page.wait_for_url(re.compile(r".*/sweep\?id=\w+"), timeout=WAIT_MS)
        page.get_by_role("heading", name="form-sweep").wait_for()
        page.get_by_text("Live: this part of the page refreshes").wait_for()
        page.locator("td[role='gridcell']", has_text="queued").first.wait_for(state="attached")  # no worker here
        page.get_by_text("The charts appear with the first trial's first epoch").wait_for()
        _shot(page, "sweep-03-launched.png")
    except BaseException:
        _shot(page, "sweep-zz-form-failure.png")
        raise
    finally:
        page.close()
