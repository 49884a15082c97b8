"""The dashboard's jobs that need torch: the dashboard never imports torch (and the team image has none),
and a run's checkpoints may live only on a worker host or in the S3 store.

Three tasks on the `jobs` queue, served by one small CPU-only worker per host (`torchdeck worker` and
`torchdeck up` start it beside the run workers, so a pre-flight never waits behind a long run); each job
runs in a fresh subprocess, so a crash or a leak never touches the worker:

- `torchdeck.preflight(job_id, spec, overfit)`: builds the data and the model as a run would, checks the
  shapes, draws the labelled sample grid and, with `overfit`, tries to overfit one batch on a short budget
  (worker/preflight.py);
- `torchdeck.export(job_id, run_id, formats, checkpoint)`: brings the run's checkpoint from the artifact
  store when this host lacks it, then exports, verifies and registers the files through the database
  sink, as the end of a training run does, into a new folder of the run each time, so an earlier
  export's files are never replaced (worker/export_job.py). Who may ask is checked by the dashboard's
  service (app/services/jobs.export_now: the run's owner or an admin) before anything is sent;
- `torchdeck.evaluate(job_id, run_id, artifact_id, data, dataset, by)`: scores the run's ONNX export (read from
  the artifact store) on a registered dataset and stores the evaluation (worker/evaluate_job.py). Who may ask
  (anyone who may read the dataset) is checked by app/services/evaluations.evaluate before anything is sent.

There is no Celery result backend: a job answers through the artifact store, which the app reads too.
`jobs/<job_id>/started.json` says a worker took the job; `jobs/<job_id>/result.json` (and, for a
pre-flight, `samples.png` before it) is the answer. The app (app/services/jobs.py) polls for them and deletes the
folder; each job sweeps away answers older than an hour that nobody read (the app gave up or went away).
"""

from __future__ import annotations

import json
import logging
import os
import re
import socket
import subprocess
import sys
import tempfile
import time
import traceback
from pathlib import Path
from typing import Any

from core.names import CHECKPOINT_FILES, EVALUATE_TASK, EXPORT_FORMATS, EXPORT_TASK, PREFLIGHT_TASK
from worker.celery_app import app
from worker.settings import WorkerSettings

log = logging.getLogger("torchdeck.jobs")

PREFLIGHT_TIMEOUT_S = 300
EXPORT_TIMEOUT_S = 900
EVALUATE_TIMEOUT_S = 900
STALE_JOB_S = 3600.0  # an answer still in the store after this was abandoned
ROOT = Path(__file__).resolve().parents[1]
_JOB_ID = re.compile(r"^[0-9a-f]{8,64}$")


def job_key(job_id: str, name: str = "") -> str:
    """The store key of a job's folder or of one of its files; job ids are hex tokens, never paths."""
    if not isinstance(job_id, str) or not _JOB_ID.match(job_id):
        raise ValueError(f"{str(job_id)[:80]!r} is not a job id")
    return f"jobs/{job_id}" + (f"/{name}" if name else "")


def _put_json(store, job_id: str, name: str, data: dict) -> None:
    store.put_bytes(json.dumps(data, default=str).encode(), job_key(job_id, name))


def _started(store, job_id: str) -> None:
    _put_json(store, job_id, "started.json", {"worker": socket.gethostname(), "pid": os.getpid(), "at": time.time()})
    sweep(store)


def sweep(store, older_than_s: float = STALE_JOB_S) -> int:
    """Delete answers nobody read (the dashboard gave up waiting, or went away): files under jobs/ older than
    older_than_s. Never raises."""
    removed = 0
    try:
        for key in store.list("jobs"):
            stamp = store.modified(key)
            if stamp is not None and time.time() - stamp > older_than_s:
                removed += bool(store.delete(key))
    except Exception as e:  # noqa: BLE001 - housekeeping must never fail a job
        log.warning("could not sweep old job answers from %s: %s", store.url, e)
    return removed


def _child_env() -> dict[str, str]:
    env = dict(os.environ)
    env.setdefault("OMP_NUM_THREADS", "2")
    env["CUDA_VISIBLE_DEVICES"] = ""  # jobs run on the CPU: a run worker owns each GPU
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
    return env


