"""Evaluate a finished run's export on any registered dataset the user may read (a newer test set, another site's
photos), list a run's evaluations and compare several runs': plain functions for the Run and Compare pages and the
CLI. No torch here: a jobs worker scores the run's verified ONNX file (worker/evaluate_job.py) and stores the row.

Who may: anyone who may see the run and read the dataset (an uploaded dataset of a project they may see, checked
also by app/services/paths.check_paths as for a run's data.path) may evaluate it, since an evaluation only reads the
run's file and adds a row beside it. Refused here, before anything is sent.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sqlalchemy import Engine

from app.auth import User, team_mode
from app.services import projects
from app.services.artifacts import artifact_root
from app.services.broker import get_engine
from app.services.jobs import JobError, forget, run_job
from app.services.predict import verified_onnx
from core import catalog
from core.config import RunSpec
from core.names import EVALUATE_TASK
from core.redact import redact
from db.errors import RunNotFound
from db.evaluations import EvaluationRecord, get_evaluation, list_evaluations
from db.repo import list_artifacts, list_datasets

EVALUATE_TIMEOUT_S = 900  # a whole dataset decoded and scored on a jobs worker's CPU


@dataclass(frozen=True)
class Choice:
    """A dataset a user may evaluate on: the name shown and the data spec a worker reads."""

    name: str
    data: dict[str, Any]


def choices(engine: Engine | None = None, by: User | None = None) -> list[Choice]:
    """The datasets offered: the built-in ones that load with no path (digits, synthetic) and every uploaded
    dataset that is ready, as the New run page offers them; in team mode, of the projects `by` may see."""
    engine = engine or get_engine()
    out = [Choice(name, {"name": name}) for name, d in catalog.DATASETS.items() if d.kind in ("builtin", "generated")]
    seen = None if not team_mode() else {p.name for p in projects.readable(by, engine)}
    for d in list_datasets(engine, status="ready"):
        if seen is None or d.project in seen:
            out.append(Choice(d.name, {"name": catalog.FOLDER_DATASET, "path": d.uri}))
    return out


def resolve(dataset: str, path: str | None = None, engine: Engine | None = None, by: User | None = None) -> Choice:
    """The choice named `dataset` (an uploaded dataset's name or a built-in one, among those `by` may read); with
    `path`, an image folder at that path (the caller checks that it may be read: check_readable_path). ValueError
    naming the known ones otherwise."""
    if path:
        return Choice(dataset, {"name": catalog.FOLDER_DATASET, "path": path})
    known = choices(engine, by)
    for c in known:
        if c.name == dataset:
            return c
    raise ValueError(f"no dataset {dataset!r} to evaluate on; choose among {', '.join(c.name for c in known)}")


def check_readable_path(path: str, engine: Engine, by: User | None) -> None:
    """Team mode: a folder given by path must be an uploaded dataset of a project `by` may see (check_paths has
    made sure it is an uploaded dataset at all). ValueError otherwise, as for a dataset that does not exist."""
    if not team_mode():
        return
    wanted = Path(path).resolve()
    if not any(c.data.get("path") and Path(c.data["path"]).resolve() == wanted for c in choices(engine, by)):
        raise ValueError(f"no uploaded dataset at {path} that you may read: choose one by its name")


def evaluate(
    run_id: str,
    dataset: str,
    path: str | None = None,
    *,
    by: User | None,
    engine: Engine | None = None,
    timeout_s: float = EVALUATE_TIMEOUT_S,
) -> tuple[EvaluationRecord | None, str]:
    """Score the run's newest verified ONNX export on the dataset, on a jobs worker: (the stored evaluation, a
    summary) or (None, why not). A dataset the user may not read is refused before anything is sent."""
    from app.services.paths import check_paths

    if by is None:
        return None, "sign in to evaluate: an evaluation records who made it"
    engine = engine or get_engine()
    from app.services.runs import readable_run

    try:
        run = readable_run(run_id, by=by, engine=engine)
    except RunNotFound:
        return None, f"there is no run {run_id!r} (it may have been deleted)"
    onnx, why = verified_onnx(run.status, list_artifacts(engine, run_id))
    if onnx is None:
        return None, str(why)
    try:
        choice = resolve(dataset, path, engine, by)
        data = check_paths(RunSpec.model_validate({"data": choice.data}), engine, artifact_root()).data
        if data.path:
            check_readable_path(data.path, engine, by)
    except ValueError as e:
        return None, str(e)
    kwargs = {
        "run_id": run_id,
        "artifact_id": onnx.id,
        "data": data.model_dump(mode="json"),
        "dataset": choice.name,
        "by": by.id,
        "timeout_s": timeout_s,
    }
    try:
        result, store, job_id = run_job(EVALUATE_TASK, kwargs, timeout_s)
    except JobError as e:
        return None, str(e)
    forget(store, job_id)
    if not result.get("ok"):
        return None, redact(str(result.get("error") or "the evaluation failed"))
    record = get_evaluation(engine, result["evaluation"])
    if record is None:
        return None, "the evaluation was stored but is gone (the run may have been deleted meanwhile)"
    return record, f"{choice.name}: {summary(record)}"


def summary(e: EvaluationRecord) -> str:
    """`acc 0.9420, f1_macro 0.9391, loss 0.2100 on 300 images`."""
    shown = ", ".join(f"{k} {float(v):.4f}" for k, v in e.metrics.items())
    return f"{shown} on {e.details.get('images', '?')} images"


def list_for_run(run_id: str, engine: Engine | None = None) -> list[EvaluationRecord]:
    """The run's evaluations, newest first."""
    return list_evaluations(engine or get_engine(), [run_id])


def compare(run_ids: Sequence[str], engine: Engine | None = None) -> list[dict[str, Any]]:
    """One row per (dataset, fingerprint) that any of the runs was evaluated on, with each run's newest scores on
    it as `<run id>/<metric>` columns: the same data, compared across runs."""
    rows: dict[tuple[str, str], dict[str, Any]] = {}
    for e in reversed(list_evaluations(engine or get_engine(), list(run_ids))):  # oldest first: the newest wins
        row = rows.setdefault((e.dataset, e.fingerprint), {"dataset": e.dataset, "fingerprint": e.fingerprint[:12]})
        for k, v in e.metrics.items():
            row[f"{e.run_id}/{k}"] = v
        row["images"] = e.details.get("images")
    return list(rows.values())


def scores_by_run(run_ids: Sequence[str], engine: Engine | None = None) -> dict[str, list[str]]:
    """Each run's newest score on every dataset it was evaluated on, as `dataset acc 0.9420` (the Models page's
    versions): {run id: [...]}, the datasets in name order."""
    newest: dict[tuple[str, str], EvaluationRecord] = {}
    for e in list_evaluations(engine or get_engine(), list(run_ids)):  # newest first: the first seen wins
        newest.setdefault((e.run_id, e.dataset), e)
    out: dict[str, list[str]] = {}
    for (run_id, dataset), e in sorted(newest.items()):
        acc = e.metrics.get("acc")
        out.setdefault(run_id, []).append(f"{dataset} acc {float(acc):.4f}" if acc is not None else dataset)
    return out
