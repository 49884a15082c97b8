"""Compare, live: the curves refresh in place while a selected run is active and are drawn statically once
none is; log-scale and x-axis (relative and wall time) choices; the parallel plot's chosen hyperparameters;
the summary's best/min/max/last of the objective; the curves CSV at full fidelity (every stored point)."""

from __future__ import annotations

import io
from datetime import datetime

import pandas as pd
import pytest
import streamlit as st
from seeding import plotly_figures, seed_run

from app.ui import compare_view as cv
from app.ui import queries
from db import repo
from db.types import MetricPoint


@pytest.fixture
def fragments(monkeypatch):
    """The run_every of each st.fragment the Compare page makes (the real fragment still runs; the frame's
    own, around every page, left out)."""
    made: list[float | None] = []
    real = st.fragment

    def spy(func=None, *, run_every=None):
        if func is not None and func.__module__ != "app.ui.frame":
            made.append(run_every)
        return real(func, run_every=run_every)

    monkeypatch.setattr(st, "fragment", spy)
    return made


def _live_charts(at) -> int:
    return sum(el.proto.component_name.endswith("torchdeck_live_chart") for el in at.get("component_instance"))


def _tab(at, label: str):
    at.session_state["cmp.tab"] = label
    return at.run()


def test_curves_refresh_in_place_while_a_run_is_active_and_are_static_once_none_is(page, engine, fragments):
    done = seed_run(engine, "done", steps=20, epochs=2)
    live = seed_run(engine, "live", status="running", steps=20, epochs=1)
    at = page("compare.py", ids=f"{done.id},{live.id}")
    assert not at.exception
    assert fragments == [queries.REFRESH_S]  # the curves section refreshes on a timer
    assert _live_charts(at) == 1 and not at.get("plotly_chart")  # drawn by the in-place live-chart component
    loss = {t["name"]: t for t in plotly_figures(at)["train/loss"]["data"]}
    assert loss["live"]["x"][-1] == 20

    repo.append_metrics(engine, live.id, [MetricPoint("train/loss", s, 0.5, 1) for s in (21, 22)])
    at.run()
    loss = {t["name"]: t for t in plotly_figures(at)["train/loss"]["data"]}
    assert loss["live"]["x"][-2:] == [21, 22] and loss["done"]["x"][-1] == 20  # the new points are drawn

    repo.finish_run(engine, live.id, "completed", summary={"status": "completed"})
    fragments.clear()
    at.run()
    assert not at.exception
    assert fragments == [] and _live_charts(at) == 0  # nothing refreshes any more
    assert "train/loss" in plotly_figures(at) and len(at.get("plotly_chart")) >= 1


def test_a_queued_run_keeps_the_curves_live(page, engine, fragments):
    done = seed_run(engine, "done", steps=20, epochs=2)
    queued = seed_run(engine, "waiting", status="queued")
    page("compare.py", ids=f"{done.id},{queued.id}")
    assert fragments == [queries.REFRESH_S]


def test_all_finished_runs_are_drawn_statically(page, engine, fragments):
    a, b = seed_run(engine, "a", steps=20, epochs=2), seed_run(engine, "b", steps=20, epochs=2)
    at = page("compare.py", ids=f"{a.id},{b.id}")
    assert fragments == [] and _live_charts(at) == 0 and {"train/loss", "val/acc"} <= set(plotly_figures(at))


def test_log_scale_toggle_makes_the_y_axis_logarithmic_grouped_or_not(page, engine):
    a, b = seed_run(engine, "a", steps=20, epochs=2), seed_run(engine, "b", steps=20, epochs=2)
    at = page("compare.py", ids=f"{a.id},{b.id}")
    assert plotly_figures(at)["train/loss"]["layout"].get("yaxis", {}).get("type") != "log"
    at.toggle(key="cmp.log_y").set_value(True).run()
    assert {fig["layout"]["yaxis"].get("type") for fig in plotly_figures(at).values()} == {"log"}
    at.segmented_control(key="cmp.group_by").set_value("tag").run()
    assert not at.exception
    assert plotly_figures(at)["val/loss"]["layout"]["yaxis"]["type"] == "log"


def test_x_axis_by_relative_and_by_wall_time(page, engine):
    a, b = seed_run(engine, "a", steps=20, epochs=2), seed_run(engine, "b", steps=20, epochs=2)
    at = page("compare.py", ids=f"{a.id},{b.id}")
    assert at.segmented_control(key="cmp.xmode").options == ["step", "epoch", "relative time", "wall time"]
    at.segmented_control(key="cmp.xmode").set_value("time").run()
    fig = plotly_figures(at)["val/loss"]
    assert fig["layout"]["xaxis"]["title"]["text"] == "seconds since start"
    assert all(0 <= x < 600 for t in fig["data"] for x in t["x"])  # seconds since each run's own start
    at.segmented_control(key="cmp.xmode").set_value("wall").run()
    fig = plotly_figures(at)["val/loss"]
    assert fig["layout"]["xaxis"]["type"] == "date"
    started = {a.name: a.started_at, b.name: b.started_at}
    for trace in fig["data"]:
        first = datetime.fromisoformat(trace["x"][0])
        assert abs((first - started[trace["name"]].replace(tzinfo=None)).total_seconds()) < 600


