"""Runs logged by people's own scripts through the MLflow client (db/external.py) on every page, as runs: the Run
page shows their params, tags, source, metrics and files, and says in a line what does not apply to them (no spec
to clone or resume, no worker to cancel them, no export or prediction); a lost one says its script fell silent. The
Runs page, the Overview and Compare list them beside torchdeck's runs; re-run, clone and cancel are refused."""

from __future__ import annotations

import hashlib
from datetime import timedelta

import pytest
import streamlit as st
from seeding import plotly_figures, seed_run
from sqlalchemy import update

from app.auth import local_user
from app.services import runs as run_service
from db import external, repo
from db.engine import connection_scope
from db.models import Run
from db.types import MetricPoint, utcnow

SOURCE = {
    "mlflow.source.name": "train_vit.py",
    "mlflow.source.git.commit": "0123456789abcdef0123456789abcdef01234567",
    "mlflow.user": "ana",
    "mlflow.runName": "vit-from-laptop",
    "team": "vision",
}


def script_run(engine, name: str = "vit-from-laptop", *, ended: str | None = "FINISHED", steps: int = 5):
    """A run as a script logs it through the MLflow client: its tags, params, a loss per step, and its end."""
    r = external.create_run(engine, owner="local", name=name, tags=SOURCE)
    points = [MetricPoint("train/loss", s, 2.0 / s) for s in range(1, steps + 1)]
    points += [MetricPoint("accuracy", s, 0.1 * s) for s in range(1, steps + 1)]
    external.log(engine, r.id, points=points, params={"lr": "0.01", "batch_size": "64", "optimizer": "adamw"})
    if ended:
        external.end(engine, r.id, ended)
    return repo.get_run(engine, r.id)


def _tab(at, label: str):
    at.session_state["run.tab"] = label
    return at.run()


def _text(at) -> str:
    """Everything the page wrote as text: markdown, captions, alerts."""
    parts = [*at.markdown, *at.caption, *at.info, *at.warning, *at.error, *at.success]
    return "\n".join(p.value for p in parts)


def _frames(at) -> list:
    return [d.value for d in at.dataframe]


def test_the_run_page_shows_a_script_runs_params_tags_source_and_metrics(page, engine):
    r = script_run(engine)
    at = page("run.py", id=r.id)
    assert not at.exception
    assert at.title[0].value == "vit-from-laptop"
    text = _text(at)
    assert "logged by a script through the MLflow client" in text
    assert "train\\_vit.py" in text or "train_vit.py" in text  # its script, as text
    assert "0123456789ab" in text and "ana" in text  # the git commit (short) and the user
    assert "no spec to clone, re-run or resume" in text  # said once, where the buttons would be
    labels = {b.label for b in at.button}
    assert not labels & {"Clone", "Re-run", "Cancel"} and "Compare…" in labels
    assert not any(n.key == f"run.seeds.{r.id}" for n in at.number_input)  # no "Repeat with k seeds" either
    assert "no worker, GPU or pre-flight of torchdeck's" in text
    figs = plotly_figures(at)
    assert "Loss" in figs and "accuracy" in figs  # its own key drawn too, on a chart of its own
    assert [t["name"] for t in figs["accuracy"]["data"] if t.get("name") == "accuracy"]
    at = _tab(at, "Parameters")
    assert not at.exception
    params = next(df for df in _frames(at) if "param" in df.columns)
    assert dict(zip(params["param"], params["value"])) == {"batch_size": "64", "lr": "0.01", "optimizer": "adamw"}
    tags = next(df for df in _frames(at) if "tag" in df.columns)
    assert dict(zip(tags["tag"], tags["value"])) == {"team": "vision"}  # the system tags are shown apart
    source = next(df for df in _frames(at) if "of the run" in df.columns)
    assert dict(zip(source["of the run"], source["value"]))["script"] == "train_vit.py"
    assert "no spec (YAML) to clone, re-run or resume" in _text(at) and not at.code  # no YAML
    assert not at.get("download_button") or all("spec" not in b.label for b in at.get("download_button"))


def test_its_other_tabs_say_in_a_line_what_does_not_apply(page, engine):
    r = script_run(engine)
    at = page("run.py", id=r.id)
    assert "No held-out test split of torchdeck's" in _text(at)
    for tab, said in (
        ("Diagnosis & evaluation", "Diagnosis and evaluation do not apply"),
        ("Samples", "No sample grid"),
        ("Artifacts", "Export now** does not apply"),
        ("Predict", "Predict does not apply"),
    ):
        at = _tab(at, tab)
        assert not at.exception, tab
        assert said in _text(at), tab
    assert not any("No problems found" in s.value for s in at.success)  # torchdeck's diagnosis never ran


def test_its_files_are_listed_by_path_and_downloadable(page, engine, home):
    r = script_run(engine)
    data = b"\x89PNG fake plot"
    path = home / "artifacts" / "runs" / r.id / "files" / "plots" / "loss.png"
    path.parent.mkdir(parents=True)
    path.write_bytes(data)
    digest = hashlib.sha256(data).hexdigest()
    meta = {"path": "plots/loss.png"}
    repo.add_artifact(engine, r.id, "file", path.as_uri(), size=len(data), sha256=digest, meta=meta)
    (path.parent / "notes.txt").write_bytes(b"hi")
    notes = (path.parent / "notes.txt").as_uri()
    repo.add_artifact(engine, r.id, "file", notes, size=2, meta={"path": "notes.txt"})
    at = _tab(page("run.py", id=r.id), "Artifacts")
    assert not at.exception
    text = _text(at)
    assert "plots/loss.png" in text and "notes.txt" in text  # both, by their paths (not only the newest "file")
    labels = [b.label for b in at.get("download_button")]
    assert labels.count("Download") == 2 and "Metrics as CSV" in labels
    assert sum(1 for link in at.get("page_link") if link.proto.label == "Shareable link") == 2


