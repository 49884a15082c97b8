"""Sweeps page: the list of sweeps, and one sweep live: its trials (the pruned one shaded, with why), the best
so far, every trial's curve overlaid (seed groups as bands), parallel coordinates, importances, cancel (owner
or admin only), the best configuration launched again; refreshing while the sweep runs, not after. Sweeps
are played by hand on a real SQLite database (sweep_seeding.py): no worker, no torch."""

from __future__ import annotations

import re

import pytest
import streamlit as st
from seeding import plotly_figures
from sweep_seeding import seed_sweep
from test_auth import ADMIN, ANA, BOB, claims, team, team_page, user  # noqa: F401 - `team` is a fixture

from app import auth
from app.present.text import md_text
from app.services import projects, sweeps
from app.ui import sweep_view
from db import repo


def _trials(at):
    return next(d for d in at.dataframe if "why pruned" in d.value.columns)


def _click(at, label: str):
    next(b for b in at.button if b.label == label).click()
    return at.run()


def test_without_an_id_it_lists_the_sweeps_newest_first_each_linking_to_its_page(page, engine):
    at = page("sweep.py")
    assert at.title[0].value == "Sweeps" and any("No sweeps yet" in i.value for i in at.info)
    done = seed_sweep(engine, name="first")
    live = seed_sweep(engine, name="second", trials=1, then_running=True)
    st.cache_data.clear()  # the list is cached for a few seconds
    table = page("sweep.py").dataframe[0].value
    assert list(table["name"]) == ["second", "first"]
    assert list(table["status"]) == ["running", "completed"]
    assert list(table["trials"]) == ["1/3", "3/3"]
    assert list(table["best"]) == ["#0: 0.9000", "#2: 0.9500"]
    assert list(table["open"]) == [f"sweep?id={live.sweep_id}", f"sweep?id={done.sweep_id}"]


def test_a_finished_sweep_shows_its_trials_with_the_pruned_one_marked(page, engine):
    played = seed_sweep(engine)
    runs = {r.trial: r for r in repo.sweep_runs(engine, played.sweep_id)}
    at = page("sweep.py", id=played.sweep_id)
    assert not at.exception and at.title[0].value == "lr-sweep"
    assert any("completed" in m.value for m in at.markdown)
    assert any("3/3" in m.value and "1 pruned" in m.value for m in at.markdown)
    trials = _trials(at)
    df = trials.value
    assert list(df["status"]) == ["completed", "pruned at epoch 1", "completed"]
    assert "below the median" in df["why pruned"][1] and df["why pruned"][0] == ""
    assert list(df["val/acc"]) == pytest.approx([0.9, 0.2, 0.95])
    assert list(df["epochs"]) == [3, 1, 3]
    assert list(df["run"]) == [f"run?id={runs[n].id}" for n in range(3)]
    assert sorted(df["optim.lr"]) == [0.001, 0.01, 0.1]
    styles = trials.proto.arrow_data.styler.styles  # the pruned row, and it alone, is shaded
    assert "row1_col0" in styles and "row0_col0" not in styles and "row2_col0" not in styles
    assert any("Shaded rows" in c.value for c in at.caption)
    assert any("Best so far: trial #2" in m.value for m in at.markdown)
    assert not any(b.label == "Cancel sweep" for b in at.button)


def test_its_charts_best_so_far_every_curve_parallel_coordinates_and_importances(page, engine):
    played = seed_sweep(engine)
    figs = plotly_figures(page("sweep.py", id=played.sweep_id))
    best = next(t for t in figs["Best so far (val/acc, max)"]["data"] if t["name"] == "best so far")
    assert best["x"] == [0, 2] and best["y"] == pytest.approx([0.9, 0.95])
    curves = figs["val/acc per epoch, every trial"]["data"]
    assert len(curves) == 3
    pruned = next(t for t in curves if t["name"].startswith("#1 "))
    assert pruned["line"]["dash"] == "dash" and pruned["marker"]["symbol"][-1] == "x" and len(pruned["x"]) == 1
    dims = figs["parallel"]["data"][0]["dimensions"]
    assert [d["label"] for d in dims] == ["optim.lr (log10)", "val/acc"]  # decades apart: a log axis
    assert sorted(dims[0]["values"]) == pytest.approx([-3, -1]) and dims[1]["values"] == pytest.approx([0.9, 0.95])
    importance = figs["Parameter importances (Optuna, fANOVA)"]["data"][0]
    assert importance["x"] == ["optim.lr"] and importance["y"] == pytest.approx([1.0])


