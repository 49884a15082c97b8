"""A script's files, through MLflow's artifact proxy (the `mlflow-artifacts:` scheme: a run's artifact URI is
`mlflow-artifacts:/runs/<run id>`, which the client resolves against its tracking URI).

- PUT  .../api/2.0/mlflow-artifacts/artifacts/runs/<run id>/<path>: upload (the body, streamed to a temporary file
  on this host with its size bounded by TORCHDECK_MAX_SCRIPT_FILE_MB, then put into torchdeck's artifact store under
  runs/<run id>/mlflow/<path> and registered as a file of the run: the Run page lists it and its download link
  serves it). Writing takes the rights of writing the run (app/tracking/runs.py).
- GET  .../api/2.0/mlflow-artifacts/artifacts?path=runs/<run id>[/<folder>]: the folder's files and folders.
- GET  .../api/2.0/mlflow-artifacts/artifacts/runs/<run id>/<path>: download, streamed and SHA-256 checked by the
  dashboard's download route's code (app/web/downloads.py). Reading takes a role in the run's project.

A path is a relative path of at most 500 characters without '..', '.' or empty parts (the store's own rule)."""

from __future__ import annotations

import os
import tempfile
from typing import Any

from app.tracking.protocol import MlflowError, invalid, missing

PREFIX = "runs/"
MAX_PATH = 500
MAX_FILE_MB_ENV = "TORCHDECK_MAX_SCRIPT_FILE_MB"
PIECE = 1 << 20


def max_file_bytes() -> int:
    raw = os.environ.get(MAX_FILE_MB_ENV, "").strip() or "2048"
    try:
        return max(int(raw), 1) << 20
    except ValueError:
        raise MlflowError("INTERNAL_ERROR", f"{MAX_FILE_MB_ENV}={raw!r} is not a whole number of MB") from None


def split(path: str) -> tuple[str, str]:
    """(run id, the path inside the run: "" for its top) of a proxy path `runs/<run id>[/<path>]`."""
    from db.artifacts import BadKey, check_key

    path = path.strip("/")
    if not path.startswith(PREFIX):
        raise missing(f"Artifact path {path!r}: torchdeck's are runs/<run id>/<path>,")
    run_id, _, inner = path[len(PREFIX) :].partition("/")
    if not run_id:
        raise invalid(f"Artifact path {path!r}: runs/<run id>/<path>")
    if inner:
        if len(inner) > MAX_PATH:
            raise invalid(f"Artifact path of {len(inner)} characters: at most {MAX_PATH}")
        try:
            check_key(inner)
        except BadKey as e:
            raise invalid(str(e)) from None
    return run_id, inner


async def upload(ctx, path: str, request) -> dict[str, Any]:
    from starlette.concurrency import run_in_threadpool

    from app.tracking import runs

    run_id, inner = split(path)
    if not inner:
        raise invalid("Upload a file to runs/<run id>/<path>, not to the run's folder")
    run = await run_in_threadpool(runs.writable, ctx, run_id)
    limit = max_file_bytes()
    declared = request.headers.get("content-length")
    if declared and declared.isdigit() and int(declared) > limit:
        raise invalid(f"a file of {int(declared):,} bytes: torchdeck takes files up to {limit >> 20:,} MB")
    with tempfile.NamedTemporaryFile(prefix="torchdeck-upload-", delete=False) as tmp:
        try:
            size = 0
            async for piece in request.stream():
                size += len(piece)
                if size > limit:
                    raise invalid(f"the file is over {limit >> 20:,} MB: torchdeck takes files up to that size")
                tmp.write(piece)
            tmp.close()
            await run_in_threadpool(_store, ctx, run.id, inner, tmp.name)
        finally:
            tmp.close()
            os.unlink(tmp.name)
    return {}


def _store(ctx, run_id: str, inner: str, local: str) -> None:
    from app.services.artifacts import artifact_store
    from db import external

    stored = artifact_store().put_file(local, f"{PREFIX}{run_id}/mlflow/{inner}")
    try:
        external.replace_file(ctx.engine, run_id, inner, stored.uri, size=stored.size, sha256=stored.sha256)
    except external.RunNotFound:  # deleted meanwhile
        artifact_store().delete(stored.key)
        raise missing(f"Run with id={run_id}") from None


def listing(ctx, path: str) -> dict[str, Any]:
    """The files and folders right under `path` (a file's own path: nothing, as MLflow's server answers)."""
    from app.tracking import runs
    from db import external

    run_id, inner = split(path or "")
    run = runs.readable(ctx, run_id)
    folder = f"{inner}/" if inner else ""
    entries: dict[str, dict[str, Any]] = {}
    for name, record in external.files(ctx.engine, run.id).items():
        if not name.startswith(folder):
            continue
        head, _, rest = name[len(folder) :].partition("/")
        if rest:
            entries.setdefault(head, {"path": head, "is_dir": True})
        else:
            entries[head] = {"path": head, "is_dir": False, "file_size": record.size or 0}
    return {"files": [entries[k] for k in sorted(entries)]}


def download(ctx, path: str):
    """The file's answer: streamed by the download route's code, or MLflow's error shape for a missing one."""
    from app.tracking import runs
    from app.web import downloads
    from db import external

    run_id, inner = split(path)
    run = runs.readable(ctx, run_id)
    record = external.files(ctx.engine, run.id).get(inner)
    if record is None:
        raise missing(f"Artifact {inner!r} of run {run.id}")
    return downloads.stream(record.id, filename=inner.rsplit("/", 1)[-1])