def test_a_running_script_run_cannot_be_cancelled_here_and_says_why(page, engine):
    r = script_run(engine, ended=None)
    at = page("run.py", id=r.id)
    assert not at.exception
    assert not any(b.label == "Cancel" for b in at.button)
    assert "torchdeck cannot cancel it" in _text(at)
    assert not at.get("progress")  # a script says nothing of its progress: no 0 % bar
    assert "last written" in _text(at)


def test_a_lost_script_run_says_its_script_fell_silent(page, engine):
    r = script_run(engine, ended=None)
    with connection_scope(engine, write=True) as conn:
        conn.execute(update(Run).where(Run.id == r.id).values(heartbeat_at=utcnow() - timedelta(minutes=42)))
    assert external.mark_silent(engine, 60) == [r.id]
    at = page("run.py", id=r.id)
    assert not at.exception
    warning = " ".join(w.value for w in at.warning)
    assert "Its script stopped writing at" in warning and "no word for 42 min" in warning
    assert "killed, or its machine went away" in warning and "running again if the script writes again" in warning
    assert "re-queued" not in warning and "worker" not in warning


def test_the_runs_page_and_the_overview_list_it_with_its_source(page, engine):
    seed_run(engine, "torchdeck-run", epochs=1)
    r = script_run(engine, ended=None)
    at = page("runs.py")
    assert not at.exception
    df = at.dataframe[0].value
    row = df[df["name"] == "vit-from-laptop"].iloc[0]
    assert row["worker"] == "script" and row["status"] == "running" and row["open"] == f"run?id={r.id}"
    assert df[df["name"] == "torchdeck-run"].iloc[0]["worker"] == "w1"
    st.cache_data.clear()
    at = page("overview.py")
    assert not at.exception
    running = next(d.value for d in at.dataframe if "run" in d.value and "vit-from-laptop" in set(d.value["run"]))
    row = running[running["run"] == "vit-from-laptop"].iloc[0]
    assert row["worker"] == "script" and row["device"] == "script"
    assert row["objective"] == "accuracy" and row["value"] == pytest.approx(0.5)  # the key it logs, live


def _compare_tab(at, label: str):
    at.session_state["cmp.tab"] = label
    return at.run()


def test_compare_shows_a_script_run_beside_a_torchdeck_run(page, engine):
    ours = seed_run(engine, "torchdeck-run", steps=5, epochs=1, lr=0.003)
    theirs = script_run(engine)
    at = page("compare.py", ids=f"{ours.id},{theirs.id}")
    assert not at.exception
    loss = plotly_figures(at)["train/loss"]
    assert {t["name"] for t in loss["data"] if t.get("name")} >= {"torchdeck-run", "vit-from-laptop"}
    at = _compare_tab(at, "Spec diff")
    assert not at.exception
    diff = at.dataframe[0].value.set_index("field")
    assert diff.loc["params.lr", "vit-from-laptop"] == "0.01" and diff.loc["params.lr", "torchdeck-run"] == "–"
    assert diff.loc["optim.lr", "torchdeck-run"] == "0.003" and diff.loc["optim.lr", "vit-from-laptop"] == "–"
    assert diff.loc["source.script", "vit-from-laptop"] == "train_vit.py"
    at = _compare_tab(at, "Summary")
    assert not at.exception
    table = at.dataframe[0].value.set_index("run")
    assert table.loc["vit-from-laptop", "lr"] == pytest.approx(0.01)  # its params.lr, as a number
    assert table.loc["torchdeck-run", "lr"] == pytest.approx(0.003)
    at = _compare_tab(at, "Hyperparameters")
    assert not at.exception


def test_clone_of_a_script_run_on_the_new_run_page_says_why_not(page, engine):
    r = script_run(engine)
    at = page("new_run.py", clone=r.id)
    assert not at.exception
    assert any("Cannot clone" in w.value and "no spec to clone" in w.value for w in at.warning)


def test_rerun_clone_and_cancel_of_a_script_run_are_refused_with_why(home, engine):
    done = script_run(engine)
    with pytest.raises(run_service.LoggedByScript, match="logged by a script through the MLflow client: it has no"):
        run_service.rerun(done.id, owner="local", engine=engine)
    with pytest.raises(ValueError, match="no spec to clone, re-run or resume"):  # what the pages catch
        run_service.spec_of(done)
    live = script_run(engine, "live", ended=None)
    with pytest.raises(run_service.LoggedByScript, match="torchdeck cannot cancel it"):
        run_service.cancel(live.id, engine=engine, by=local_user())
    assert repo.get_run(engine, live.id).status == "running" and not repo.get_run(engine, live.id).cancel_requested
    assert repo.list_runs(engine, limit=10).total == 2  # nothing was queued
    refused = run_service.refused_removal(live.id, by=local_user(), engine=engine)
    assert refused is not None and "still being logged by its script" in refused
    assert run_service.refused_removal(done.id, by=local_user(), engine=engine) is None  # delete still works
    assert repo.list_runs(engine, limit=10).total == 1


def test_a_script_run_lost_with_its_script_can_be_deleted(home, engine):
    gone = script_run(engine, "killed", ended=None)
    with engine.begin() as c:
        c.execute(update(Run).where(Run.id == gone.id).values(heartbeat_at=utcnow() - timedelta(hours=1)))
    external.mark_silent(engine, 60)
    assert repo.get_run(engine, gone.id).status == "lost"
    assert run_service.refused_removal(gone.id, by=local_user(), engine=engine) is None
    with pytest.raises(repo.RunNotFound):
        repo.get_run(engine, gone.id)
