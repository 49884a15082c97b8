"""A team-mode dashboard (`torchdeck ui`, TORCHDECK_MODE=team) and the real `mlflow` client: a script with its
person's API token in MLFLOW_TRACKING_TOKEN logs a run that is that person's; a wrong token, and a revoked one, are
refused with MLflow's UNAUTHENTICATED, which the client raises as its own exception; nothing is written for them."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from collections.abc import Iterator

import pytest
from streamlit_session import ISSUER, WAIT_S, team_env

from db import repo, tokens
from db.engine import make_engine
from tests.e2e.conftest import ROOT, serve_ui

pytestmark = pytest.mark.timeout(600)
SECRET = "a-long-random-cookie-secret-for-tracking-tests"
ANA = f"{ISSUER}#ana"

LOG = """
import json
import mlflow
from mlflow.exceptions import MlflowException

try:
    with mlflow.start_run(run_name="ana-script") as run:
        mlflow.log_metric("loss", 0.5, step=0)
    print(json.dumps({"run_id": run.info.run_id}))
except MlflowException as e:
    print(json.dumps({"error": e.error_code, "message": e.message}))
"""


def seed(db_url: str) -> dict[str, str]:
    engine = make_engine(db_url)
    try:
        kept = tokens.create_token(engine, person=ANA, person_name="Ana", email=None, groups=[], label="laptop")[1]
        revoked, secret = tokens.create_token(engine, person=ANA, person_name="Ana", email=None, groups=[], label="old")
        tokens.revoke(engine, revoked.id, ANA)
        return {"token": kept, "revoked": secret}
    finally:
        engine.dispose()


@pytest.fixture(scope="module")
def dashboard() -> Iterator[dict]:
    with serve_ui("torchdeck-tracking-team-", seed, **team_env(SECRET)) as (url, db_url, seeded):
        engine = make_engine(db_url)
        try:
            yield {"url": url, "engine": engine, **seeded}
        finally:
            engine.dispose()


def log_with(url: str, token: str) -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("TORCHDECK_", "MLFLOW_"))}
    env.update(MLFLOW_TRACKING_URI=f"{url}/_torchdeck/mlflow", MLFLOW_TRACKING_TOKEN=token)
    done = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(LOG)],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=WAIT_S * 2,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_a_token_logs_as_its_person_and_a_wrong_or_revoked_one_is_refused(dashboard) -> None:
    said = log_with(dashboard["url"], dashboard["token"])
    run = repo.get_run(dashboard["engine"], said["run_id"])
    assert (run.owner, run.name, run.status, run.metrics["loss"].count) == (ANA, "ana-script", "completed", 1)
    for token in ("tdk_0123456789abcdef_not-a-real-secret", dashboard["revoked"]):
        refused = log_with(dashboard["url"], token)
        assert refused["error"] == "UNAUTHENTICATED" and "API token" in refused["message"]
    assert repo.list_runs(dashboard["engine"], source="mlflow").total == 1