def _tail(done: subprocess.CompletedProcess, n: int = 5) -> str:
    return " / ".join((done.stderr or done.stdout or "").strip().splitlines()[-n:])


def _job_process(module: str, args: list[str], timeout_s: float, what: str) -> tuple[dict | None, str]:
    """`python -m module *args` in a fresh subprocess on this host: (the JSON answer on its last line of output, "")
    or (None, why: it ran past timeout_s, or ended without an answer)."""
    cmd = [sys.executable, "-m", module, *args]
    try:
        done = subprocess.run(
            cmd, check=False, cwd=ROOT, capture_output=True, text=True, timeout=timeout_s, env=_child_env()
        )
    except subprocess.TimeoutExpired:
        return None, f"{what} did not finish within {timeout_s:.0f} s"
    try:
        return json.loads(done.stdout.strip().splitlines()[-1]), ""
    except (IndexError, ValueError):
        return None, f"{what} crashed: " + _tail(done)


# --- pre-flight -----------------------------------------------------------------------------------------


def cpu_spec(spec: Any) -> Any:
    """The spec as the jobs worker checks it: on the CPU (fp16 needs CUDA, so fp32 instead)."""
    train = spec.train
    if train.precision == "fp16":
        train = train.model_copy(update={"precision": "fp32"})
    return spec.model_copy(update={"device": "cpu", "train": train})


def run_preflight(
    spec_data: dict, store, timeout_s: float = PREFLIGHT_TIMEOUT_S, overfit: bool = False
) -> tuple[dict, bytes | None]:
    """(result, sample grid PNG) of worker/preflight.py run in a fresh subprocess on this host."""
    from core.config import RunSpec
    from worker.artifacts import localize_dataset

    spec = RunSpec.model_validate(spec_data)
    try:  # an uploaded dataset whose folder is on the app's host only: read it from the store
        from worker.tasks import engine

        spec = localize_dataset(spec, store, engine())
    except Exception as e:  # noqa: BLE001 - the pre-flight says what is missing
        log.warning("could not localize the dataset of a pre-flight: %s", e)
    with tempfile.TemporaryDirectory(prefix="torchdeck-job-preflight-") as tmp:
        spec_path, out = Path(tmp) / "spec.yaml", Path(tmp) / "out"
        spec_path.write_text(cpu_spec(spec).to_yaml())
        cmd = [sys.executable, "-m", "worker.preflight", str(spec_path), str(out), *(["--overfit"] if overfit else [])]
        try:
            done = subprocess.run(
                cmd, check=False, cwd=ROOT, capture_output=True, text=True, timeout=timeout_s, env=_child_env()
            )
        except subprocess.TimeoutExpired:
            return {"ok": False, "error": f"pre-flight did not finish within {timeout_s:.0f} s"}, None
        result_path = out / "result.json"
        if not result_path.is_file():
            return {"ok": False, "error": "pre-flight crashed: " + _tail(done)}, None
        result = json.loads(result_path.read_text())
        grid = out / "samples.png"
        return result, (grid.read_bytes() if grid.is_file() else None)


@app.task(name=PREFLIGHT_TASK, ignore_result=True)
def preflight(job_id: str, spec: dict, timeout_s: float = PREFLIGHT_TIMEOUT_S, overfit: bool = False) -> str:
    store = WorkerSettings().store()
    _started(store, job_id)
    try:
        result, grid = run_preflight(spec, store, timeout_s, overfit)
    except Exception as e:  # noqa: BLE001 - the answer says what went wrong
        result, grid = (
            {"ok": False, "error": f"{e.__class__.__name__}: {e}", "traceback": traceback.format_exc()[-4000:]},
            None,
        )
    result["worker"] = socket.gethostname()
    if grid is not None:
        store.put_bytes(grid, job_key(job_id, "samples.png"))
    _put_json(store, job_id, "result.json", result)  # last: its presence means the answer is complete
    return "ok" if result.get("ok") else "failed"


# --- export now -----------------------------------------------------------------------------------------


