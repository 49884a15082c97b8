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


def test_workers_devices_heartbeat_current_run_and_queue_positions(page, engine, monkeypatch):
    monkeypatch.setenv("TORCHDECK_STALE_AFTER_S", "3600")  # the planted worker stays live however slow the page
    running = seed_run(engine, "busy", status="running")
    repo.upsert_worker(
        engine,
        "gpu0@box",
        hostname="box",
        queues=["gpu", "cpu"],
        devices=[{"kind": "gpu", "index": 0, "util": 87.0, "mem_mb": 5120.0}],
        current_run_id=running.id,
    )
    q1 = seed_run(engine, "first", status="queued")
    q2 = seed_run(engine, "cpu-one", status="queued", spec={"device": "cpu"})
    q3 = seed_run(engine, "second", status="queued")
    at = page("workers.py")
    workers, queue = at.dataframe[0].value, at.dataframe[1].value
    row = workers.iloc[0]
    assert row["state"] == "alive" and row["devices"] == "GPU 0 87% 5,120 MB" and row["queues"] == "gpu, cpu"
    assert row["current run"] == f"run?id={running.id}" and row["heartbeat age"].endswith("s")
    positions = {r["open"].removeprefix("run?id="): (r["queue"], r["position"]) for _, r in queue.iterrows()}
    assert positions == {q1.id: ("gpu", 1), q2.id: ("cpu", 1), q3.id: ("gpu", 2)}
    assert all(w.startswith("normal priority; local has ") for w in queue["why"])  # the Overview's words


def _heard_from(engine, worker_id: str, seconds_ago: float) -> None:
    from datetime import timedelta

    from sqlalchemy import update

    from db.models import Worker
    from db.types import utcnow

    with engine.begin() as conn:
        conn.execute(
            update(Worker).where(Worker.id == worker_id).values(heartbeat_at=utcnow() - timedelta(seconds=seconds_ago))
        )


def test_the_workers_page_and_doctor_agree_on_who_is_alive(page, engine, monkeypatch):
    """One limit, TORCHDECK_STALE_AFTER_S, for the page, `torchdeck doctor` and the queue's warnings."""
    from app.cli.doctor_workers import check_workers
    from app.services.broker import queue_status

    monkeypatch.setenv("TORCHDECK_STALE_AFTER_S", "120")  # a slow shared machine: heartbeats can lag a minute
    for worker, ago in (("cpu@slow", 60), ("cpu@gone", 300)):
        repo.upsert_worker(engine, worker, hostname="box", queues=["cpu"], devices=[{"kind": "cpu", "cores": 4}])
        _heard_from(engine, worker, ago)
    at = page("workers.py")
    workers = at.dataframe[0].value
    assert dict(zip(workers["worker"], workers["state"], strict=True)) == {"cpu@slow": "alive", "cpu@gone": "silent"}
    assert [c.name for c in check_workers(engine) if c.name.startswith("worker ")] == ["worker cpu@slow"]
    assert [w.id for w in queue_status("cpu", engine).workers] == ["cpu@slow"]


def test_a_cpu_only_worker_takes_cpu_runs_and_an_idle_one_shows_a_dash_for_its_run(page, engine):
    """`make up` on a machine without a GPU: one worker consuming gpu and cpu, which runs everything on its CPU."""
    repo.upsert_worker(
        engine, "cpu@laptop", hostname="laptop", queues=["gpu", "cpu"], devices=[{"kind": "cpu", "cores": 8}]
    )
    repo.upsert_worker(engine, "jobs@laptop", hostname="laptop", queues=["jobs"], devices=[{"kind": "cpu", "cores": 8}])
    at = page("workers.py")
    shown = at.dataframe[0]
    takes = dict(zip(shown.value["worker"], shown.value["takes"], strict=True))
    assert takes == {
        "cpu@laptop": "CPU runs (the gpu queue's too, on its CPU)",
        "jobs@laptop": "no runs (dashboard jobs)",
    }
    assert shown.value["current run"].isna().all() and shown.proto.placeholder == "–"  # idle: a dash, not "None"


