"""Export now, in its own process: `python -m worker.export_job RUN_ID CHECKPOINT FORMATS JOB_ID`, run by
the jobs worker (worker/jobs.py) for the Run page.

It rebuilds the model from the run's checkpoint, exports and verifies each format (core.train.export_run)
and registers every file through the database sink, exactly as the end of a training run does: the
files go to the artifact store and become the run's artifacts. Prints one JSON line:
{"ok", "formats": {format: verified}, "added": [artifact kinds]}; exit code 0 when every format passed.
"""

from __future__ import annotations

import json
import sys
import traceback


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
    added: list[str] = []
    sink = DbSink(engine, run.id, None, settings, store=settings.store(), run_dir=folder, scope=f"job-{job_id}",
                  on_artifact=added.append)
    try:
        verified = export_run(folder, checkpoint, formats, sink)
    finally:
        sink.close()
    return {"ok": all(verified.values()), "formats": verified, "added": added}


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
