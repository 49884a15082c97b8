"""The New run form's progressive fields, in a real browser: on `torchdeck ui` (local mode, an empty database),
driven by Chromium. Each choice above the form (optimizer, learning-rate schedule, gradient clipping) brings its own
fields into their section at once, and sends those that do nothing with it to the collapsed "Not used with …"
section at the end, where they keep their values.

Nothing waits a fixed time: each step waits for what the user would see, with a generous bound."""

from __future__ import annotations

import re
from collections.abc import Iterator

import pytest
from conftest import SHOTS, click_still, serve_ui, settled
from playwright.sync_api import expect

WAIT_MS = 90_000  # for what the user would see: generous, a busy machine takes longer
pytestmark = pytest.mark.timeout(300)


@pytest.fixture(scope="module")
def dashboard() -> Iterator[str]:
    with serve_ui("torchdeck-form-fields-", lambda _db_url: None) as (url, _db_url, _):
        yield url


@pytest.fixture
def page(dashboard, browser):
    page = browser.new_page(viewport={"width": 1500, "height": 1400})
    page.set_default_timeout(WAIT_MS)
    page.goto(f"{dashboard}/new")
    page.get_by_role("button", name="Launch run").wait_for()
    settled(page)  # every widget drawn (the page's button comes before them), nothing moving
    yield page
    page.close()


def label(page, text: str):
    """A field's label as the user reads it above its widget."""
    return page.get_by_test_id("stWidgetLabel").get_by_text(text, exact=True)


def choose(page, field: str, option: str) -> None:
    """Pick `option` in the choice above the form whose key is `nr.f.<field>`. Its list opens on a settled page, its
    input in view and still: a rerun or a scroll (the one bringing the input into view) closes an open list."""
    box = page.locator(f".st-key-nr-f-{field.replace('.', '-')}")
    click_still(page, box.locator("input"))
    page.get_by_role("listbox").get_by_role("option", name=option, exact=True).click()
    expect(box.locator("input")).to_have_value(option, timeout=WAIT_MS)


def not_used(page):
    """The collapsed section at the end holding the fields that do nothing with the choices made."""
    return page.get_by_test_id("stExpander").filter(has=page.get_by_text(re.compile(r"^Not used with ")))


# While the page redraws after a choice, a field that moves can be in the page twice for a moment (where it was, and
# where it goes): what counts is whether the user can see it once the page has settled.
def shown(page, *texts: str) -> None:
    for text in texts:
        expect(label(page, text).filter(visible=True).first).to_be_visible(timeout=WAIT_MS)


def hidden(page, *texts: str) -> None:
    for text in texts:
        expect(label(page, text).filter(visible=True)).to_have_count(0, timeout=WAIT_MS)


def test_sgd_shows_momentum_and_nesterov_which_adam_leaves_under_not_used(page):
    """Broken, an Adam user would be asked for a momentum that does nothing, or an SGD user never offered it."""
    shown(page, "Adam betas (1)", "Adam betas (2)")  # Adam, the default
    hidden(page, "Momentum", "Nesterov momentum")
    section = not_used(page)
    expect(section).to_contain_text("adam", timeout=WAIT_MS)
    section.locator("summary").click()  # there, with their values, once the user opens the section
    expect(section.get_by_test_id("stWidgetLabel").get_by_text("Momentum", exact=True)).to_be_visible()
    expect(section.get_by_test_id("stWidgetLabel").get_by_text("Nesterov momentum", exact=True)).to_be_visible()
    choose(page, "optim.name", "sgd")
    expect(not_used(page)).to_contain_text("sgd", timeout=WAIT_MS)
    for text in ("Momentum", "Nesterov momentum"):
        expect(not_used(page).get_by_text(text, exact=True)).to_have_count(0, timeout=WAIT_MS)
        shown(page, text)  # in the Optimizer section now
    expect(not_used(page).get_by_test_id("stWidgetLabel").get_by_text("Adam betas (1)", exact=True)).to_have_count(1)
    SHOTS.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=str(SHOTS / "form-fields-sgd.png"), full_page=True)


def test_a_schedule_brings_its_own_fields(page):
    """Broken, a step schedule would hide how often it decays, or cosine its lowest learning rate."""
    shown(page, "Warmup (epochs)")  # no schedule, the default: only a warmup
    hidden(page, "Decay every (epochs)", "Decay factor", "Lowest learning rate", "Share of steps spent warming up")
    choose(page, "schedule.name", "step")
    shown(page, "Decay every (epochs)", "Decay factor", "Warmup (epochs)")
    hidden(page, "Lowest learning rate", "Decay at epochs")
    choose(page, "schedule.name", "cosine")
    shown(page, "Lowest learning rate", "Warmup (epochs)")
    hidden(page, "Decay every (epochs)", "Decay factor")
    choose(page, "schedule.name", "onecycle")
    shown(page, "Share of steps spent warming up")
    hidden(page, "Warmup (epochs)", "Lowest learning rate")


def test_clipping_turned_on_shows_its_threshold(page):
    """Broken, a user who turns clipping on would find no threshold to set, or one shown while it is off."""
    shown(page, "Max norm")  # clipping by norm, the default
    choose(page, "train.grad_clip.mode", "none")
    hidden(page, "Max norm")
    expect(not_used(page)).to_contain_text("no clipping", timeout=WAIT_MS)
    choose(page, "train.grad_clip.mode", "value")
    shown(page, "Max norm")
    expect(not_used(page)).not_to_contain_text("no clipping", timeout=WAIT_MS)
