"""What the dashboard's buttons do, as plain functions (no Streamlit): re-run, delete, export now,
pre-flight. Work that needs torch (export, pre-flight) runs in a subprocess, so the dashboard
process never imports it; where this environment has no torch (team mode's app image) or the run's
files are elsewhere, a jobs worker does it (worker/jobs.py; TORCHDECK_JOBS=local|remote|auto)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any
from urllib.parse import unquote, urlparse

from sqlalchemy import Engine

from app import services
from app.auth import PermissionDenied, User
from core.config import EXPORT_FORMATS, RunSpec
from db import repo
from db.engine import data_home
from db.types import RunRecord

ROOT = Path(__file__).resolve().parents[2]
EXPORT_FILES = {"torchscript": "model.ts", "onnx": "model.onnx", "pt2": "model.pt2"}
PREFLIGHT_TIMEOUT_S = 300
EXPORT_TIMEOUT_S = 900


def rerun(engine: Engine, run_id: str, owner: str) -> RunRecord:
    """The same spec again, as a new queued run whose parent is the original, owned by whoever re-runs it
    (a re-run is a clone: anyone may make one)."""
    r = repo.get_run(engine, run_id)
    return services.submit(services.spec_of(r), name=r.name, owner=owner, tags=list(r.tags), parent_id=r.id,
                           engine=engine)


def delete(engine: Engine, run_id: str, by: User) -> str | None:
    """Delete a run with its rows and files; returns why it was refused, or None."""
    try:
        services.remove(run_id, engine=engine, by=by)
    except PermissionDenied as e:
        return str(e)
    except repo.RunStillActive:
        return f"run {run_id} is still running: cancel it first"
    except repo.RunNotFound:
        return None
    return None


def _local(uri: str) -> Path | None:
    """The path of a file:// URI under this installation's data or artifact folders, else None."""
    parsed = urlparse(uri)
    if parsed.scheme not in ("file", ""):
        return None
    path = Path(unquote(parsed.path)).resolve()
    roots = [services.artifact_root(), data_home().resolve()]
    return path if any(root == path or root in path.parents for root in roots) else None


def uri_path(uri: str) -> Path | None:
    """The local file of an artifact URI, only when it lies under this installation's data or artifact
    folders: a URI in the database never makes the dashboard serve an arbitrary file."""
    path = _local(uri)
    return path if path is not None and path.is_file() else None


def missing_reason(uri: str) -> str:
    """Why an artifact cannot be downloaded here."""
    if _local(uri) is None:
        return "not on this machine"
    return "file removed (a later export replaced the export folder)"


def run_dir(engine: Engine, run_id: str) -> Path | None:
    """The run's folder (where checkpoints/ and export/ live), found through its checkpoint artifacts."""
    for a in repo.list_artifacts(engine, run_id):
        if a.kind in ("checkpoint_best", "checkpoint_last"):
            path = uri_path(a.uri)
            if path is not None:
                return path.parents[1]
    default = services.artifact_root() / "runs" / run_id
    if not (default / "checkpoints").is_dir():
        _fetch_checkpoints(run_id, default)
    return default if (default / "checkpoints").is_dir() else None


def _fetch_checkpoints(run_id: str, folder: Path) -> None:
    """The run trained on another host: bring its checkpoints from the artifact store (for Export now)."""
    store = services.artifact_store()
    if store.is_local:
        return
    for name in ("best.pt", "last.pt"):
        key = f"runs/{run_id}/checkpoints/{name}"
        try:
            if store.exists(key):
                store.get_file(key, folder / "checkpoints" / name)
        except Exception:  # noqa: BLE001, S112 - unreachable store: "no checkpoint on this machine" says the rest
            continue


def latest_by_kind(artifacts: list[repo.ArtifactRecord]) -> dict[str, repo.ArtifactRecord]:
    """Exports can be made again; the newest artifact of each kind wins."""
    out: dict[str, repo.ArtifactRecord] = {}
    for a in sorted(artifacts, key=lambda a: a.created_at):
        out[a.kind] = a
    return out


