"""Export now, in its own process: `python -m worker.export_job RUN_ID CHECKPOINT FORMATS JOB_ID`, run by
the jobs worker (worker/jobs.py) for the Run page.

It rebuilds the model from the run's checkpoint, exports and verifies each format (core.train.export_run)
and registers every file through the database sink, exactly as the end of a training run does: the
files go to the artifact store and become the run's artifacts. Prints one JSON line:
{"ok", "formats": {format: verified}, "added": [artifact kinds], "folder"}; exit code 0 when every
format passed.

Every export gets a folder of its own, `runs/<id>/exports/<UTC time>-<random token>/`, created here
and never reused; its files are uploaded without ever replacing a stored key (worker/artifacts.py).
So a re-export adds new artifacts and never touches the files, nor the bytes, behind earlier ones:
the Run page shows the newest of each kind, and older ones stay downloadable by their id.
"""

from __future__ import annotations

import json
import secrets
import sys
import time
import traceback
from pathlib import Path

EXPORTS = "exports"


def new_export_folder(run_dir: Path) -> Path:
    """A fresh, empty folder for one export under run_dir/exports/ (FileExistsError rather than reuse one)."""
    folder = run_dir / EXPORTS / f"{time.strftime('%Y%m%dT%H%M%SZ', time.gmtime())}-{secrets.token_hex(4)}"
    folder.parent.mkdir(parents=True, exist_ok=True)
    folder.mkdir()
    return folder


def export(run_id: str, checkpoint: str, formats: list[str], job_id: str) -> dict:
    from core.train import export_run
    from db.engine import make_engine
    from db.repo import get_run
    from worker.settings import WorkerSettings
    from worker.sink import DbSink

    settings = WorkerSettings()
    engine = make_engine()
    run = get_run(engine, run_id)  # RunNotFound for a run deleted meanwhile
    folder = settings.run_dir(run.id)
    out = new_export_folder(folder)
    added: list[str] = []
    sink = DbSink(
        engine,
        run.id,
        None,
        settings,
        store=settings.store(),
        run_dir=folder,
        scope=f"job-{job_id}",
        on_artifact=added.append,
    )
    try:
        verified = export_run(folder, checkpoint, formats, sink, out=out)
    finally:
        sink.close()
    return {
        "ok": all(verified.values()),
        "formats": verified,
        "added": added,
        "folder": out.relative_to(folder).as_posix(),
    }


def main(argv: list[str]) -> int:
    run_id, checkpoint, formats, job_id = argv[0], argv[1], argv[2].split(","), argv[3]
    try:
        result = export(run_id, checkpoint, formats, job_id)
    except Exception as e:  # noqa: BLE001 - the Run page shows it beside the button
        result = {"ok": False, "error": f"{e.__class__.__name__}: {e}", "traceback": traceback.format_exc()[-4000:]}
    print(json.dumps(result, default=str))
    return 0 if result.get("ok") else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
