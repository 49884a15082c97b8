"""People's own scripts log into a real dashboard (`torchdeck ui`, local mode) through the real `mlflow` client
(app/tracking/): what a script logs is what torchdeck's pages, series and downloads show; a killed script's run
becomes lost; a batch over MLflow's bounds and an endpoint torchdeck does not answer get MLflow's error shape, which
the client turns into its own exception; a retried batch never doubles a point.

Each script runs in its own Python process, as a person's script would, with MLFLOW_TRACKING_URI pointing at the
dashboard."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator

import pytest
from streamlit_session import WAIT_S, get, port_of, run_page, stream

from db import external, repo
from db.engine import make_engine
from tests.e2e.conftest import ROOT, serve_ui
from worker.reaper import reap
from worker.settings import WorkerSettings

pytestmark = pytest.mark.timeout(600)

LOG_A_RUN = """
import json, os, sys, tempfile, time
import mlflow
from mlflow import MlflowClient
from mlflow.entities import Metric

mlflow.set_experiment("Digits Lab")
with mlflow.start_run(run_name="my-script") as run:
    mlflow.log_params({"lr": 0.01, "optimizer": "adam"})
    mlflow.set_tag("stage", "baseline")
    now = int(time.time() * 1000)
    points = [Metric("loss", 1.0 / (i + 1), now + i, i) for i in range(10_000)]
    MlflowClient().log_batch(run.info.run_id, metrics=points)
    folder = tempfile.mkdtemp()
    path = os.path.join(folder, "confusion.json")
    with open(path, "w") as f:
        f.write(json.dumps({"cat": [9, 1], "dog": [2, 8]}))
    mlflow.log_artifact(path, artifact_path="eval")
    listed = [f.path for f in MlflowClient().list_artifacts(run.info.run_id, "eval")]
print(json.dumps({"run_id": run.info.run_id, "listed": listed}))
"""


def script(url: str, code: str, **env: str) -> subprocess.Popen:
    environ = {k: v for k, v in os.environ.items() if not k.startswith(("TORCHDECK_", "MLFLOW_"))}
    environ.update(MLFLOW_TRACKING_URI=f"{url}/_torchdeck/mlflow", PYTHONUNBUFFERED="1", **env)
    return subprocess.Popen(
        [sys.executable, "-c", textwrap.dedent(code)],
        cwd=ROOT,
        env=environ,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def finished(proc: subprocess.Popen) -> dict:
    out, err = proc.communicate(timeout=WAIT_S * 2)
    assert proc.returncode == 0, err[-3000:]
    return json.loads(out.strip().splitlines()[-1])


@pytest.fixture(scope="module")
def dashboard() -> Iterator[dict]:
    with serve_ui("torchdeck-tracking-", lambda db_url: None) as (url, db_url, _):
        engine = make_engine(db_url)
        try:
            yield {"url": url, "port": port_of(url), "engine": engine}
        finally:
            engine.dispose()


def test_a_script_logs_params_10000_points_a_tag_and_a_file_and_torchdeck_shows_exactly_that(dashboard) -> None:
    engine = dashboard["engine"]
    said = finished(script(dashboard["url"], LOG_A_RUN))
    assert said["listed"] == ["eval/confusion.json"]
    run = repo.get_run(engine, said["run_id"])
    assert (run.name, run.status, run.project, run.source) == ("my-script", "completed", "digits-lab", "mlflow")
    assert run.spec["params"] == {"lr": "0.01", "optimizer": "adam"}
    assert run.spec["tags"]["stage"] == "baseline" and run.spec["tags"]["mlflow.source.type"] == "LOCAL"
    points = external.history(engine, run.id, "loss")
    assert [(p.step, p.value) for p in points] == [(i, 1.0 / (i + 1)) for i in range(10_000)]
    (file,) = repo.list_artifacts(engine, run.id, kind="file")
    assert file.meta["path"] == "eval/confusion.json"
    got = get(dashboard["port"], f"/_torchdeck/download/{file.id}")
    assert got.status == 200 and json.loads(got.body) == {"cat": [9, 1], "dog": [2, 8]}
    with stream(dashboard["port"]) as ws:  # a session each: a page's own reruns end before the next page's run
        listed = b"".join(e.SerializeToString() for e in run_page(ws, "runs", "project=digits-lab"))
    with stream(dashboard["port"]) as ws:
        page = b"".join(e.SerializeToString() for e in run_page(ws, "run", f"id={run.id}&project=digits-lab"))
    assert b"my-script" in listed
    # the Run page's first tab: the script's line and its series (its other tabs: tests/e2e/test_tracking_e2e.py)
    assert b"logged by a script through the MLflow client" in page
    assert b'"title": "loss"' in page


def test_a_killed_scripts_run_is_lost_and_running_again_if_it_writes_again(dashboard) -> None:
    engine = dashboard["engine"]
    proc = script(
        dashboard["url"],
        """
        import mlflow, sys, time
        run = mlflow.start_run()
        mlflow.log_metric("loss", 1.0, step=0)
        print(run.info.run_id, flush=True)
        time.sleep(3600)
        """,
    )
    run_id = proc.stdout.readline().strip()
    assert repo.get_run(engine, run_id).status == "running"
    proc.send_signal(signal.SIGKILL)
    proc.wait(timeout=WAIT_S)
    settings = WorkerSettings(script_silent_after_s=0.5)
    deadline = time.monotonic() + WAIT_S
    while repo.get_run(engine, run_id).status != "lost":  # the reaper's round, as a worker runs it
        assert time.monotonic() < deadline, "the killed script's run never became lost"
        reap(engine, settings)
        time.sleep(0.2)
    events = repo.list_events(engine, run_id)
    assert any("its script wrote nothing" in e.message for e in events)
    finished(
        script(
            dashboard["url"],
            f"""
            import json
            from mlflow import MlflowClient
            MlflowClient().log_metric("{run_id}", "loss", 0.5, step=1)
            print(json.dumps({{}}))
            """,
        )
    )
    assert repo.get_run(engine, run_id).status == "running"


def test_over_the_bounds_and_unknown_endpoints_are_refused_in_mlflows_error_shape(dashboard) -> None:
    said = finished(
        script(
            dashboard["url"],
            """
            import json, time
            import mlflow
            from mlflow import MlflowClient
            from mlflow.entities import Metric
            from mlflow.exceptions import MlflowException
            from mlflow.tracking._tracking_service.utils import _get_store

            client = MlflowClient()
            run = client.create_run("0")
            now = int(time.time() * 1000)
            answers = {}
            try:  # the store's log_batch sends one request, as another client would
                _get_store().log_batch(run.info.run_id, [Metric("x", 1.0, now, i) for i in range(1001)], [], [])
            except MlflowException as e:
                answers["batch"] = [e.error_code, e.message]
            try:
                client.log_param(run.info.run_id, "note", "y" * 6001)
            except MlflowException as e:
                answers["param"] = [e.error_code, e.message]
            try:
                client.create_registered_model("digits")
            except MlflowException as e:
                answers["registry"] = [e.error_code, e.message]
            try:
                client.log_param(run.info.run_id, "lr", "0.1")
                client.log_param(run.info.run_id, "lr", "0.2")
            except MlflowException as e:
                answers["changed"] = [e.error_code, e.message]
            # a retried batch: sent twice, stored once
            batch = [Metric("y", float(i), now, i) for i in range(500)]
            client.log_batch(run.info.run_id, metrics=batch)
            client.log_batch(run.info.run_id, metrics=batch)
            answers["history"] = len(client.get_metric_history(run.info.run_id, "y"))
            answers["run_id"] = run.info.run_id
            print(json.dumps(answers))
            """,
        )
    )
    code, message = said["batch"]
    assert code == "INVALID_PARAMETER_VALUE" and "at most 1000 metrics" in message
    assert said["param"][0] == "INVALID_PARAMETER_VALUE" and "6001 characters" in said["param"][1]
    assert said["registry"][0] == "ENDPOINT_NOT_FOUND" and "registered-models/create" in said["registry"][1]
    assert said["changed"][0] == "INVALID_PARAMETER_VALUE" and "already '0.1'" in said["changed"][1]
    assert said["history"] == 500
    engine = dashboard["engine"]
    assert external.history(engine, said["run_id"], "x") == []  # the refused batch wrote nothing
    assert repo.get_run(engine, said["run_id"]).spec["params"] == {"lr": "0.1"}


LIGHTNING = """
import json
import torch
import pytorch_lightning as pl
from pytorch_lightning.loggers import MLFlowLogger
from torch.utils.data import DataLoader, TensorDataset