def export_now(engine: Engine, run_id: str, formats: list[str], checkpoint: str = "best") -> tuple[bool, str]:
    """`torchdeck export` in a subprocess, then register what it wrote as the run's artifacts.
    Returns (every format verified, the command's output)."""
    unknown = [f for f in formats if f not in EXPORT_FORMATS]
    if unknown or not formats:
        return False, f"choose formats among {', '.join(EXPORT_FORMATS)}"
    mode = jobs_mode()
    folder = run_dir(engine, run_id) if mode == "local" or (mode == "auto" and torch_here()) else None
    if folder is None and mode != "local":  # no torch here, or the run's files are elsewhere: a jobs worker exports
        return _export_remote(run_id, formats, checkpoint)
    if folder is None:
        return False, "this run has no checkpoint on this machine to export from"
    cmd = [sys.executable, "-m", "app.cli", "export", str(folder), "--checkpoint", checkpoint,
           "--formats", ",".join(formats)]
    done = subprocess.run(cmd, check=False, cwd=ROOT, capture_output=True, text=True, timeout=EXPORT_TIMEOUT_S,
                          env=_child_env())
    output = (done.stdout + done.stderr).strip()
    report_path = folder / "export" / "export.json"
    if not report_path.is_file():
        return False, output or f"export failed with exit code {done.returncode}"
    register_exports(engine, run_id, folder / "export", formats)
    return done.returncode == 0, output


def register_exports(engine: Engine, run_id: str, export_dir: Path, formats: list[str]) -> list[str]:
    """Add the export report, each verified format and the bundle as artifacts (meta: parity and latency)."""
    report = json.loads((export_dir / "export.json").read_text())
    added = []
    store = services.artifact_store()

    def stored(path: Path):  # in the artifact store (no copy when the folder already lies inside a local one)
        return store.put_file(path, store.key_for_local(path) or f"runs/{run_id}/export/{path.name}")

    for fmt in formats:
        entry = report.get("formats", {}).get(fmt, {})
        path = export_dir / EXPORT_FILES[fmt]
        if entry.get("ok") and path.is_file():
            obj = stored(path)
            repo.add_artifact(engine, run_id, fmt, obj.uri, size=obj.size, sha256=obj.sha256, meta=entry)
            added.append(fmt)
    for name, kind in (("export.json", "export_report"), ("bundle.zip", "bundle")):
        path = export_dir / name
        if path.is_file():
            obj = stored(path)
            repo.add_artifact(engine, run_id, kind, obj.uri, size=obj.size, sha256=obj.sha256, meta={})
            added.append(kind)
    return added


def _child_env() -> dict[str, str]:
    env = dict(os.environ)
    env.setdefault("OMP_NUM_THREADS", "2")
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
    return env


def preflight(spec: RunSpec, timeout_s: float = PREFLIGHT_TIMEOUT_S) -> dict[str, Any]:
    """Build the data and the model in a subprocess (app/ui/preflight_job.py), run the shape check and
    draw the labelled sample grid. Returns {"ok", "shapes"|"error", "grid" (PNG bytes), "data", "model"}.
    Without torch here (team mode), a jobs worker does it (worker/jobs.py)."""
    mode = jobs_mode()
    if mode == "remote" or (mode == "auto" and not torch_here()):
        return _preflight_remote(spec, timeout_s)
    with tempfile.TemporaryDirectory(prefix="torchdeck-preflight-") as tmp:
        spec_path, out = Path(tmp) / "spec.yaml", Path(tmp) / "out"
        spec_path.write_text(spec.to_yaml())
        cmd = [sys.executable, "-m", "app.ui.preflight_job", str(spec_path), str(out)]
        try:
            done = subprocess.run(cmd, check=False, cwd=ROOT, capture_output=True, text=True, timeout=timeout_s,
                                  env=_child_env())
        except subprocess.TimeoutExpired:
            return {"ok": False, "error": f"pre-flight did not finish within {timeout_s:.0f} s"}
        result_path = out / "result.json"
        if not result_path.is_file():
            tail = (done.stderr or done.stdout).strip().splitlines()[-5:]
            return {"ok": False, "error": "pre-flight crashed: " + " / ".join(tail)}
        result = json.loads(result_path.read_text())
        grid = out / "samples.png"
        result["grid"] = grid.read_bytes() if grid.is_file() else None
        return result


# --- the jobs path: pre-flight and export on a jobs worker (worker/jobs.py), for a dashboard without torch ---

JOBS_ENV = "TORCHDECK_JOBS"  # local: subprocesses here; remote: the jobs queue; auto (default): local when torch is here
JOBS_PICKUP_ENV = "TORCHDECK_JOBS_PICKUP_S"  # how long a job may wait for a jobs worker to take it
JOBS_PICKUP_S = 20.0
PREFLIGHT_TASK, EXPORT_TASK = "torchdeck.preflight", "torchdeck.export"  # worker/jobs.py's names; enqueued by name
NO_JOBS_WORKER = ("no worker is serving the jobs queue — start `torchdeck worker` on a worker host (it starts one "
                  "jobs worker per host beside the run workers; `torchdeck up` does too)")


