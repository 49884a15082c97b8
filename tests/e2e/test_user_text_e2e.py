"""A run's name and tags in a real browser: a run named with the Markdown for an image on a server of this
test's own, with tags full of backticks, and another named with Plotly's HTML. The Run page shows the name
as its heading's text and each tag as one code span; the Compare page's legend shows both names as they
are; the browser never asks the test's server for the image. The dashboard is `torchdeck ui` (local mode)
on a database seeded beforehand, driven by Chromium.

Nothing waits a fixed time: each step waits for what a reader would see (the heading, the legend, the
page at rest), with a generous bound. Then a request the page itself sends to the test's server, answered
before the check, shows that the server's record is up to date."""

from __future__ import annotations

import http.server
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
from conftest import SHOTS, serve_ui
from playwright.sync_api import expect

from db import repo
from db.engine import make_engine
from db.types import MetricPoint

ROOT = Path(__file__).resolve().parents[2]
TAGS = ("`tick`", "a``b ` c", "**bold**")
SPEC = {"name": "seeded", "data": {"name": "digits", "image_size": 16}, "train": {"epochs": 1}}
JOINER = "\u2060"  # app.present.text.WORD_JOINER: shows nothing, so what a reader sees is the text without it
IDLE_JS = """() => {
    const app = document.querySelector("[data-testid='stApp']");
    return app && app.getAttribute("data-test-script-state") === "notRunning"
        && !document.querySelector("[data-stale='true']"); }"""
WAIT_MS = 60_000  # for what a reader would see: generous, a busy machine takes longer
pytestmark = pytest.mark.timeout(300)


class _Recorder(http.server.BaseHTTPRequestHandler):
    """Records every path asked for; answers each with a tiny PNG."""

    PNG = bytes.fromhex(
        "89504e470d0a1a0a0000000d4948445200000001000000010806000000"
        "1f15c4890000000d49444154789c63000100000500010d0a2db40000000049454e44ae426082"
    )

    def do_GET(self):  # noqa: N802 - the http.server protocol
        self.server.paths.append(self.path.split("?")[0])
        self.send_response(200)
        self.send_header("Content-Type", "image/png")
        self.send_header("Access-Control-Allow-Origin", "*")
        self.end_headers()
        self.wfile.write(self.PNG)

    def log_message(self, *args):
        pass


@pytest.fixture(scope="module")
def image_server() -> Iterator[http.server.ThreadingHTTPServer]:
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Recorder)
    server.paths = []
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield server
    server.shutdown()
    server.server_close()


def _seed(url: str, name: str, tags: tuple[str, ...] = ()) -> str:
    engine = make_engine(url)
    try:
        r = repo.create_run(engine, SPEC, name=name, owner="local", tags=list(tags))
        repo.claim_run(engine, r.id, "w1", device="cpu")
        repo.append_metrics(engine, r.id, [MetricPoint("train/loss", s, 2.0 / s, 1) for s in range(1, 11)])
        repo.finish_run(engine, r.id, "completed", summary={"status": "completed"})
        return r.id
    finally:
        engine.dispose()


@pytest.fixture(scope="module")
def dashboard(image_server) -> Iterator[dict]:
    image = f"http://127.0.0.1:{image_server.server_port}/p.png"
    names = {"image": f"![x]({image})", "html": "<b>bold</b> & <i>it</i>"}

    def seed(db_url: str) -> dict:
        return {"image": _seed(db_url, names["image"], TAGS), "html": _seed(db_url, names["html"])}

    with serve_ui("torchdeck-text-", seed) as (url, _, ids):
        yield {"url": url, "names": names, "ids": ids}


def _images_pointing_at(page, port: int) -> list[str]:
    found = []
    for frame in page.frames:
        found += frame.evaluate(
            "port => [...document.images].map(i => i.src).filter(s => s.includes(':' + port + '/'))", port
        )
    return found


def _no_request_for_the_image(page, server) -> None:
    """The page at rest, then a request from the page itself to the server, answered: anything the page
    asked of that server before has arrived by then."""
    page.wait_for_function(IDLE_JS, timeout=WAIT_MS)
    probe = f"/probe-{len(server.paths)}"
    page.evaluate(
        "url => fetch(url, {mode: 'no-cors'}).then(() => true)", f"http://127.0.0.1:{server.server_port}{probe}"
    )
    assert probe in server.paths, server.paths
    assert "/p.png" not in server.paths, server.paths
    assert _images_pointing_at(page, server.server_port) == []


def test_run_page_shows_a_markdown_name_and_backtick_tags_as_text(dashboard, browser, image_server):
    page = browser.new_page(viewport={"width": 1400, "height": 1000})
    page.set_default_timeout(WAIT_MS)
    try:
        page.goto(f"{dashboard['url']}/run?id={dashboard['ids']['image']}")
        caption = page.locator("[data-testid='stCaptionContainer']").filter(has_text="created")
        expect(caption).to_have_count(1, timeout=WAIT_MS)  # the run's header is drawn
        _no_request_for_the_image(page, image_server)
        heading = page.locator("h1").first
        assert heading.inner_text().replace(JOINER, "").strip() == dashboard["names"]["image"]
        codes = [c.replace(JOINER, "") for c in caption.locator("code").all_inner_texts()]
        assert sorted(codes[-len(TAGS) :]) == sorted(TAGS), codes  # each tag one code span, backticks and all
        page.screenshot(path=str(_shots() / "text-01-run.png"), full_page=True)
    finally:
        page.close()


def test_compare_legend_shows_both_names_as_they_are(dashboard, browser, image_server):
    page = browser.new_page(viewport={"width": 1400, "height": 1400})
    page.set_default_timeout(WAIT_MS)
    ids, names = dashboard["ids"], dashboard["names"]
    try:
        page.goto(f"{dashboard['url']}/compare?ids={ids['image']},{ids['html']}")
        legend = page.locator(".js-plotly-plot .legendtext")
        for name in names.values():
            expect(legend.filter(has_text=name).first).to_be_attached(timeout=WAIT_MS)
        shown = {t.strip() for t in legend.all_text_contents()}
        assert set(names.values()) <= shown, shown
        _no_request_for_the_image(page, image_server)
        page.screenshot(path=str(_shots() / "text-02-compare.png"), full_page=True)
    finally:
        page.close()


def _shots() -> Path:
    SHOTS.mkdir(parents=True, exist_ok=True)
    return SHOTS