def test_doctor_agrees_with_the_workers_page_on_the_local_worker_without_a_gpu(engine, monkeypatch):
    """`torchdeck doctor` after `make up` on a laptop: its worker consumes gpu and cpu and sees no GPU. In local mode
    that is the default, and the doctor says what the Workers page says (it takes CPU runs, the gpu queue's too, on
    its CPU) as a note, and passes; where GPUs are expected (team mode) the same worker is a failure with the fix."""
    from app.cli.doctor_workers import check_workers

    repo.upsert_worker(
        engine, "cpu@laptop", hostname="laptop", queues=["gpu", "cpu"], devices=[{"kind": "cpu", "cores": 8}]
    )
    repo.upsert_worker(engine, "jobs@laptop", hostname="laptop", queues=["jobs"], devices=[{"kind": "cpu", "cores": 8}])
    seed_run(engine, "on-the-gpu-queue", status="queued", spec={"device": "auto"})
    monkeypatch.delenv("TORCHDECK_MODE", raising=False)
    local = {c.name: c for c in check_workers(engine)}
    laptop = local["worker cpu@laptop"]
    assert all(c.ok for c in local.values()), [ln for c in local.values() for ln in c.lines()]
    assert "takes CPU runs (the gpu queue's too, on its CPU)" in laptop.detail
    assert any("trains those runs on its CPU" in n for n in laptop.notes)
    monkeypatch.setenv("TORCHDECK_MODE", "team")
    team = {c.name: c for c in check_workers(engine)}["worker cpu@laptop"]
    assert team.ok is False and "consumes a gpu queue but sees no GPU" in team.fix and not team.notes


def test_compare_curves_of_one_point_have_whole_steps_and_epochs(page, engine):
    from db.types import MetricPoint

    a, b = seed_run(engine, "a", status="running"), seed_run(engine, "b", status="running")
    for r in (a, b):
        repo.append_metrics(engine, r.id, [MetricPoint("val/acc", 421, 0.3, 1), MetricPoint("train/loss", 421, 2.0, 1)])
    at = page("compare.py", ids=f"{a.id},{b.id}")
    assert _figures(at)["val/acc"]["layout"]["xaxis"]["dtick"] == 1  # 420, 421, 422: never 421.5
    at.segmented_control(key="cmp.xmode").set_value("epoch").run()
    assert _figures(at)["val/acc"]["layout"]["xaxis"]["dtick"] == 1
    at.segmented_control(key="cmp.group_by").set_value("tag").run()  # one band for the untagged runs
    assert _figures(at)["val/acc"]["layout"]["xaxis"]["dtick"] == 1


def test_a_train_loss_objective_is_summarised_from_its_per_epoch_values(page, engine):
    """Runs monitoring train/loss: their objective's best, min, max and last are those of its per-epoch value
    (train/epoch_loss, the catalog's stored key), never of the noisy per-step series."""
    from db.types import MetricPoint

    runs = []
    for name, epochs in (("a", (2.0, 1.5)), ("b", (1.8, 1.2))):
        r = seed_run(
            engine, name, status="running", spec={"train": {"epochs": 2, "early_stopping": {"monitor": "train/loss"}}}
        )
        repo.append_metrics(
            engine,
            r.id,
            [MetricPoint("train/loss", s, v, 1) for s, v in ((1, 9.0), (2, 0.01), (3, 5.0))]
            + [MetricPoint("train/epoch_loss", 3 * e, v, e) for e, v in enumerate(epochs, 1)],
        )
        repo.finish_run(
            engine, r.id, "completed", summary={"best": {"metric": "train/loss", "value": epochs[-1], "epoch": 2}}
        )
        runs.append(r)
    at = _tab(page("compare.py", ids=",".join(r.id for r in runs)), "Summary")
    table = at.dataframe[0].value.set_index("run")
    assert (
        table.loc["a", "objective"],
        table.loc["a", "best"],
        table.loc["a", "min"],
        table.loc["a", "max"],
        table.loc["a", "last"],
    ) == ("train/loss", 1.5, 1.5, 2.0, 1.5)  # not 0.01, 0.01, 9.0, 5.0
    at.segmented_control(key="cmp.group_by").set_value("tag").run()
    grouped = at.dataframe[0].value.iloc[0]
    assert grouped["objective"] == "train/loss" and grouped["last"].startswith("1.3500 ± ")  # mean of 1.5 and 1.2