class Tiny(pl.LightningModule):
    def __init__(self, lr=0.05, hidden=8):
        super().__init__()
        self.save_hyperparameters()
        self.net = torch.nn.Sequential(torch.nn.Linear(4, hidden), torch.nn.ReLU(), torch.nn.Linear(hidden, 2))

    def training_step(self, batch, _):
        x, y = batch
        loss = torch.nn.functional.cross_entropy(self.net(x), y)
        self.log("train_loss", loss, on_step=True, on_epoch=True)
        return loss

    def validation_step(self, batch, _):
        x, y = batch
        self.log("val_acc", (self.net(x).argmax(1) == y).float().mean())

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=self.hparams.lr)


torch.manual_seed(0)
x = torch.randn(256, 4)
y = (x[:, 0] > 0).long()
data = DataLoader(TensorDataset(x, y), batch_size=32)
logger = MLFlowLogger(experiment_name="lightning-lab", run_name="tiny")
trainer = pl.Trainer(max_epochs=3, logger=logger, log_every_n_steps=2, enable_checkpointing=False,
                     enable_progress_bar=False, enable_model_summary=False, accelerator="cpu")
trainer.fit(Tiny(), data, data)
print(json.dumps({"run_id": logger.run_id}))
"""


def test_pytorch_lightnings_mlflow_logger_logs_a_tiny_training_into_torchdeck_unchanged(dashboard) -> None:
    engine = dashboard["engine"]
    said = finished(script(dashboard["url"], LIGHTNING, OMP_NUM_THREADS="1"))
    run = repo.get_run(engine, said["run_id"])
    assert (run.name, run.status, run.project) == ("tiny", "completed", "lightning-lab")
    assert run.spec["params"] == {"lr": "0.05", "hidden": "8"}
    assert {"train_loss_step", "train_loss_epoch", "val_acc", "epoch"} <= set(run.metrics)
    assert run.metrics["train_loss_epoch"].count == 3 and run.metrics["val_acc"].count == 3
    assert 0.0 <= run.metrics["val_acc"].last_value <= 1.0
