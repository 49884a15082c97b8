"""A person's own script logs a run through the real `mlflow` client into `torchdeck ui` (local mode), and Chromium
shows it: the link the client prints when the run ends opens torchdeck's page of that run, whose Parameters tab
shows what the script logged and whose Artifacts tab lists its file; the Runs page of the experiment's project lists
it. Nothing waits a fixed time: each step waits for what the user would see, with a generous bound."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator

import pytest
from conftest import ROOT, serve_ui
from playwright.sync_api import Error as PlaywrightError
from test_filter_url_e2e import NAMES_JS  # the Runs table's names, read from its accessible cells

WAIT_S = 90
pytestmark = pytest.mark.timeout(300)

SCRIPT = """
import json, os, tempfile
import mlflow

mlflow.set_experiment("Digits Lab")
with mlflow.start_run(run_name="my-script") as run:
    mlflow.log_params({"lr": 0.01, "optimizer": "adam"})
    for step in range(50):
        mlflow.log_metric("loss", 1.0 / (step + 1), step=step)
    path = os.path.join(tempfile.mkdtemp(), "confusion.json")
    with open(path, "w") as f:
        f.write("{}")
    mlflow.log_artifact(path, artifact_path="eval")
print(json.dumps({"run_id": run.info.run_id}))
"""


@pytest.fixture(scope="module")
def logged() -> Iterator[tuple[str, str]]:
    with serve_ui("torchdeck-tracking-e2e-", lambda db_url: None) as (url, _db_url, _):
        env = {k: v for k, v in os.environ.items() if not k.startswith(("TORCHDECK_", "MLFLOW_"))}
        env["MLFLOW_TRACKING_URI"] = f"{url}/_torchdeck/mlflow"
        done = subprocess.run(
            [sys.executable, "-c", SCRIPT], cwd=ROOT, env=env, capture_output=True, text=True, timeout=WAIT_S * 2
        )
        assert done.returncode == 0, done.stderr[-3000:]
        assert f"{url}/_torchdeck/mlflow/#/experiments/digits-lab/runs/" in done.stdout + done.stderr
        yield url, json.loads(done.stdout.strip().splitlines()[-1])["run_id"]


CELLS_JS = "() => [...document.querySelectorAll('table td')].map(c => c.textContent)"  # tables' cells, as read aloud


def _wait(page, script: str, done):
    """What `script` evaluates to in the page, once `done` says it is what the user would see (bounded)."""
    deadline = time.monotonic() + WAIT_S
    while True:
        try:
            seen = page.evaluate(script)
        except PlaywrightError:  # between two renders
            seen = None
        if seen is not None and done(seen):
            return seen
        assert time.monotonic() < deadline, f"never saw what was wanted; last saw {seen}"
        page.wait_for_timeout(300)


def _wait_cells(page, wanted: set[str]) -> None:
    _wait(page, CELLS_JS, lambda cells: wanted <= set(cells))


def test_the_clients_link_opens_the_run_with_its_params_and_file_and_runs_lists_it(logged, browser) -> None:
    url, run_id = logged
    page = browser.new_page(viewport={"width": 1500, "height": 1000})
    try:
        page.goto(f"{url}/_torchdeck/mlflow/#/experiments/digits-lab/runs/{run_id}")  # as the client printed it
        page.get_by_role("heading", name="my-script").wait_for(timeout=WAIT_S * 1000)
        assert f"/run?id={run_id}" in page.url
        page.get_by_role("tab", name="Parameters").click()
        _wait_cells(page, {"optimizer", "adam", "lr", "0.01"})
        page.get_by_role("tab", name="Artifacts").click()
        page.get_by_text("eval/confusion.json").first.wait_for(timeout=WAIT_S * 1000)
        page.goto(f"{url}/_torchdeck/mlflow/#/experiments/digits-lab")
        assert _wait(page, NAMES_JS, lambda names: names == ["my-script"]) == ["my-script"]
        assert "project=digits-lab" in page.url
    finally:
        page.close()
