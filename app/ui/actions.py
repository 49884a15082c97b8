"""What the dashboard's buttons do, as plain functions (no Streamlit): re-run, delete, export now,
pre-flight. Work that needs torch (export, pre-flight) runs in a subprocess, so the dashboard
process never imports it."""

from __future__ import annotations

import hashlib
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
from core.config import EXPORT_FORMATS, RunSpec
from db import repo
from db.engine import data_home
from db.types import RunRecord

ROOT = Path(__file__).resolve().parents[2]
EXPORT_FILES = {"torchscript": "model.ts", "onnx": "model.onnx", "pt2": "model.pt2"}
PREFLIGHT_TIMEOUT_S = 300
EXPORT_TIMEOUT_S = 900


def rerun(engine: Engine, run_id: str) -> RunRecord:
    """The same spec again, as a new queued run whose parent is the original."""
    r = repo.get_run(engine, run_id)
    return services.submit(services.spec_of(r), name=r.name, owner=r.owner, tags=list(r.tags), parent_id=r.id,
                           engine=engine)


def delete(engine: Engine, run_id: str) -> str | None:
    """Delete a run with its rows and files; returns why it was refused, or None."""
    try:
        services.remove(run_id, engine=engine)
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
    return default if (default / "checkpoints").is_dir() else None


def latest_by_kind(artifacts: list[repo.ArtifactRecord]) -> dict[str, repo.ArtifactRecord]:
    """Exports can be made again; the newest artifact of each kind wins."""
    out: dict[str, repo.ArtifactRecord] = {}
    for a in sorted(artifacts, key=lambda a: a.created_at):
        out[a.kind] = a
    return out


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def export_now(engine: Engine, run_id: str, formats: list[str], checkpoint: str = "best") -> tuple[bool, str]:
    """`torchdeck export` in a subprocess, then register what it wrote as the run's artifacts.
    Returns (every format verified, the command's output)."""
    unknown = [f for f in formats if f not in EXPORT_FORMATS]
    if unknown or not formats:
        return False, f"choose formats among {', '.join(EXPORT_FORMATS)}"
    folder = run_dir(engine, run_id)
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
    for fmt in formats:
        entry = report.get("formats", {}).get(fmt, {})
        path = export_dir / EXPORT_FILES[fmt]
        if entry.get("ok") and path.is_file():
            repo.add_artifact(engine, run_id, fmt, path.resolve().as_uri(), size=path.stat().st_size,
                              sha256=_sha256(path), meta=entry)
            added.append(fmt)
    for name, kind in (("export.json", "export_report"), ("bundle.zip", "bundle")):
        path = export_dir / name
        if path.is_file():
            repo.add_artifact(engine, run_id, kind, path.resolve().as_uri(), size=path.stat().st_size,
                              sha256=_sha256(path), meta={})
            added.append(kind)
    return added


def _child_env() -> dict[str, str]:
    env = dict(os.environ)
    env.setdefault("OMP_NUM_THREADS", "2")
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
    return env


def preflight(spec: RunSpec, timeout_s: float = PREFLIGHT_TIMEOUT_S) -> dict[str, Any]:
    """Build the data and the model in a subprocess (app/ui/preflight_job.py), run the shape check and
    draw the labelled sample grid. Returns {"ok", "shapes"|"error", "grid" (PNG bytes), "data", "model"}."""
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