def _many_fields(i: int) -> dict:
    return {
        "seed": 40 + i,
        "data": {"name": "digits", "image_size": 16 + 8 * i, "val_fraction": 0.1 + 0.1 * i, "limit": 100 + 100 * i},
        "model": {"dropout": 0.1 * i},
        "train": {"epochs": 3 + i, "batch_size": 32 * (i + 1), "label_smoothing": 0.05 * i, "log_every": 10 + 10 * i},
    }


def test_choosing_the_hyperparameters_of_the_parallel_plot(page, engine):
    runs = [
        seed_run(engine, f"r{i}", steps=10, epochs=2, lr=0.001 * (i + 1), spec=_many_fields(i), val_acc=0.8 + 0.05 * i)
        for i in range(2)
    ]
    at = _tab(page("compare.py", ids=",".join(r.id for r in runs)), "Hyperparameters")
    assert not at.exception
    axes = at.multiselect(key="cmp.pc_axes")
    assert len(axes.options) == 10 and "seed" in axes.options and len(axes.value) == 8  # the first 8 by default
    dims = [d["label"] for d in plotly_figures(at)["parallel"]["data"][0]["dimensions"]]
    assert dims == [*axes.value, "best val/acc"] and "seed" not in dims
    at.multiselect(key="cmp.pc_axes").set_value(["seed", "optim.lr"]).run()
    parallel = plotly_figures(at)["parallel"]["data"][0]
    assert [d["label"] for d in parallel["dimensions"]] == ["seed", "optim.lr", "best val/acc"]
    assert list(parallel["dimensions"][0]["values"]) == [40, 41]


def test_summary_shows_best_min_max_and_last_of_the_objective(page, engine):
    r = seed_run(engine, "dips", status="running", steps=20, epochs=2, val_acc=0.9)  # val/acc 0.45 then 0.9
    repo.append_metrics(engine, r.id, [MetricPoint("val/acc", 30, 0.7, 3), MetricPoint("val/loss", 30, 0.6, 3)])
    repo.finish_run(
        engine,
        r.id,
        "completed",
        summary={"status": "completed", "best": {"metric": "val/acc", "value": 0.9, "epoch": 2}},
    )
    other = seed_run(engine, "steady", steps=20, epochs=2, val_acc=0.8)
    at = _tab(page("compare.py", ids=f"{r.id},{other.id}"), "Summary")
    assert not at.exception
    assert at.selectbox(key="cmp.objective").value == "val/acc"  # the metric the runs monitor
    table = at.dataframe[0].value.set_index("run")
    assert table.loc["dips", ["best", "min", "max", "last"]].tolist() == pytest.approx([0.9, 0.45, 0.9, 0.7])
    assert table.loc["steady", ["best", "min", "max", "last"]].tolist() == pytest.approx([0.8, 0.4, 0.8, 0.8])
    at.selectbox(key="cmp.objective").set_value("val/loss").run()
    table = at.dataframe[0].value.set_index("run")
    assert set(table["objective"]) == {"val/loss"}
    assert table.loc["dips", ["best", "min", "max", "last"]].tolist() == pytest.approx([0.5, 0.5, 1.0, 0.6])


@pytest.fixture
def csv_clicks(monkeypatch):
    """What each Curves-as-CSV button would serve when clicked (the page builds the file on click)."""
    built = []
    real = cv.csv_builder

    def spy(*args, **kwargs):
        build = real(*args, **kwargs)
        built.append(build)
        return build

    monkeypatch.setattr(cv, "csv_builder", spy)
    return built


def test_curves_csv_holds_every_stored_point_not_the_downsampled_lines(page, engine, csv_clicks):
    long = seed_run(engine, "long", steps=5000, epochs=2)
    short = seed_run(engine, "short", steps=20, epochs=2)
    at = page("compare.py", ids=f"{long.id},{short.id}")
    assert "Curves as CSV" in [d.label for d in at.get("download_button")]
    drawn = {t["name"]: len(t["x"]) for t in plotly_figures(at)["train/loss"]["data"]}
    assert drawn["long"] <= 1000  # the chart is downsampled …
    table = pd.read_csv(io.BytesIO(csv_clicks[-1]()))
    counts = table.groupby(["run", "key"]).size().to_dict()
    assert counts[("long", "train/loss")] == 5000 and counts[("short", "train/loss")] == 20  # … the CSV is not
    assert counts[("long", "val/acc")] == 2 and ("long", "epoch_time_s") not in counts  # the chosen metrics only
    long_loss = table[(table["run"] == "long") & (table["key"] == "train/loss")]
    assert list(long_loss["step"]) == list(range(1, 5001))
    assert {"epoch", "wall_time"} <= set(table.columns)


def test_grouped_curves_csv_names_each_runs_group(page, engine, csv_clicks):
    a = seed_run(engine, "a", steps=20, epochs=2, tags=("base",))
    b = seed_run(engine, "b", steps=20, epochs=2, tags=("base",))
    at = page("compare.py", ids=f"{a.id},{b.id}")
    at.segmented_control(key="cmp.group_by").set_value("tag").run()
    table = pd.read_csv(io.BytesIO(csv_clicks[-1]()))
    assert set(table["group"]) == {"tag base"} and len(table[table["key"] == "train/loss"]) == 40
