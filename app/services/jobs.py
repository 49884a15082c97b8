"""The dashboard's torch jobs, asked of the jobs workers by task name (worker/jobs.py does them): the
pre-flight of the New run page and the Run page's "Export now". The dashboard never imports torch and
never runs them itself; it sends the task and reads the answer that the worker leaves in the artifact
store (`jobs/<job id>/result.json`), then deletes it. Export now is the run's owner's or an admin's to
ask: export_now checks it here, before anything is sent (the page only hides what this refuses).
"""

from __future__ import annotations

import json
import os
import time
import uuid
from typing import Any

from sqlalchemy import Engine

from app.auth import User, check_can_modify
from app.services.artifacts import artifact_root, artifact_store
from app.services.broker import broker_url, enqueue_job, get_engine, queue_status
from app.services.owners import owner_label
from core.config import RunSpec
from core.names import EXPORT_FORMATS, EXPORT_TASK, JOBS_QUEUE, PREFLIGHT_TASK
from core.redact import redact
from db.repo import RunNotFound
from db.types import DEFAULT_PROJECT

PREFLIGHT_TIMEOUT_S = 300
EXPORT_TIMEOUT_S = 900
PICKUP_ENV = "TORCHDECK_JOBS_PICKUP_S"  # how long a job may wait for a jobs worker to take it
PICKUP_S = 20.0
NO_JOBS_WORKER = (
    "no worker is serving the jobs queue — start `torchdeck worker` on a worker host (it starts one "
    "jobs worker per host beside the run workers; `torchdeck up` does too)"
)


class JobError(RuntimeError):
    """A job on the jobs queue got no answer (no worker, unreachable broker or store, timeout)."""


def run_job(
    task: str, kwargs: dict[str, Any], timeout_s: float, pickup_s: float | None = None
) -> tuple[dict, Any, str]:
    """Enqueue a job and wait for its answer in the artifact store: (result.json's content, store, job id).
    JobError when no jobs worker takes it within pickup_s (longer while a live one is busy) or it runs past
    timeout_s. The caller deletes jobs/<job id> from the store once it has read the answer (forget)."""
    if pickup_s is None:
        pickup_s = float(os.environ.get(PICKUP_ENV) or PICKUP_S)
    job_id = uuid.uuid4().hex
    prefix = f"jobs/{job_id}"
    store = artifact_store()
    try:
        enqueue_job(task, {"job_id": job_id, **kwargs}, expires_s=pickup_s + timeout_s)
    except Exception as e:
        raise JobError(redact(f"could not reach the queue at {broker_url()}: {e}")) from e
    start, started, busy = time.monotonic(), False, False
    while True:
        try:
            if store.exists(f"{prefix}/result.json"):
                return json.loads(store.read_bytes(f"{prefix}/result.json")), store, job_id
            started = started or store.exists(f"{prefix}/started.json")
        except Exception as e:
            raise JobError(redact(f"cannot read the job's answer from the artifact store {store.url}: {e}")) from e
        waited = time.monotonic() - start
        if not started and waited > pickup_s:
            busy = busy or _jobs_worker_alive()
            if not busy:
                raise JobError(NO_JOBS_WORKER)
        if waited > pickup_s + timeout_s:
            what = "did not finish" if started else "was not taken by the busy jobs worker(s)"
            raise JobError(f"the job {what} within {pickup_s + timeout_s:.0f} s")
        time.sleep(0.3)


def _jobs_worker_alive() -> bool:
    """A worker consuming the jobs queue has heartbeated lately (it may be busy with another job)."""
    try:
        return queue_status(JOBS_QUEUE).served
    except Exception:  # noqa: BLE001 - no answer from the table: treat as no worker
        return False


def forget(store, job_id: str) -> None:
    try:
        store.delete_prefix(f"jobs/{job_id}")
    except Exception:  # noqa: BLE001, S110 - a leftover answer is harmless: the workers sweep old ones
        pass


def preflight(
    spec: RunSpec, timeout_s: float = PREFLIGHT_TIMEOUT_S, overfit: bool = False, project: str = DEFAULT_PROJECT
) -> dict[str, Any]:
    """Build the data and the model on a jobs worker, run the shape check, draw the labelled sample grid and,
    with `overfit`, try to overfit one batch on a short budget. Returns {"ok", "shapes"|"error", "grid" (PNG
    bytes or None), "data", "model", and with `overfit` "overfit" (worker/preflight.py's verdict)}. A spec
    reading files a run of `project` may not (app.services.paths) is refused here, before anything is sent."""
    from app.services.paths import check_paths

    try:
        spec = check_paths(spec, get_engine(), artifact_root(), project)
    except ValueError as e:
        return {"ok": False, "error": str(e)}
    try:
        result, store, job_id = run_job(
            PREFLIGHT_TASK,
            {"spec": spec.model_dump(mode="json"), "timeout_s": timeout_s, "overfit": overfit},
            timeout_s,
        )
    except JobError as e:
        return {"ok": False, "error": str(e)}
    if result.get("error"):
        result["error"] = redact(result["error"])
    if isinstance(result.get("overfit"), dict) and result["overfit"].get("error"):
        result["overfit"]["error"] = redact(result["overfit"]["error"])
    try:
        key = f"jobs/{job_id}/samples.png"
        result["grid"] = store.read_bytes(key) if store.exists(key) else None
    finally:
        forget(store, job_id)
    return result


def export_now(
    run_id: str, formats: list[str], checkpoint: str = "best", *, by: User, engine: Engine | None = None
) -> tuple[bool, str]:
    """Export the run's checkpoint again on a jobs worker, which registers the verified files as new artifacts
    of the run (in a new folder: earlier exports keep their files). Returns (every format verified, what the
    worker said). Only the run's owner (a member of its project), a maintainer of its project or an admin may:
    app.auth.PermissionDenied otherwise, and then nothing is sent."""
    from app.services.projects import with_roles
    from app.services.runs import readable_run

    engine = engine or get_engine()
    try:
        run = readable_run(run_id, by=by, engine=engine)
    except RunNotFound:
        return False, f"there is no run {run_id!r} (it may have been deleted)"
    check_can_modify(with_roles(by, engine), run, "export", owner_label(run.owner, engine))
    unknown = [f for f in formats if f not in EXPORT_FORMATS]
    if unknown or not formats:
        return False, f"choose formats among {', '.join(EXPORT_FORMATS)}"
    try:
        result, store, job_id = run_job(
            EXPORT_TASK,
            {"run_id": run_id, "formats": formats, "checkpoint": checkpoint, "timeout_s": EXPORT_TIMEOUT_S},
            EXPORT_TIMEOUT_S,
        )
    except JobError as e:
        return False, str(e)
    forget(store, job_id)
    return bool(result.get("ok")), redact(result.get("output", ""))
