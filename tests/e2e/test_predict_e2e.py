"""Predicting in a real browser: on `torchdeck ui` (local mode, a database seeded beforehand with a finished digits
run and its real, verified ONNX export), driven by Chromium, the user opens the run's Predict tab and drops two
images (a digit, and a transparent colour image); each gets the class a user's own onnxruntime script computes
with the bundle's preprocessing, with its probability and time, and the image the model saw.

Nothing waits a fixed time: each step waits for what the user would see, with a generous bound."""

from __future__ import annotations

import io
import re
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
from conftest import SHOTS, serve_ui, settled
from playwright.sync_api import expect

from db import repo
from db.artifacts import local_run_root
from db.engine import make_engine
from tests._onnx_digits import digit_png, reference, register, train_and_export

SPEC = {"name": "predicted", "data": {"name": "digits", "image_size": 8}, "train": {"epochs": 1}}
WAIT_MS = 90_000  # for what the user would see: generous, a busy machine takes longer
NAME = "predicted"
pytestmark = pytest.mark.timeout(400)


def _colour_png() -> bytes:
    """A 40×30 RGBA image, half transparent: converted as training converts it (on white, then grayscale)."""
    from PIL import Image

    rgba = np.random.default_rng(1).integers(0, 256, (30, 40, 4), dtype=np.uint8)
    buf = io.BytesIO()
    Image.fromarray(rgba, mode="RGBA").save(buf, format="PNG")
    return buf.getvalue()


@pytest.fixture(scope="module")
def dashboard(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict]:
    out = tmp_path_factory.mktemp("digits_onnx")
    report = train_and_export(out)

    def seed(url: str) -> str:
        home = Path(url.removeprefix("sqlite:///")).parent
        engine = make_engine(url)
        try:
            r = repo.create_run(engine, SPEC, name=NAME, owner="local")
            repo.claim_run(engine, r.id, "w1", device="cpu")
            repo.finish_run(engine, r.id, "completed", summary={"status": "completed"})
            register(engine, r.id, local_run_root(str(home / "artifacts")), report, out)
            return r.id
        finally:
            engine.dispose()

    with serve_ui("torchdeck-predict-", seed) as (url, _, run_id):
        yield {"url": url, "run_id": run_id, "model": out / "model.onnx"}


def test_dropped_images_get_the_class_onnxruntime_computes(dashboard, browser):
    images = {"digit.png": digit_png(13), "colour.png": _colour_png()}
    want = {name: reference(dashboard["model"], data)[0] for name, data in images.items()}
    page = browser.new_page(viewport={"width": 1400, "height": 1000})
    try:
        page.goto(f"{dashboard['url']}/run?id={dashboard['run_id']}")
        page.get_by_role("heading", name=NAME).wait_for(timeout=WAIT_MS)
        settled(page)  # the page's script run drawn: a click during a rerun can land on a tab being redrawn
        page.get_by_role("tab", name="Predict").click()
        uploader = page.get_by_test_id("stFileUploader").locator("input[type=file]")
        uploader.wait_for(state="attached", timeout=WAIT_MS)
        settled(page)
        uploader.set_input_files(
            [{"name": name, "mimeType": "image/png", "buffer": data} for name, data in images.items()]
        )
        for name, cls in want.items():
            line = page.get_by_test_id("stMarkdownContainer").filter(has_text=re.compile(rf"^{re.escape(name)} →"))
            expect(line).to_be_visible(timeout=WAIT_MS)
            shown = re.match(rf"{re.escape(name)} → (\S+) ([\d.]+)% · ([\d.]+) ms", line.inner_text())
            assert shown, line.inner_text()
            assert shown[1] == cls and 0 < float(shown[2]) <= 100 and float(shown[3]) >= 0
        expect(page.get_by_text("what the model saw")).to_have_count(2, timeout=WAIT_MS)
        SHOTS.mkdir(parents=True, exist_ok=True)
        page.screenshot(path=str(SHOTS / "predict-tab.png"), full_page=True)
    finally:
        page.close()
