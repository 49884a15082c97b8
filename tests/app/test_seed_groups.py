"""Seed groups and sweeps on the pages: Compare grouped (one mean curve with a ± std band, mean ± std (n)
cells), the Runs page filtered by sweep (`?sweep=`) and grouped (one row per sweep and per seed group), and
the Run page's sweep and group links and Repeat with k seeds."""

from __future__ import annotations

import html
import json

import pytest
from markdown_view import shown
from seeding import DIGITS, plotly_figures, seed_run

from core.config import RunSpec
from db import repo
from db.types import MetricPoint
from sweep.spec import SweepSpec

EPOCHS = 3
ACCS = (0.90, 0.92, 0.94)  # mean 0.92, sample std 0.02


def _spec(seed: int = 42, lr: float = 0.001) -> dict:
    return RunSpec.model_validate({**DIGITS, "seed": seed, "optim": {"lr": lr}}).model_dump(mode="json")


def _complete(engine, run_id: str, val_acc: float, status: str = "completed") -> None:
    """Train it as a worker would: val/loss and val/acc per epoch (val/acc rising to val_acc), then finish."""
    repo.claim_run(engine, run_id, "w1", device="cpu")
    points = []
    for e in range(1, EPOCHS + 1):
        points += [
            MetricPoint("val/acc", 10 * e, val_acc * e / EPOCHS, epoch=e),
            MetricPoint("val/loss", 10 * e, 1.0 / e + val_acc, epoch=e),
        ]
    repo.append_metrics(engine, run_id, points)
    repo.finish_run(
        engine,
        run_id,
        status,
        summary={
            "best": {"metric": "val/acc", "value": val_acc, "epoch": EPOCHS},
            "epochs_run": EPOCHS,
            "wall_time_s": 10.0,
        },
    )


def _seed_group(engine, name: str = "base", accs=ACCS) -> list:
    group = repo.new_group_id()
    runs = []
    for i, acc in enumerate(accs):
        r = repo.create_run(
            engine, _spec(seed=42 + i), name=name if i == 0 else f"{name} seed {42 + i}", group_id=group
        )
        _complete(engine, r.id, acc)
        runs.append(repo.get_run(engine, r.id))
    return runs


def _sweep(engine, name: str = "lr-search", accs=((0.80, 0.82), (0.95, 0.97))):
    """A sweep of len(accs) trials with two seeds each, every run completed with the given val/acc."""
    spec = SweepSpec.model_validate(
        {
            "base": _spec(),
            "space": {"optim.lr": {"choice": [0.001, 0.01]}},
            "method": "grid",
            "seeds": 2,
            "objective": {"metric": "val/acc"},
        }
    )
    sweep = repo.create_sweep(engine, spec.model_dump(mode="json", by_alias=True), name=name, owner="local")
    runs = []
    for number, (lr, trial_accs) in enumerate(zip((0.001, 0.01), accs, strict=True)):
        created = repo.add_trial(
            engine,
            sweep,
            number,
            {"optim.lr": lr},
            {},
            [(_spec(seed=42 + i, lr=lr), f"{name} #{number} seed {i + 1}/2") for i in range(2)],
        )
        for r, acc in zip(created, trial_accs, strict=True):
            _complete(engine, r.id, acc)
            runs.append(repo.get_run(engine, r.id))
    return sweep, runs


def _click(at, label: str):
    next(b for b in at.button if b.label == label).click()
    return at.run()


# --- Compare ---------------------------------------------------------------------------------------------
def test_compare_grouped_by_seed_group_draws_a_band_and_summarises_mean_std(page, engine):
    group = _seed_group(engine)
    lone = seed_run(engine, "lone", steps=30, epochs=EPOCHS, val_acc=0.80)
    at = page("compare.py", ids=",".join([r.id for r in group] + [lone.id]))
    assert [t["name"] for t in plotly_figures(at)["val/acc"]["data"]] == [
        "base",
        "base seed 43",
        "base seed 44",
        "lone",
    ]
    at.segmented_control(key="cmp.group_by").set_value("seed group").run()
    assert not at.exception
    data = plotly_figures(at)["val/acc"]["data"]
    bands = [t for t in data if t.get("fill") == "toself"]
    lines = [t for t in data if t.get("fill") != "toself"]
    assert len(bands) == 2 and [t["name"] for t in lines] == [
        "base ×3",
        "lone",
    ]  # a band per group, the lone run's flat
    assert lines[0]["x"] == [10, 20, 30] and lines[0]["y"] == pytest.approx([0.92 * e / 3 for e in (1, 2, 3)])
    upper, lower = bands[0]["y"][2], bands[0]["y"][3]  # the band's last x, on its way out and back
    assert upper - lower == pytest.approx(2 * 0.02)
    at.session_state["cmp.tab"] = "Summary"
    at.run()
    table = at.dataframe[0].value
    row = table[table["group"] == "base"].iloc[0]
    assert row["runs"] == 3 and row["status"] == "completed" and row["objective"] == "val/acc"
    assert row["best"] == "0.9200 ± 0.0200 (n=3)" and row["last"] == "0.9200 ± 0.0200 (n=3)"
    assert row["best val/acc"] == "0.9200 ± 0.0200 (n=3)"
    assert table[table["group"] == "lone"].iloc[0]["best"] == "0.8000"
    assert [d.label for d in at.get("download_button")] == ["Summary as CSV"]


