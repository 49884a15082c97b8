"""The current project in a real browser: on `torchdeck ui` (local mode, a database seeded beforehand with two
projects, a finished run in each), driven by Chromium. The URL says the project shown; the sidebar's switcher
changes it (and the URL); another page keeps it; the URL copied into a fresh session shows the same project; a
link to a run of the other project opens that project.

Nothing waits a fixed time: each step waits for what the user would see, with a generous bound."""

from __future__ import annotations

import time
from collections.abc import Iterator
from urllib.parse import parse_qs, urlparse

import pytest
from conftest import click_still, serve_ui, settled
from playwright.sync_api import Error as PlaywrightError
from test_filter_url_e2e import NAMES_JS  # the Runs table's names, read from its accessible cells

from core.config import RunSpec
from db import projects, repo
from db.engine import make_engine

WAIT_S = 90
pytestmark = pytest.mark.timeout(300)


def _seed(url: str) -> dict[str, str]:
    engine = make_engine(url)
    try:
        projects.create_project(engine, "side", by="local")
        ids = {}
        for name, project in (("home-run", "default"), ("side-run", "side")):
            spec = RunSpec.model_validate({"name": name, "data": {"name": "digits", "image_size": 16}})
            r = repo.create_run(engine, spec.model_dump(mode="json"), name=name, owner="local", project=project)
            repo.claim_run(engine, r.id, "w1", device="cpu")
            repo.finish_run(engine, r.id, "completed", summary={"status": "completed"})
            ids[name] = r.id
        return ids
    finally:
        engine.dispose()


@pytest.fixture(scope="module")
def dashboard() -> Iterator[tuple[str, dict[str, str]]]:
    with serve_ui("torchdeck-projects-", _seed) as (url, _db_url, ids):
        yield url, ids


def _project(url: str) -> list[str] | None:
    return parse_qs(urlparse(url).query).get("project")


def _wait_listed(page, wanted: list[str]) -> None:
    deadline = time.monotonic() + WAIT_S
    while True:
        try:
            names = page.evaluate(NAMES_JS)
        except PlaywrightError:  # between two renders
            names = None
        if names == wanted:
            return
        assert time.monotonic() < deadline, f"wanted {wanted} listed within {WAIT_S} s, saw {names}"
        page.wait_for_timeout(300)


def test_the_url_carries_the_project_the_switcher_changes_it_and_a_copied_url_opens_it(dashboard, browser):
    url, ids = dashboard
    first = browser.new_page(viewport={"width": 1500, "height": 1000})
    second = browser.new_page(viewport={"width": 1500, "height": 1000})
    try:
        first.goto(url)
        first.wait_for_url(lambda u: _project(u) == ["default"], timeout=WAIT_S * 1000)
        _wait_listed(first, ["home-run"])
        settled(first)
        click_still(first, first.locator(".st-key-project-switch input"))
        first.get_by_role("listbox").get_by_role("option", name="side", exact=True).click()
        first.wait_for_url(lambda u: _project(u) == ["side"], timeout=WAIT_S * 1000)
        _wait_listed(first, ["side-run"])
        settled(first)
        first.get_by_role("link", name="Sweeps").click()  # another page: the same project
        first.wait_for_url(lambda u: "/sweep" in u and _project(u) == ["side"], timeout=WAIT_S * 1000)
        second.goto(url + "/?project=side")  # a copied link, in a fresh session
        _wait_listed(second, ["side-run"])
        second.goto(f"{url}/run?id={ids['home-run']}")  # a run of the other project: its project opens
        second.get_by_role("heading", name="home-run").wait_for(timeout=WAIT_S * 1000)
        second.wait_for_url(lambda u: _project(u) == ["default"], timeout=WAIT_S * 1000)
    finally:
        first.close()
        second.close()
