"""A user's whole path through the dashboard, in a real browser against the real stack: configure a
digits run in the form, launch it, watch the loss chart grow, cancel it, clone it with another learning
rate and fewer epochs, launch, see the clone finish, download its ONNX file (and run it with
onnxruntime), export it again, compare the two.

Nothing here depends on how fast the machine trains: the watched run is far too long to end by itself
(10,000 epochs, no early stopping) and ends when the test cancels it; every other step waits for what
the user would see, with a generous bound."""

from __future__ import annotations

import re
import time
from pathlib import Path

import numpy as np
import pytest
from conftest import click_still, settled
from playwright.sync_api import Error as PlaywrightError
from playwright.sync_api import expect

FINAL = ("completed", "early stopped", "failed", "diverged", "cancelled")
pytestmark = pytest.mark.timeout(420)


def widget(page, key: str):
    return page.locator(f".st-key-{key.replace('.', '-')}")


def set_number(page, key: str, value) -> None:
    box = widget(page, key).locator("input")
    box.fill(str(value))
    box.press("Tab")


def set_formats(page, formats: list[str]) -> None:
    box = widget(page, "nr.f.export.formats").locator("input")
    click_still(page, box)  # far down the form: a late scroll would close the list it opens
    for _ in range(4):
        box.press("Backspace")
    for fmt in formats:
        box.fill(fmt)
        box.press("Enter")
    page.keyboard.press("Escape")


POINTS_JS = """([chart, trace]) => {
    for (const gd of document.querySelectorAll('.js-plotly-plot')) {
        const title = ((gd.layout && gd.layout.title && gd.layout.title.text) || '').replace(/<[^>]+>/g, '');
        if (title !== chart) continue;
        // _fullData: decoded arrays (gd.data holds numpy arrays as base64)
        const t = (gd._fullData || []).find(d => d.name === trace);
        if (t && t.x.length) {
            let last = -Infinity;
            for (const v of t.x) last = Math.max(last, Number(v));
            return [t.x.length, last];
        }
    }
    return [0, 0]; }"""


def _trace(page, chart: str, trace: str) -> tuple[int, float]:
    """(points, largest x) of a trace of a Plotly chart in the browser right now (live charts live in
    their own component frame, the others in the page); (0, 0) while it is not drawn."""
    for frame in page.frames:
        try:
            n, last = frame.evaluate(POINTS_JS, [chart, trace])
        except PlaywrightError:  # a frame that navigated or closed meanwhile
            continue
        if n:
            return n, last
    return 0, 0


def points(page, chart: str, trace: str) -> int:
    """How many points a trace holds in the browser right now."""
    return _trace(page, chart, trace)[0]


def last_step(page, chart: str, trace: str) -> float:
    """The newest step a trace shows (x axis by step). Unlike the number of points it only grows while
    a run trains: a live chart re-downsamples its series when it gets long."""
    return _trace(page, chart, trace)[1]


def wait_until(what: str, condition, timeout_s: float, page) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, f"{what}: not seen within {timeout_s:.0f} s (status {status(page)!r})"
        page.wait_for_timeout(300)


def status(page) -> str:
    heads = page.locator("[data-testid='stMarkdown'] h4").all_inner_texts()
    return " ".join(heads).strip()


def wait_status(page, wanted: tuple[str, ...], timeout_s: float) -> str:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        s = status(page)
        if any(w in s for w in wanted):
            return s
        page.wait_for_timeout(500)
    raise AssertionError(f"status stayed {status(page)!r}, wanted one of {wanted}")


def shot(page, shots: Path, name: str) -> None:
    page.wait_for_timeout(800)
    page.screenshot(path=str(shots / name), full_page=True)


def launch_from_form(page) -> str:
    page.get_by_role("button", name="Launch run").click()
    page.wait_for_url(re.compile(r".*/run\?id=\w+"), timeout=60_000)
    return page.url.split("id=")[1].split("&")[0]


def fill_digits_form(page) -> None:
    widget(page, "nr.f.name").locator("input").fill("e2e-digits")
    set_number(page, "nr.f.data.image_size", 16)
    # Far too long to end by itself on any machine (1.8 million steps): the test cancels it.
    set_number(page, "nr.f.train.epochs", 10_000)
    set_number(page, "nr.f.train.batch_size", 8)
    set_number(page, "nr.f.train.log_every", 2)
    early = widget(page, "nr.f.train.early_stopping.enabled")
    if early.get_by_role("checkbox").is_checked():
        early.locator("label").first.click()
    expect(early.get_by_role("checkbox")).not_to_be_checked(timeout=60_000)
    set_formats(page, ["onnx"])


def watch_it_grow(page, shots: Path) -> None:
    """While the run trains, the loss chart gets new points without reloading the page, and its first
    epoch's validation accuracy appears. The run cannot finish meanwhile: it only ends when cancelled."""
    wait_status(page, ("running",) + FINAL, 120)
    wait_until("a training loss drawn", lambda: last_step(page, "Loss", "train/loss") > 0, 120, page)
    assert "running" in status(page), status(page)
    page.screenshot(path=str(shots / "03-run-live.png"), full_page=True)
    first = last_step(page, "Loss", "train/loss")
    wait_until(
        f"the loss chart growing past step {first:.0f}",
        lambda: last_step(page, "Loss", "train/loss") > first,
        120,
        page,
    )
    wait_until("the first epoch's val/acc drawn", lambda: points(page, "Accuracy", "val/acc") > 0, 180, page)
    assert "running" in status(page), status(page)  # all of it seen while the run trains