def test_compare_link_of_a_seed_group_opens_grouped_and_ungrouping_restores_the_runs(page, engine):
    group = _seed_group(engine)
    at = page("compare.py", ids=",".join(r.id for r in group), group="seed")
    assert at.segmented_control(key="cmp.group_by").value == "seed group"
    assert [t["name"] for t in plotly_figures(at)["val/loss"]["data"] if t.get("fill") != "toself"] == ["base ×3"]
    at.segmented_control(key="cmp.group_by").set_value("none").run()
    assert not any(t.get("fill") for t in plotly_figures(at)["val/loss"]["data"])
    assert "Curves as CSV" in [d.label for d in at.get("download_button")]


def test_compare_grouped_by_sweep_and_by_tag(page, engine):
    sweep, runs = _sweep(engine)
    tagged = seed_run(engine, "tagged", epochs=EPOCHS, tags=("baseline",))
    at = page("compare.py", ids=",".join([r.id for r in runs] + [tagged.id]))
    at.segmented_control(key="cmp.group_by").set_value("sweep").run()
    lines = [t["name"] for t in plotly_figures(at)["val/acc"]["data"] if t.get("fill") != "toself"]
    assert lines == ["sweep lr-search ×4", "tagged"]
    at.segmented_control(key="cmp.group_by").set_value("tag").run()
    lines = [t["name"] for t in plotly_figures(at)["val/acc"]["data"] if t.get("fill") != "toself"]
    assert lines == ["no tag ×4", "tag baseline"]


# --- Runs ------------------------------------------------------------------------------------------------
def test_runs_page_filters_by_sweep_from_the_url(page, engine):
    sweep, runs = _sweep(engine)
    _sweep(engine, "other-search")
    seed_run(engine, "loose")
    at = page("runs.py", sweep=sweep.id)
    assert not at.exception
    assert at.selectbox(key="runs.sweep").value == sweep.id
    assert sorted(at.dataframe[0].value["name"]) == sorted(r.name for r in runs)
    at.selectbox(key="runs.sweep").set_value(None).run()
    assert len(at.dataframe[0].value) == 9 and "sweep" not in at.query_params


def test_runs_page_groups_sweeps_and_seed_groups_and_lists_a_rows_runs(page, engine):
    sweep, sweep_runs = _sweep(engine)
    group = _seed_group(engine)
    seed_run(engine, "lone", status="pruned")
    at = page("runs.py")
    at.toggle(key="runs.group").set_value(True).run()
    assert not at.exception
    df = at.dataframe[0].value
    assert list(df["kind"]) == ["run", "seed group", "sweep"]  # newest first
    assert any("8 run(s) match in 3 row(s)" in c.value for c in at.caption)
    rows = {row["kind"]: row for _, row in df.iterrows()}
    assert rows["run"]["name"] == "lone" and rows["run"]["status"] == "pruned"
    assert rows["seed group"]["name"] == "base" and rows["seed group"]["size"] == "3 runs"
    assert rows["seed group"]["best"] == "val/acc 0.9200 ± 0.0200 (n=3)"
    assert rows["seed group"]["open"] == f"compare?ids={','.join(r.id for r in group)}&group=seed&project=default"
    assert rows["sweep"]["name"] == "lr-search" and rows["sweep"]["size"] == "2 trials · 4 runs"
    assert rows["sweep"]["best"] == "val/acc 0.9600 ± 0.0141 (n=2) · trial 1"
    assert rows["sweep"]["open"] == f"sweep?id={sweep.id}"
    at.session_state["runs.gtable"] = {"selection": {"rows": [1], "columns": [], "cells": []}}
    at.run()
    assert any("base: 3 run(s)" in e.label for e in at.expander)
    assert sorted(at.dataframe[1].value["name"]) == sorted(r.name for r in group)
    at = _click(at, "Compare")  # a selected row selects its runs
    assert at.title[0].value == "Compare" and set(at.multiselect(key="cmp.ids").value) == {r.id for r in group}


def test_runs_page_grouped_within_one_sweep_shows_its_seed_groups(page, engine):
    sweep, runs = _sweep(engine)
    at = page("runs.py", sweep=sweep.id)
    at.toggle(key="runs.group").set_value(True).run()
    df = at.dataframe[0].value
    assert list(df["kind"]) == ["seed group", "seed group"] and list(df["size"]) == ["2 runs", "2 runs"]
    assert list(df["best"]) == ["val/acc 0.9600 ± 0.0141 (n=2)", "val/acc 0.8100 ± 0.0141 (n=2)"]


