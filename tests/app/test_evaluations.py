"""Evaluate anywhere: a finished run's verified ONNX export scored on another registered dataset by a real jobs
worker (the task sent by name, the file read from the artifact store), stored as an evaluation, listed on the run
and compared across runs; a dataset a user may not read is refused before anything is sent."""

from __future__ import annotations

from pathlib import Path

import pytest
from seeding import seed_run

from app import auth
from app.auth import local_user
from app.services import evaluations
from app.services.artifacts import artifact_root
from core.catalog import FOLDER_DATASET
from db import repo
from tests._onnx_digits import digit_png, register, train_and_export

DIGITS_8 = {"data": {"name": "digits", "image_size": 8}}
SITE_B = range(1, 1797, 9)  # 200 real digits, as another site's folder of PNGs


@pytest.fixture(scope="module")
def exported(tmp_path_factory: pytest.TempPathFactory) -> tuple[dict, Path]:
    out = tmp_path_factory.mktemp("digits_onnx")
    return train_and_export(out), out


def site_b(root: Path) -> Path:
    from sklearn.datasets import load_digits

    target = load_digits().target
    for i in SITE_B:
        (root / str(target[i])).mkdir(parents=True, exist_ok=True)
        (root / str(target[i]) / f"{i:04d}.png").write_bytes(digit_png(i))
    return root


def finished_run(engine, exported, name: str):
    report, out = exported
    r = seed_run(engine, name, spec=DIGITS_8, epochs=1)
    register(engine, r.id, artifact_root(), report, out)
    return r


def test_an_evaluation_on_the_jobs_worker_is_stored_listed_and_compared(engine, home, exported, jobs_worker):
    folder = site_b(home / "datasets" / "site-b")
    repo.create_dataset(engine, "site-b", str(folder), classes=[str(i) for i in range(10)], status="ready")
    a, b = finished_run(engine, exported, "a"), finished_run(engine, exported, "b")
    assert "site-b" in [c.name for c in evaluations.choices(engine)]
    record, message = evaluations.evaluate(a.id, "site-b", by=local_user(), engine=engine, timeout_s=240)
    assert record is not None, (message, (home / "jobs-worker.log").read_text()[-3000:])
    assert message.startswith("site-b: acc ") and "on 200 images" in message
    assert record.dataset == "site-b" and record.dataset_path == str(folder) and len(record.fingerprint) == 64
    assert record.created_by == local_user().id and record.details["images"] == len(SITE_B)
    assert 0.8 < record.metrics["acc"] <= 1 and {"f1_macro", "loss", "acc_top5"} <= set(record.metrics)
    assert sum(map(sum, record.details["confusion"])) == len(SITE_B)
    # the built-in digits too: the run's own data, a second row for the same run
    record2, message = evaluations.evaluate(a.id, "digits", by=local_user(), engine=engine, timeout_s=240)
    assert record2 is not None and record2.details["images"] == 1797, message
    assert [e.id for e in evaluations.list_for_run(a.id, engine)] == [record2.id, record.id]
    # the same file on b: the compared rows put both runs' scores on site-b side by side
    record3, message = evaluations.evaluate(b.id, "site-b", by=local_user(), engine=engine, timeout_s=240)
    assert record3 is not None, message
    rows = {r["dataset"]: r for r in evaluations.compare([a.id, b.id], engine)}
    assert rows["site-b"][f"{a.id}/acc"] == rows["site-b"][f"{b.id}/acc"] == record.metrics["acc"]
    assert f"{b.id}/acc" not in rows["digits"]


def test_a_dataset_with_a_class_the_model_does_not_know_is_refused_by_the_worker(engine, home, exported, jobs_worker):
    folder = site_b(home / "datasets" / "renamed")
    (folder / "3").rename(folder / "three")
    a = finished_run(engine, exported, "a")
    record, message = evaluations.evaluate(a.id, "renamed", str(folder), by=local_user(), engine=engine, timeout_s=240)
    assert record is None and "the model does not know: 'three'" in message
    assert evaluations.list_for_run(a.id, engine) == []