def test_seed_groups_show_mean_std_n_in_the_table_and_a_band_on_the_overlay(page, engine):
    played = seed_sweep(engine, seeds=2)
    at = page("sweep.py", id=played.sweep_id)
    df = _trials(at).value
    assert df["val/acc"][0] == "0.9050 ± 0.0071 (n=2)" and df["val/acc"][2] == "0.9550 ± 0.0071 (n=2)"
    group = [r.id for r in repo.sweep_runs(engine, played.sweep_id) if r.trial == 0]
    assert df["seeds"][0] == "compare?ids=" + ",".join(group)
    curves = plotly_figures(at)["val/acc per epoch, every trial"]["data"]
    bands = [t for t in curves if t.get("fill") == "toself"]
    assert len(bands) == 2 and all(t["name"].endswith("± std") for t in bands)  # the two completed groups
    assert any(md_text("0.9550 ± 0.0071 (n=2)") in m.value for m in at.markdown)  # the best, as mean ± std


def test_a_running_sweep_refreshes_in_place_until_it_has_ended(page, engine, monkeypatch):
    asked = []
    real = st.fragment

    def spy(func=None, *, run_every=None):
        asked.append(run_every)
        return real(func, run_every=run_every)

    monkeypatch.setattr(st, "fragment", spy)
    played = seed_sweep(engine, trials=1, then_running=True)
    at = page("sweep.py", id=played.sweep_id)
    assert asked[-1] == pytest.approx(sweep_view.REFRESH_S) and asked[-1] > 0  # the live part polls
    assert any("Live" in c.value for c in at.caption)
    assert any("1/3" in m.value and "1 running" in m.value for m in at.markdown)
    assert list(_trials(at).value["status"]) == ["completed", "running"]
    played.play()  # the workers finish it
    at.run()
    assert asked[-1] is None  # nothing polls any more
    assert any("Ended" in c.value for c in at.caption) and not any("Live" in c.value for c in at.caption)
    assert list(_trials(at).value["status"]) == ["completed", "pruned at epoch 1", "completed"]
    assert not any(b.label == "Cancel sweep" for b in at.button)


def test_the_owner_cancels_a_running_sweep(page, engine):
    played = seed_sweep(engine, trials=1, then_running=True)
    at = _click(page("sweep.py", id=played.sweep_id), "Cancel sweep")
    assert repo.get_sweep(engine, played.sweep_id).status == "cancelled"
    running = next(r for r in repo.sweep_runs(engine, played.sweep_id) if r.trial == 1)
    assert running.cancel_requested
    assert any("cancelled" in m.value for m in at.markdown) and not any(b.label == "Cancel sweep" for b in at.button)


def test_in_team_mode_only_the_owner_or_an_admin_may_cancel(team, engine):
    played = seed_sweep(engine, owner=user(ANA).id, trials=1, then_running=True)
    at = team_page("sweep.py", claims(BOB), id=played.sweep_id)
    assert not at.exception and at.title[0].value == "lr-sweep"  # another member sees the sweep…
    assert "Cancel sweep" not in [b.label for b in at.button]  # …but not the cancel the service would refuse
    with pytest.raises(auth.PermissionDenied, match="may not cancel sweep"):
        sweeps.cancel_sweep(played.sweep_id, by=projects.with_roles(user(BOB), engine), engine=engine)
    assert repo.get_sweep(engine, played.sweep_id).status == "running"
    _click(team_page("sweep.py", claims(ADMIN), id=played.sweep_id), "Cancel sweep")
    assert repo.get_sweep(engine, played.sweep_id).status == "cancelled"


def test_the_best_configuration_is_launched_as_a_run_or_a_seed_group(page, engine):
    played = seed_sweep(engine)
    best = next(r for r in repo.sweep_runs(engine, played.sweep_id) if r.trial == 2)
    at = _click(page("sweep.py", id=played.sweep_id), "Launch the best configuration")
    assert at.title[0].value == "lr-sweep best"  # the new run's page
    new = next(r for r in repo.list_runs(engine).runs if r.name == "lr-sweep best")
    assert new.parent_id == best.id and new.spec["optim"]["lr"] == best.spec["optim"]["lr"] and new.sweep_id is None
    at = page("sweep.py", id=played.sweep_id)
    at.number_input(key="sweep.best_seeds").set_value(3)
    at = _click(at, "Launch the best configuration")
    assert any("seed group of 3 runs" in s.value for s in at.success)
    group = [r for r in repo.list_runs(engine).runs if r.name.startswith("lr-sweep best seed")]
    assert len(group) == 3 and len({r.group_id for r in group}) == 1 and group[0].group_id is not None
    link = next(p for p in at.get("page_link") if p.proto.label == "Compare the group's runs")
    assert sorted(re.sub(r"^ids=", "", link.proto.query_string.replace("%2C", ",")).split(",")) == sorted(
        r.id for r in group
    )


def test_an_unknown_sweep_says_so_and_a_name_is_shown_as_its_text(page, engine):
    assert any("No sweep 'nope'" in e.value for e in page("sweep.py", id="nope").error)
    name = "**bold** [link](http://example.com) :fire:"
    played = seed_sweep(engine, name=name)
    at = page("sweep.py", id=played.sweep_id)
    assert at.title[0].value == md_text(name)  # shown as its text: no bold, no link, no icon