def run_export(
    run_id: str,
    formats: list[str],
    checkpoint: str = "best",
    job_id: str = "0" * 8,
    settings: WorkerSettings | None = None,
    timeout_s: float = EXPORT_TIMEOUT_S,
) -> dict:
    """worker/export_job.py on the run's folder on this host (checkpoint fetched from the store when missing),
    in a fresh subprocess. Returns {"ok", "output", "added"}."""
    from worker.artifacts import fetch_checkpoints, needs_upload

    s = settings or WorkerSettings()
    unknown = [f for f in formats if f not in EXPORT_FORMATS]
    if unknown or not formats or checkpoint not in CHECKPOINT_FILES:
        return {"ok": False, "output": f"choose formats among {', '.join(EXPORT_FORMATS)} and checkpoint best or last"}
    store, folder = s.store(), s.run_dir(run_id)
    if needs_upload(store, folder):  # the store is not this host's folder: the run may have trained elsewhere
        fetch_checkpoints(store, run_id, folder)
    if not (folder / "checkpoints" / CHECKPOINT_FILES[checkpoint]).is_file():
        return {
            "ok": False,
            "output": f"run {run_id} has no {checkpoint} checkpoint on {socket.gethostname()} nor in "
            f"the artifact store {store.url}",
        }
    args = [run_id, checkpoint, ",".join(formats), job_id]
    answer, why = _job_process("worker.export_job", args, timeout_s, "export")
    if answer is None:
        return {"ok": False, "output": why}
    if answer.get("error"):
        return {"ok": False, "output": answer["error"], "added": []}
    verdicts = ", ".join(
        f"{fmt} {'verified' if ok else 'failed (see export.json)'}" for fmt, ok in answer["formats"].items()
    )
    where = f" (new files in {answer['folder']}/)" if answer.get("folder") else ""
    return {"ok": bool(answer["ok"]), "output": f"{checkpoint} checkpoint: {verdicts}{where}", "added": answer["added"]}


@app.task(name=EXPORT_TASK, ignore_result=True)
def export(
    job_id: str, run_id: str, formats: list[str], checkpoint: str = "best", timeout_s: float = EXPORT_TIMEOUT_S
) -> str:
    store = WorkerSettings().store()
    _started(store, job_id)
    try:
        result = run_export(run_id, formats, checkpoint, job_id, timeout_s=timeout_s)
    except Exception as e:  # the answer says what went wrong
        log.exception("export of run %s failed", run_id)
        result = {"ok": False, "output": f"{e.__class__.__name__}: {e}"}
    result["worker"] = socket.gethostname()
    _put_json(store, job_id, "result.json", result)
    return "ok" if result.get("ok") else "failed"


# --- evaluate -------------------------------------------------------------------------------------------


def run_evaluate(
    run_id: str, artifact_id: str, data: dict, dataset: str, by: str, timeout_s: float = EVALUATE_TIMEOUT_S
) -> dict:
    """worker/evaluate_job.py in a fresh subprocess: {"ok", "evaluation" (its id), "metrics", "images"} or
    {"ok": False, "error"}."""
    args = [run_id, artifact_id, json.dumps(data), dataset, by]
    answer, why = _job_process("worker.evaluate_job", args, timeout_s, "the evaluation")
    if answer is None:
        return {"ok": False, "error": why}
    trace = answer.pop("traceback", None)  # for the worker's log; the page shows the error
    if trace:
        log.warning("evaluation of run %s failed:\n%s", run_id, trace)
    return answer


@app.task(name=EVALUATE_TASK, ignore_result=True)
def evaluate(
    job_id: str,
    run_id: str,
    artifact_id: str,
    data: dict,
    dataset: str,
    by: str,
    timeout_s: float = EVALUATE_TIMEOUT_S,
) -> str:
    store = WorkerSettings().store()
    _started(store, job_id)
    try:
        result = run_evaluate(run_id, artifact_id, data, dataset, by, timeout_s)
    except Exception as e:  # noqa: BLE001 - the answer says what went wrong
        log.exception("evaluation of run %s failed", run_id)
        result = {"ok": False, "error": f"{e.__class__.__name__}: {e}"}
    result["worker"] = socket.gethostname()
    _put_json(store, job_id, "result.json", result)
    return "ok" if result.get("ok") else "failed"
