"""Following, in a real browser: on `torchdeck ui` (local mode, a database seeded beforehand), driven by Chromium,
the user follows a running run from its page and goes to the Runs page; the run ends in the database; a toast
says so there, without the user doing anything.

Nothing waits a fixed time: each step waits for what the user would see, with a generous bound."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from conftest import SHOTS, serve_ui, settled
from playwright.sync_api import expect

from db import repo
from db.engine import make_engine

ROOT = Path(__file__).resolve().parents[2]
SPEC = {"name": "seeded", "data": {"name": "digits", "image_size": 16}, "train": {"epochs": 1}}
WAIT_MS = 60_000  # for what the user would see: generous, a busy machine takes longer
NAME = "watched"
pytestmark = pytest.mark.timeout(300)


def _seed(url: str) -> str:
    engine = make_engine(url)
    try:
        r = repo.create_run(engine, SPEC, name=NAME, owner="local")
        repo.claim_run(engine, r.id, "w1", device="cpu")
        repo.heartbeat(engine, r.id, worker_id="w1", progress=0.2)
        return r.id
    finally:
        engine.dispose()


@pytest.fixture(scope="module")
def dashboard() -> Iterator[dict]:
    with serve_ui("torchdeck-follow-", _seed) as (url, db_url, run_id):
        yield {"url": url, "run_id": run_id, "db": db_url}


def test_a_followed_run_that_completes_is_told_on_another_page(dashboard, browser):
    page = browser.new_page(viewport={"width": 1400, "height": 1000})
    run_id = dashboard["run_id"]
    try:
        page.goto(f"{dashboard['url']}/run?id={run_id}")
        page.get_by_role("heading", name=NAME).wait_for(timeout=WAIT_MS)
        settled(page)  # the page's script run drawn: a click during a rerun can land on a button being redrawn
        page.get_by_role("button", name="Follow", exact=True).click()
        expect(page.get_by_role("button", name="Unfollow", exact=True)).to_be_visible(timeout=WAIT_MS)
        sidebar = page.get_by_test_id("stSidebar")
        settled(page)
        sidebar.get_by_test_id("stSidebarNav").get_by_role("link", name="Runs", exact=True).click()
        runs_heading = page.get_by_role("heading", name="Runs", exact=True)  # the default page: its URL is /
        runs_heading.wait_for(timeout=WAIT_MS)
        # The followed run, listed in the sidebar of the page the user is on now.
        expect(sidebar.get_by_role("link", name=f"{NAME} · running")).to_be_visible(timeout=WAIT_MS)
        engine = make_engine(dashboard["db"])
        try:
            repo.finish_run(engine, run_id, "completed", summary={"status": "completed"})
        finally:
            engine.dispose()
        toast = page.get_by_test_id("stToast").filter(has_text=NAME).filter(has_text="completed")
        expect(toast).to_be_visible(timeout=WAIT_MS)
        expect(runs_heading).to_be_visible()  # told where the user is, not on the run's page
        expect(sidebar.get_by_role("link", name=f"{NAME} · completed")).to_be_visible(timeout=WAIT_MS)
        SHOTS.mkdir(parents=True, exist_ok=True)
        page.screenshot(path=str(SHOTS / "follow-toast.png"))
    finally:
        page.close()