IDLE_JS = """() => {
    const app = document.querySelector("[data-testid='stApp']");
    return app && app.getAttribute("data-test-script-state") === "notRunning"
        && !document.querySelector("[data-stale='true']"); }"""


def cancel_it(page) -> None:
    settled(page)  # between two of the live page's refreshes: the button is not being redrawn
    page.get_by_role("button", name="Cancel", exact=True).click()
    final = wait_status(page, FINAL, 180)
    assert "cancelled" in final, final
    # The page reruns once the run has ended (its buttons change): act on the page it draws then.
    page.wait_for_function(IDLE_JS, timeout=60_000)


def download_onnx(page, tmp_path: Path) -> Path:
    page.get_by_role("tab", name="Artifacts").click()
    row = page.locator("[data-testid='stHorizontalBlock']", has_text="ONNX (.onnx)").last
    with page.expect_download(timeout=60_000) as dl:
        row.get_by_role("link", name="Download", exact=True).click()  # streamed by the download route
    path = tmp_path / "model.onnx"
    dl.value.save_as(path)
    return path


def export_now(page) -> None:
    """'Export now' re-exports the finished run in a subprocess; the new TorchScript file is listed."""
    box = widget(page, "run.export_fmt." + page.url.split("id=")[1].split("&")[0]).locator("input")  # (&project=)
    click_still(page, box)
    box.fill("torchscript")  # next to the ONNX export already there
    box.press("Enter")
    page.keyboard.press("Escape")
    settled(page)  # the rerun of the format change drawn
    page.get_by_role("button", name="Export now").click()
    page.get_by_text("Export verified").wait_for(timeout=180_000)
    page.get_by_text("TorchScript (.ts)").wait_for()


def check_onnx_runs(path: Path) -> None:
    import onnxruntime as ort

    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    inp = session.get_inputs()[0]
    x = np.random.default_rng(0).standard_normal((2, 1, 16, 16)).astype(np.float32)
    (logits,) = session.run(None, {inp.name: x})
    assert logits.shape == (2, 10) and np.isfinite(logits).all()


def test_configure_launch_watch_clone_compare_download(stack, browser, shots, tmp_path):
    page = browser.new_page(viewport={"width": 1400, "height": 1800}, accept_downloads=True)
    page.set_default_timeout(60_000)
    try:
        user_path(page, stack, shots, tmp_path)
    except BaseException:
        page.screenshot(path=str(shots / "zz-failure.png"), full_page=True)
        raise


def user_path(page, stack, shots: Path, tmp_path: Path) -> None:
    page.goto(stack["url"])
    page.get_by_text("No runs yet").wait_for()
    shot(page, shots, "01-runs-empty.png")

    page.goto(stack["url"] + "/new")
    page.get_by_role("button", name="Launch run").wait_for()
    settled(page)  # every widget drawn (the page's button comes before them), nothing moving
    fill_digits_form(page)
    shot(page, shots, "02-new-run-form.png")
    first = launch_from_form(page)
    page.get_by_role("heading", name="e2e-digits").wait_for()
    watch_it_grow(page, shots)
    cancel_it(page)

    page.get_by_role("button", name="Clone").click()
    page.get_by_text("Form filled from clone of e2e-digits").wait_for()
    settled(page)
    widget(page, "nr.f.name").locator("input").fill("e2e-digits-lr3e-3")
    set_number(page, "nr.f.optim.lr", 0.003)
    set_number(page, "nr.f.train.epochs", 3)  # this one runs to its end, and exports its ONNX file
    second = launch_from_form(page)
    assert second != first
    page.get_by_role("heading", name="e2e-digits-lr3e-3").wait_for()
    final = wait_status(page, FINAL, 300)
    assert "completed" in final, final + "\n" + stack["log"].read_text()[-3000:]
    page.get_by_role("tab", name="Charts").click()
    shot(page, shots, "04-run-finished.png")
    onnx = download_onnx(page, tmp_path)
    check_onnx_runs(onnx)
    export_now(page)
    shot(page, shots, "05-run-artifacts.png")

    page.goto(stack["url"])
    page.get_by_text("2 run(s) match").wait_for()
    shot(page, shots, "06-runs.png")
    page.goto(f"{stack['url']}/compare?ids={first},{second}")
    page.get_by_text("Curves as CSV").first.wait_for()  # the button (its help tooltip holds the words too)
    wait_until(
        "both runs' val/acc on the Compare page",
        lambda: points(page, "val/acc", "e2e-digits") > 0 and points(page, "val/acc", "e2e-digits-lr3e-3") > 0,
        120,
        page,
    )
    shot(page, shots, "07-compare.png")
    page.get_by_role("tab", name="Hyperparameters").click()
    page.locator(".js-plotly-plot .parcoords").first.wait_for(state="attached")
    shot(page, shots, "08-compare-hyperparameters.png")
    page.get_by_role("tab", name="Spec diff").click()
    page.get_by_text("Differences only").wait_for()  # the table itself is a canvas: its text is not in the DOM
    shot(page, shots, "09-compare-spec-diff.png")

    page.goto(stack["url"] + "/workers")
    # the grid draws on a canvas; its accessible (hidden) cells say whether the worker is alive
    page.locator("td[role='gridcell']", has_text="alive").first.wait_for(state="attached")
    shot(page, shots, "10-workers.png")
    page.goto(stack["url"] + "/datasets")
    page.get_by_text("Built in").wait_for()
    shot(page, shots, "11-datasets.png")