def test_refusals_are_answered_before_anything_is_sent(engine, home, exported, broker, tmp_path, monkeypatch):
    a = finished_run(engine, exported, "a")
    bare = seed_run(engine, "bare", spec=DIGITS_8)
    record, message = evaluations.evaluate(bare.id, "digits", by=local_user(), engine=engine)
    assert record is None and "no ONNX export" in message
    record, message = evaluations.evaluate(a.id, "nosuch", by=local_user(), engine=engine)
    assert record is None and "no dataset 'nosuch'" in message and "digits" in message
    monkeypatch.setenv(auth.MODE_ENV, "team")  # team mode: only registered datasets may be read
    outside = site_b(tmp_path / "elsewhere")
    record, message = evaluations.evaluate(a.id, "x", str(outside), by=local_user(), engine=engine)
    assert record is None and "outside the folders runs may read" in message
    assert broker.dbsize() == 0  # nothing was queued
    assert evaluations.resolve("digits", engine=engine).data == {"name": "digits"}
    assert FOLDER_DATASET == evaluations.resolve("x", "/p").data["name"]


def stored(engine, run_id: str, dataset: str, acc: float):
    """An evaluation row as a jobs worker stores it (10 digit classes, 50 images)."""
    from db.evaluations import add_evaluation

    names = [str(i) for i in range(10)]
    per_class = {"precision": [1.0] * 10, "recall": [1.0] * 10, "f1": [1.0] * 10, "support": [5] * 10}
    confusion = [[5 if i == j else 0 for j in range(10)] for i in range(10)]
    return add_evaluation(
        engine,
        run_id,
        "b" * 32,
        dataset=dataset,
        dataset_path=f"/data/{dataset}",
        fingerprint="c" * 64,
        metrics={"acc": acc, "f1_macro": 0.9, "loss": 0.25},
        details={"class_names": names, "confusion": confusion, "images": 50, **per_class},
        created_by="local",
    )


def test_run_page_lists_the_evaluations_and_offers_evaluate(page, engine, home, exported, broker, monkeypatch):
    a = finished_run(engine, exported, "a")
    stored(engine, a.id, "site-b", 0.9321)
    at = page("run.py", id=a.id)
    at.session_state["run.tab"] = "Diagnosis & evaluation"
    at.run()
    assert not at.exception
    assert any(m.value == "#### Evaluations" for m in at.markdown)
    table = at.dataframe[0].value
    assert table["dataset"].tolist() == ["site-b"] and table["accuracy"].tolist() == [0.9321]
    assert any(e.label.startswith("site-b ·") for e in at.expander)
    # no jobs worker: Evaluate says so beside the button
    monkeypatch.setenv("TORCHDECK_JOBS_PICKUP_S", "0.5")
    at.selectbox(key=f"run.evaluate_data.{a.id}").set_value("digits")
    at.button[[b.label for b in at.button].index("Evaluate")].click()
    at.run()
    assert not at.exception
    assert any("no worker is serving the jobs queue" in e.value for e in at.error)


def test_compare_page_puts_the_runs_scores_on_the_same_data_side_by_side(page, engine, home):
    a, b = seed_run(engine, "alpha", spec=DIGITS_8), seed_run(engine, "beta", spec=DIGITS_8)
    stored(engine, a.id, "site-b", 0.91)
    stored(engine, b.id, "site-b", 0.87)
    at = page("compare.py", ids=f"{a.id},{b.id}")
    at.session_state["cmp.tab"] = "Summary"
    at.run()
    assert not at.exception
    table = next(d.value for d in at.dataframe if "dataset" in d.value.columns)
    assert table["dataset"].tolist() == ["site-b"]
    assert table["alpha: accuracy"].tolist() == [0.91] and table["beta: accuracy"].tolist() == [0.87]


def test_cli_evaluate_says_why_a_run_cannot_be_evaluated(engine, home):
    from typer.testing import CliRunner

    from app.cli import app

    bare = seed_run(engine, "bare", spec=DIGITS_8)
    result = CliRunner().invoke(app, ["evaluate", bare.id, "--data", "digits"])
    assert result.exit_code == 1 and "no ONNX export" in result.output
    result = CliRunner().invoke(app, ["evaluate", "nosuchrun", "--data", "digits"])
    assert result.exit_code == 2 and "no run 'nosuchrun'" in result.output