class JobError(RuntimeError):
    """A job on the jobs queue got no answer (no worker, unreachable broker or store, timeout)."""


def jobs_mode() -> str:
    mode = (os.environ.get(JOBS_ENV) or "auto").strip().lower()
    return mode if mode in ("local", "remote", "auto") else "auto"


def torch_here() -> bool:
    """Whether this environment could run torch work itself: found, never imported."""
    import importlib.util

    return importlib.util.find_spec("torch") is not None


def _jobs_worker_alive(stale_after_s: float = 30.0) -> bool:
    """A worker consuming the jobs queue has heartbeated lately (it may be busy with another job)."""
    from datetime import UTC, datetime

    try:
        now = datetime.now(UTC)
        return any(services.JOBS_QUEUE in w.queues
                   and (now - (w.heartbeat_at if w.heartbeat_at.tzinfo else w.heartbeat_at.replace(tzinfo=UTC)))
                   .total_seconds() < stale_after_s
                   for w in repo.list_workers(services.get_engine()))
    except Exception:  # noqa: BLE001 - no answer from the table: treat as no worker
        return False


def run_job(task: str, kwargs: dict[str, Any], timeout_s: float, pickup_s: float | None = None) -> tuple[dict, Any, str]:
    """Enqueue a job and wait for its answer in the artifact store: (result.json's content, store, job id).
    JobError when no jobs worker takes it within pickup_s (longer while a live one is busy) or it runs past
    timeout_s. The caller deletes jobs/<job id> from the store once it has read the answer."""
    import time
    import uuid

    if pickup_s is None:
        pickup_s = float(os.environ.get(JOBS_PICKUP_ENV) or JOBS_PICKUP_S)
    job_id = uuid.uuid4().hex
    prefix = f"jobs/{job_id}"
    store = services.artifact_store()
    try:
        services.enqueue_job(task, {"job_id": job_id, **kwargs}, expires_s=pickup_s + timeout_s)
    except Exception as e:
        raise JobError(f"could not reach the queue at {services.broker_url()}: {e}") from e
    start = time.monotonic()
    started, busy = False, False
    while True:
        try:
            if store.exists(f"{prefix}/result.json"):
                return json.loads(store.read_bytes(f"{prefix}/result.json")), store, job_id
            started = started or store.exists(f"{prefix}/started.json")
        except Exception as e:
            raise JobError(f"cannot read the job's answer from the artifact store {store.url}: {e}") from e
        waited = time.monotonic() - start
        if not started and waited > pickup_s:
            busy = busy or _jobs_worker_alive()
            if not busy:
                raise JobError(NO_JOBS_WORKER)
        if waited > pickup_s + timeout_s:
            what = "did not finish" if started else "was not taken by the busy jobs worker(s)"
            raise JobError(f"the job {what} within {pickup_s + timeout_s:.0f} s")
        time.sleep(0.3)


def _preflight_remote(spec: RunSpec, timeout_s: float) -> dict[str, Any]:
    try:
        result, store, job_id = run_job(PREFLIGHT_TASK, {"spec": spec.model_dump(mode="json"), "timeout_s": timeout_s},
                                        timeout_s)
    except JobError as e:
        return {"ok": False, "error": str(e)}
    try:
        key = f"jobs/{job_id}/samples.png"
        result["grid"] = store.read_bytes(key) if store.exists(key) else None
    finally:
        _forget_job(store, job_id)
    return result


def _export_remote(run_id: str, formats: list[str], checkpoint: str) -> tuple[bool, str]:
    try:
        result, store, job_id = run_job(EXPORT_TASK, {"run_id": run_id, "formats": formats, "checkpoint": checkpoint,
                                                      "timeout_s": EXPORT_TIMEOUT_S}, EXPORT_TIMEOUT_S)
    except JobError as e:
        return False, str(e)
    _forget_job(store, job_id)
    return bool(result.get("ok")), str(result.get("output", ""))


def _forget_job(store, job_id: str) -> None:
    try:
        store.delete_prefix(f"jobs/{job_id}")
    except Exception:  # noqa: BLE001, S110 - a leftover answer is harmless
        pass
