"""The evaluation table on SQLite and Postgres: rows stored with their JSON as written, listed newest first for one
run or several, refused for a run that is gone, and deleted with their run."""

from __future__ import annotations

import math

import pytest
from sqlalchemy import Engine

from db import repo
from db.errors import RunNotFound
from db.evaluations import add_evaluation, get_evaluation, list_evaluations

DETAILS = {"class_names": ["cat", "dog"], "confusion": [[3, 1], [0, 4]], "images": 8}


def evaluate(engine: Engine, run_id: str, dataset: str, acc: float):
    return add_evaluation(
        engine,
        run_id,
        "a" * 32,
        dataset=dataset,
        dataset_path=f"/data/{dataset}",
        fingerprint="f" * 64,
        metrics={"acc": acc, "loss": math.nan},
        details=DETAILS,
        created_by="ana",
    )


def test_evaluations_are_stored_listed_and_deleted_with_their_run(engine: Engine) -> None:
    a, b = repo.create_run(engine, {"lr": 0.1}), repo.create_run(engine, {"lr": 0.2})
    first = evaluate(engine, a.id, "site-b", 0.875)
    second = evaluate(engine, a.id, "site-c", 0.5)
    other = evaluate(engine, b.id, "site-b", 0.75)
    assert get_evaluation(engine, first.id) == first
    assert first.metrics == {"acc": 0.875, "loss": "nan"} and first.details == DETAILS  # JSON has no NaN
    assert first.created_at.tzinfo is not None and first.dataset_path == "/data/site-b"
    assert [e.id for e in list_evaluations(engine, [a.id])] == [second.id, first.id]
    assert {e.id for e in list_evaluations(engine, [a.id, b.id])} == {first.id, second.id, other.id}
    assert list_evaluations(engine, []) == []
    repo.delete_run(engine, a.id)
    assert [e.id for e in list_evaluations(engine, [a.id, b.id])] == [other.id]
    with pytest.raises(RunNotFound):
        evaluate(engine, a.id, "site-b", 0.875)
