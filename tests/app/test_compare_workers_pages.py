"""Compare (curves, parallel coordinates, spec diff, summary) and Workers (liveness, queue positions)."""

from __future__ import annotations

import pytest
from seeding import plotly_figures, seed_run

from db import repo

_figures = plotly_figures


def _tab(at, label: str):
    at.session_state["cmp.tab"] = label
    return at.run()


def test_compare_without_runs_explains_what_to_do(page):
    at = page("compare.py")
    assert not at.exception and any("Choose two or more runs" in i.value for i in at.info)


def test_compare_overlays_curves_diffs_specs_and_summarises(page, engine):
    a = seed_run(engine, "lr-1e-3", steps=20, epochs=2, lr=0.001, val_acc=0.90)
    b = seed_run(engine, "lr-1e-2", steps=20, epochs=2, lr=0.01, val_acc=0.95)
    at = page("compare.py", ids=f"{a.id},{b.id}")
    assert not at.exception
    figs = _figures(at)
    assert [t["name"] for t in figs["train/loss"]["data"]] == ["lr-1e-3", "lr-1e-2"]
    assert [t["y"][-1] for t in figs["val/acc"]["data"]] == pytest.approx([0.90, 0.95])
    assert "parallel" not in figs  # hidden tabs do not run
    at = _tab(at, "Hyperparameters")
    parallel = _figures(at)["parallel"]["data"][0]
    assert parallel["type"] == "parcoords"
    assert [d["label"] for d in parallel["dimensions"]] == ["optim.lr", "best val/acc"]
    at = _tab(at, "Spec diff")
    diff = next(d.value for d in at.dataframe if "field" in d.value.columns)
    assert list(diff["field"]) == ["optim.lr"] and list(diff.iloc[0])[1:] == ["0.001", "0.01"]
    at.toggle(key="cmp.diff_only").set_value(False).run()
    diff = next(d.value for d in at.dataframe if "field" in d.value.columns)
    assert len(diff) > 70 and "train.epochs" in list(diff["field"])
    at = _tab(at, "Summary")
    summary = next(d.value for d in at.dataframe if "best val/acc" in d.value.columns)
    assert list(summary["best val/acc"]) == pytest.approx([0.90, 0.95]) and list(summary["best epoch"]) == [2, 2]
    assert list(summary["parameters"]) == [71754, 71754]
    assert [d.label for d in at.get("download_button")] == ["Summary as CSV"]
    assert "Curves as CSV" in [d.label for d in _tab(at, "Curves").get("download_button")]


def test_compare_x_axis_by_epoch(page, engine):
    a, b = seed_run(engine, "a", steps=20, epochs=2), seed_run(engine, "b", steps=40, epochs=2)
    at = page("compare.py", ids=f"{a.id},{b.id}")
    at.segmented_control(key="cmp.xmode").set_value("epoch").run()
    val = _figures(at)["val/loss"]["data"]
    assert val[0]["x"] == pytest.approx([1, 2]) and val[1]["x"] == pytest.approx([1, 2])  # different steps, same epochs


def test_workers_empty_state(page):
    at = page("workers.py")
    assert any("No worker has registered yet" in i.value for i in at.info)
    assert any("The queue is empty" in c.value for c in at.caption)


def test_workers_devices_heartbeat_current_run_and_queue_positions(page, engine):
    running = seed_run(engine, "busy", status="running")
    repo.upsert_worker(engine, "gpu0@box", hostname="box", queues=["gpu", "cpu"],
                       devices=[{"kind": "gpu", "index": 0, "util": 87.0, "mem_mb": 5120.0}], current_run_id=running.id)
    q1 = seed_run(engine, "first", status="queued")
    q2 = seed_run(engine, "cpu-one", status="queued", spec={"device": "cpu"})
    q3 = seed_run(engine, "second", status="queued")
    at = page("workers.py")
    workers, queue = at.dataframe[0].value, at.dataframe[1].value
    row = workers.iloc[0]
    assert row["state"] == "alive" and row["devices"] == "GPU 0 87% 5,120 MB" and row["queues"] == "gpu, cpu"
    assert row["current run"] == f"run?id={running.id}" and row["heartbeat age"].endswith("s")
    positions = {r["id"]: (r["queue"], r["position"]) for _, r in queue.iterrows()}
    assert positions == {q1.id: ("gpu", 1), q2.id: ("cpu", 1), q3.id: ("gpu", 2)}
