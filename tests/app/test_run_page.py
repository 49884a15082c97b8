"""Run: status and progress, charts (incremental for running runs only), x-axis modes, diagnosis,
evaluation, events, artifacts with parity/latency, metrics CSV, cancel."""

from __future__ import annotations

import io

import pandas as pd
import pytest
import streamlit as st
from seeding import plotly_figures, seed_evaluation, seed_run

from app.live import series
from db import repo
from db.types import MetricPoint

_figures = plotly_figures


def _tab(at, label: str):
    """Open a tab of the Run page (only the open tab's content runs)."""
    at.session_state["run.tab"] = label
    return at.run()


def _trace(fig: dict, name: str) -> dict:
    return next(t for t in fig["data"] if t.get("name") == name)


def test_without_an_id_offers_recent_runs_and_an_unknown_id_says_so(page, engine):
    at = page("run.py")
    assert any("No runs yet" in i.value for i in at.info)
    r = seed_run(engine, "only")
    st.cache_data.clear()  # the listing is cached for two seconds
    at = page("run.py")
    at.selectbox(key="run.pick").set_value(r).run()
    assert at.title[0].value == "only"
    assert any("No run 'nope'" in e.value for e in page("run.py", id="nope").error)


def test_finished_run_shows_status_best_and_charts_by_step_and_epoch(page, engine):
    r = seed_run(engine, "done", steps=40, epochs=4, val_acc=0.96)
    at = page("run.py", id=r.id)
    assert not at.exception
    assert at.title[0].value == "done"
    assert any("completed" in m.value for m in at.markdown)
    assert at.metric[0].label == "best val/acc" and at.metric[0].value == "0.9600"
    figs = _figures(at)
    assert {"Loss", "Accuracy", "Epoch time (s)"} <= set(figs)
    assert _trace(figs["Loss"], "val/loss")["x"] == [10, 20, 30, 40]
    assert not any(run_id == r.id for _, run_id in series._registry()[1])  # a finished run is never polled
    at.segmented_control(key="run.xmode").set_value("epoch").run()
    val = _trace(_figures(at)["Loss"], "val/loss")
    assert val["x"] == pytest.approx([1, 2, 3, 4])
    assert _figures(at)["Loss"]["layout"]["uirevision"] == f"{r.id}:Loss:epoch"


def _whole(axis: dict) -> bool:
    """Ticks on whole numbers only: one a step (or an epoch), or Plotly's own spacing, never 421.5."""
    return axis.get("tickformat") == "d" or axis.get("dtick") == 1


def test_a_chart_of_one_point_has_whole_steps_and_epochs_on_its_axis(page, engine):
    r = seed_run(engine, "first-epoch", status="running", steps=420)
    repo.append_metrics(engine, r.id, [MetricPoint("val/acc", 421, 0.31, 1), MetricPoint("val/loss", 421, 1.9, 1)])
    at = page("run.py", id=r.id)
    axis = _figures(at)["Accuracy"]["layout"]["xaxis"]
    assert axis["dtick"] == 1 and axis["tickformat"] == "d"  # 420, 421, 422: not 421, 421.5, 422
    assert _whole(_figures(at)["Loss"]["layout"]["xaxis"])  # 420 steps: Plotly spaces them, on whole steps
    at.segmented_control(key="run.xmode").set_value("epoch").run()
    assert _figures(at)["Accuracy"]["layout"]["xaxis"]["dtick"] == 1  # epoch 1: one tick an epoch
    at.segmented_control(key="run.xmode").set_value("time").run()
    assert not _whole(_figures(at)["Accuracy"]["layout"]["xaxis"])  # seconds: fractions are fine


def test_running_run_fetches_only_new_points(page, engine, monkeypatch):
    r = seed_run(engine, "live", status="running", steps=30, epochs=1)
    calls = []
    real = series.repo.series_many  # what the shared series of a running run read

    def spy(engine, run_id, since, max_points=2000):
        calls.extend(since.items())
        return real(engine, run_id, since, max_points=max_points)

    monkeypatch.setattr(series.repo, "series_many", spy)
    at = page("run.py", id=r.id)
    assert ("train/loss", None) in calls
    assert any("Cancel" == b.label for b in at.button)
    assert at.get("progress")[0].proto.value == 50
    calls.clear()
    repo.append_metrics(engine, r.id, [MetricPoint("train/loss", s, 0.1, 2) for s in (31, 32)])
    at.run()
    assert ("train/loss", 30) in calls  # since the last step held: only the new points
    assert all(key == "train/loss" for key, _ in calls)  # and only of the series that grew
    loss = _trace(_figures(at)["Loss"], "train/loss")
    assert loss["x"][-2:] == [31, 32]


def test_val_f1_macro_is_drawn_per_epoch_on_the_accuracy_chart(page, engine):
    r = seed_run(engine, "f1", status="running", steps=30, epochs=3)
    repo.append_metrics(engine, r.id, [MetricPoint("val/f1_macro", e * 10, 0.3 * e, e) for e in (1, 2, 3)])
    f1 = _trace(_figures(page("run.py", id=r.id))["Accuracy"], "val/f1_macro")
    assert f1["x"] == [10, 20, 30] and f1["y"] == pytest.approx([0.3, 0.6, 0.9]) and f1["mode"] == "lines+markers"