def test_runs_page_grouped_pages_rows_in_the_database(page, engine):
    spec = _spec()
    for i in range(60):
        repo.create_run(engine, spec, name=f"run-{i:03d}")
    group = repo.new_group_id()
    for i in range(30):
        repo.create_run(engine, _spec(seed=100 + i), name=f"seeded-{i:02d}", group_id=group)
    at = page("runs.py")
    at.toggle(key="runs.group").set_value(True).run()
    assert any("90 run(s) match in 61 row(s) · showing 1–50" in c.value for c in at.caption)
    assert list(at.dataframe[0].value["name"])[:2] == ["seeded-00", "run-059"]  # the group's newest run sorts it
    at.pagination[0].set_value(2).run()
    assert any("showing 51–61" in c.value for c in at.caption)
    assert list(at.dataframe[0].value["name"])[-1] == "run-000"


def test_runs_page_grouped_costs_the_same_queries_for_three_rows_as_for_twelve(page, engine):
    """The rows' runs and sweeps are read for the whole page at once, not with a query or two per row."""
    import streamlit as st
    from sqlalchemy import event

    from app.ui import queries

    def selects() -> tuple[int, int]:
        st.cache_data.clear()
        seen = []
        count = lambda *a: seen.append(a[2]) if a[2].lstrip().upper().startswith("SELECT") else None  # noqa: E731
        shared = queries.engine()  # the pages' engine: one per database URL for the process
        event.listen(shared, "before_cursor_execute", count)
        try:
            at = page("runs.py")
            at.toggle(key="runs.group").set_value(True).run()
            seen.clear()
            st.cache_data.clear()
            at.run()  # one refresh of the grouped page, nothing cached
        finally:
            event.remove(shared, "before_cursor_execute", count)
        assert not at.exception
        return len(seen), len(at.dataframe[0].value)

    _sweep(engine)
    _seed_group(engine)
    seed_run(engine, "lone")
    few, rows = selects()
    assert rows == 3
    for i in range(3):
        _sweep(engine, f"search-{i}")
        _seed_group(engine, f"group-{i}")
        seed_run(engine, f"lone-{i}")
    many, rows = selects()
    assert rows == 12
    assert many == few, (few, many)  # nothing per row


# --- Run -------------------------------------------------------------------------------------------------
def test_run_page_links_its_sweep_and_seed_group(page, engine):
    sweep, runs = _sweep(engine)
    at = page("run.py", id=runs[2].id)
    lineage = next(c.value for c in at.caption if "of sweep" in c.value)
    assert f"[trial 1 of sweep lr-search](sweep?id={sweep.id})" in lineage
    assert f"seed group of 2 runs](compare?ids={runs[2].id},{runs[3].id}&group=seed&project=default)" in lineage


def test_repeat_with_three_seeds_queues_two_runs_in_the_runs_group(page, engine, broker):
    r = seed_run(engine, "base", epochs=EPOCHS, spec={"device": "cpu"})
    at = page("run.py", id=r.id)
    assert at.number_input(key=f"run.seeds.{r.id}").value == 3
    at = _click(at, "Repeat with 3 seeds")
    assert not at.exception
    original = repo.get_run(engine, r.id)
    assert original.group_id is not None
    group = repo.group_runs(engine, original.group_id)
    new = [g for g in group if g.id != r.id]
    assert len(group) == 3 and sorted(g.spec["seed"] for g in new) == [43, 44]
    assert all(g.status == "queued" and g.parent_id == r.id for g in new)
    queued = [json.loads(m)["headers"]["argsrepr"] for m in broker.lrange("cpu", 0, -1)]
    assert sorted(new_id for new_id in (g.id for g in new) if any(new_id in q for q in queued)) == sorted(
        g.id for g in new
    )
    assert any("seeds 43, 44" in s.value for s in at.success)
    links = {link.proto.label: link.proto.page for link in at.get("page_link")}
    assert "Compare the seed group (3 runs)" in links
    assert any("seed group of 3 runs" in c.value for c in at.caption)


def test_names_are_shown_as_their_text_in_links_legends_and_expanders(page, engine):
    name = "<b>x</b> ![i](https://elsewhere/i.png) [l](https://elsewhere/)"
    sweep, runs = _sweep(engine, name)
    at = page("run.py", id=runs[0].id)
    view = shown(next(c.value for c in at.caption if "of sweep" in c.value))
    links = [attrs["href"] for tag, attrs in view.tags if tag == "a"]
    compare = f"compare?ids={runs[0].id},{runs[1].id}&group=seed&project=default"  # a link opens its project
    assert links == [f"sweep?id={sweep.id}", compare]  # ours only
    assert not view.has("img") and not view.has("b") and f"trial 0 of sweep {name}" in view.text
    at = page("compare.py", ids=",".join(r.id for r in runs), group="sweep")
    legend = [t["name"] for t in plotly_figures(at)["val/acc"]["data"] if t.get("fill") != "toself"]
    assert "<" not in legend[0] and html.unescape(legend[0]) == f"sweep {name} ×4"
    at = page("runs.py")
    at.toggle(key="runs.group").set_value(True).run()
    at.session_state["runs.gtable"] = {"selection": {"rows": [0], "columns": [], "cells": []}}
    at.run()
    view = shown(at.expander[0].label)
    assert not ({"a", "img", "strong"} & {t for t, _ in view.tags}) and view.text == f"sweep {name}: 4 run(s)"
