"""One evaluation, in a fresh process started by the jobs worker (worker/jobs.py's `torchdeck.evaluate`): a finished
run's ONNX export scored on a registered dataset, stored as an evaluation row.

The ONNX file is read from the artifact store by the artifact's id (its bytes checked against the SHA-256 they were
registered with), into a private temporary folder: the run may have trained on another host. An uploaded dataset
whose folder is only on the app's host is read from the store's copy (worker/artifacts.localize_dataset). Prints one
JSON line: {"ok": true, "evaluation": id, "metrics", "images"} or {"ok": false, "error"}.

    python -m worker.evaluate_job RUN_ID ARTIFACT_ID DATA_JSON DATASET_NAME BY
"""

from __future__ import annotations

import json
import shutil
import sys
import tempfile
import traceback
from pathlib import Path


def fetch_onnx(store, record, into: Path) -> Path:
    """The artifact's file copied to `into`/model.onnx through the store, checked against its registered hash."""
    from db.artifacts.base import VerifiedReader

    key = store.key_of(record.uri)
    if key is None:
        raise FileNotFoundError(f"artifact {record.id} is at {record.uri}, outside the artifact store {store.url}")

    def changed(why: str) -> Exception:
        return ValueError(f"artifact {record.id}'s file changed since it was stored: {why}")

    path = into / "model.onnx"
    with VerifiedReader(store.open(key), record.size, record.sha256, changed) as reader, open(path, "wb") as out:
        shutil.copyfileobj(reader, out, 1 << 20)
    return path


def evaluate(run_id: str, artifact_id: str, data: dict, dataset: str, by: str) -> dict:
    """Score the run's ONNX artifact on `data` (a DataSpec's fields; `dataset`: the name the user chose it by) and
    store the evaluation as made by `by`."""
    from core.config import RunSpec
    from core.export_scores import evaluate_onnx
    from db.engine import make_engine
    from db.evaluations import add_evaluation
    from db.repo import get_artifact
    from worker.artifacts import localize_dataset
    from worker.settings import WorkerSettings

    engine, store = make_engine(), WorkerSettings().store()
    record = get_artifact(engine, artifact_id)
    if record.run_id != run_id or record.kind != "onnx":
        raise ValueError(f"artifact {artifact_id} is not an ONNX export of run {run_id}")
    spec = localize_dataset(RunSpec.model_validate({"data": data}), store, engine)
    with tempfile.TemporaryDirectory(prefix="torchdeck-evaluate-") as tmp:
        result = evaluate_onnx(fetch_onnx(store, record, Path(tmp)), spec.data)
    details = {**result["details"], "images": result["images"], "skipped": result["skipped"]}
    row = add_evaluation(
        engine,
        run_id,
        artifact_id,
        dataset=dataset,
        dataset_path=data.get("path"),
        fingerprint=result["fingerprint"],
        metrics=result["metrics"],
        details=details,
        created_by=by,
    )
    return {"ok": True, "evaluation": row.id, "metrics": result["metrics"], "images": result["images"]}


def main(argv: list[str]) -> int:
    run_id, artifact_id, data, dataset, by = argv[0], argv[1], json.loads(argv[2]), argv[3], argv[4]
    try:
        result = evaluate(run_id, artifact_id, data, dataset, by)
    except Exception as e:  # noqa: BLE001 - the Run page shows it beside the button
        result = {"ok": False, "error": f"{e.__class__.__name__}: {e}", "traceback": traceback.format_exc()[-4000:]}
    print(json.dumps(result, default=str))
    return 0 if result.get("ok") else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