def test_diagnosis_evaluation_and_event_log(page, engine):
    r = seed_run(engine, "diag", epochs=1)
    seed_evaluation(engine, r.id)
    at = _tab(page("run.py", id=r.id), "Diagnosis & evaluation")
    warnings = " ".join(w.value for w in at.warning)
    assert "loss_not_decreasing" in warnings and "What to do:" in warnings and "learning rate" in warnings
    figs = _figures(at)
    cm = figs["Confusion matrix (validation)"]["data"][0]
    assert cm["type"] == "heatmap" and cm["text"][0] == [5, 1, 0] and cm["z"][0][0] == pytest.approx(5 / 6)
    assert figs["Per-class accuracy (validation)"]["data"][0]["y"] == pytest.approx([0.83, 1.0, 0.8])
    events = next(d.value for d in at.dataframe if "message" in d.value.columns)
    assert "training loss is not decreasing" in list(events["message"])


def test_healthy_run_says_so_and_spec_is_shown_as_yaml(page, engine):
    r = seed_run(engine, "fine", epochs=1)
    at = _tab(page("run.py", id=r.id), "Diagnosis & evaluation")
    assert any("No problems found" in s.value for s in at.success)
    at = _tab(at, "Spec")
    assert any("optim:" in c.value and "lr: 0.001" in c.value for c in at.code)


def test_artifacts_with_parity_latency_downloads_and_export_form(page, engine, home):
    r = seed_run(engine, "exported", epochs=1)
    export = home / "artifacts" / "runs" / r.id / "export"
    export.mkdir(parents=True)
    (export / "model.onnx").write_bytes(b"onnx-bytes")
    meta = {
        "ok": True,
        "parity": {"max_abs_diff": 2e-6, "top1_agreement": 100.0, "passed": True},
        "latency_ms": {"b1": 0.21, "b32": 1.4},
    }
    repo.add_artifact(engine, r.id, "onnx", (export / "model.onnx").as_uri(), size=10, meta=meta)
    repo.add_artifact(engine, r.id, "checkpoint_best", "file:///etc/passwd", size=1)  # outside the data folders
    at = _tab(page("run.py", id=r.id), "Artifacts")
    parity = next(d.value for d in at.dataframe if "max |Δlogit|" in d.value.columns)
    assert parity.iloc[0]["max |Δlogit|"] == pytest.approx(2e-6) and parity.iloc[0]["latency b32 (ms)"] == 1.4
    labels = [b.label for b in at.get("download_button")]
    assert labels.count("Download") == 1 and "Metrics as CSV" in labels and "Metrics as JSON Lines" in labels
    assert any("not on this machine" in c.value for c in at.caption)
    assert at.multiselect(key=f"run.export_fmt.{r.id}").value == ["onnx"]  # what the run exported before
    assert any(b.label == "Export now" for b in at.button)


def test_metrics_csv_holds_every_point(page, engine):
    r = seed_run(engine, "csv", steps=25, epochs=5)
    page("run.py", id=r.id)  # the engine and caches of the page
    from app.ui import queries

    df = pd.read_csv(io.BytesIO(queries.metrics_csv(r.id)))
    assert set(df.columns) == {"key", "step", "epoch", "value", "wall_time"}
    assert len(df[df.key == "train/loss"]) == 25 and len(df[df.key == "val/acc"]) == 5
    lines = pd.read_json(io.BytesIO(queries.metrics_jsonl(r.id)), lines=True)
    assert set(lines.columns) == {"key", "step", "epoch", "value", "wall_time"}
    assert len(lines[lines.key == "train/loss"]) == 25 and len(lines) == len(df)


def test_cancel_from_the_run_page(page, engine):
    r = seed_run(engine, "live", status="running", steps=5)
    at = page("run.py", id=r.id)
    next(b for b in at.button if b.label == "Cancel").click()
    at.run()
    assert repo.get_run(engine, r.id).cancel_requested
    assert any("Cancel requested" in i.value for i in at.info)


def test_artifact_link_serves_by_id_and_refuses_paths_and_unknown_ids(page, engine, home):
    r = seed_run(engine, "shared")
    export = home / "artifacts" / "runs" / r.id / "export"
    export.mkdir(parents=True)
    (export / "model.onnx").write_bytes(b"onnx-bytes")
    art = repo.add_artifact(engine, r.id, "onnx", (export / "model.onnx").as_uri(), size=10, meta={})
    at = page("artifact.py", id=art.id)
    assert not at.exception and not at.error
    assert [b.label for b in at.get("download_button")] == ["Download"]
    assert any("model.onnx" in m.value for m in at.markdown)
    for bad in ("../../etc/passwd", "/etc/passwd", "runs/x/model.onnx"):
        at = page("artifact.py", id=bad)
        assert at.error and "Refused" in at.error[0].value and "path" in at.error[0].value
        assert not at.get("download_button")
    at = page("artifact.py", id="nosuchid")
    assert at.error and "no artifact with id" in at.error[0].value and not at.get("download_button")
    outside = repo.add_artifact(engine, r.id, "checkpoint_best", "file:///etc/passwd", size=1)
    at = page("artifact.py", id=outside.id)
    assert at.error and "outside this installation" in at.error[0].value and not at.get("download_button")
