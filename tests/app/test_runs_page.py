"""Runs: empty state, the table, filters, pages, and the actions on selected rows."""

from __future__ import annotations

import json

import pytest
from seeding import seed_run

from db import repo


def _select(at, *rows: int):
    at.session_state["runs.table"] = {"selection": {"rows": list(rows), "columns": [], "cells": []}}
    return at.run()


def _click(at, label: str):
    next(b for b in at.button if b.label == label).click()
    return at.run()


def _table(at):
    return at.dataframe[0].value


def test_empty_state_points_to_new_run(page):
    at = page("runs.py")
    assert not at.exception
    assert any("No runs yet" in i.value for i in at.info)
    assert len(at.dataframe) == 0


def test_table_shows_status_progress_best_owner_worker_tags(page, engine):
    done = seed_run(engine, "done", epochs=2, val_acc=0.93, tags=("baseline",), owner="ana")
    seed_run(engine, "live", status="running", steps=10)
    seed_run(engine, "waiting", status="queued")
    df = _table(page("runs.py"))
    assert list(df["name"]) == ["waiting", "live", "done"]  # newest first
    row = df[df["name"] == "done"].iloc[0]
    assert row["status"] == "completed" and row["progress"] == 1.0 and row["best"] == "val/acc 0.9300"
    assert row["owner"] == "ana" and row["worker"] == "w1" and list(row["tags"]) == ["baseline"]
    assert row["id"] == done.id and row["open"] == f"run?id={done.id}"
    assert df[df["name"] == "live"].iloc[0]["progress"] == 0.5


def test_filters_by_status_text_and_tag(page, engine):
    seed_run(engine, "alpha", tags=("x",))
    seed_run(engine, "beta", status="running")
    seed_run(engine, "gamma", status="failed", tags=("x",))
    at = page("runs.py")
    at.multiselect(key="runs.status").set_value(["running"]).run()
    assert list(_table(at)["name"]) == ["beta"]
    at.multiselect(key="runs.status").set_value([]).run()
    at.text_input(key="runs.text").input("alp").run()
    assert list(_table(at)["name"]) == ["alpha"]
    at.text_input(key="runs.text").input("").run()
    at.selectbox(key="runs.tag").set_value("x").run()
    assert sorted(_table(at)["name"]) == ["alpha", "gamma"]
    at.text_input(key="runs.text").input("nothing-like-this").run()
    assert len(_table(at)) == 0 and any("0 run(s) match" in c.value for c in at.caption)


def test_pages_through_many_runs_in_the_database(page, engine):
    spec = {"train": {"epochs": 1}}
    for i in range(120):
        repo.create_run(engine, spec, name=f"run-{i:03d}")
    at = page("runs.py")
    assert any("120 run(s) match · showing 1–50" in c.value for c in at.caption)
    at.pagination[0].set_value(3).run()
    assert any("showing 101–120" in c.value for c in at.caption)
    assert list(_table(at)["name"])[-1] == "run-000"
    at.selectbox(key="runs.sort").set_value("name").run()
    at.toggle(key="runs.desc").set_value(False).run()
    assert list(_table(at)["name"])[:2] == ["run-100", "run-101"]


def test_cancel_selected_runs(page, engine):
    running = seed_run(engine, "live", status="running")
    queued = seed_run(engine, "waiting", status="queued")
    at = _select(page("runs.py"), 0, 1)
    at = _click(at, "Cancel")
    assert repo.get_run(engine, queued.id).status == "cancelled"
    assert repo.get_run(engine, running.id).cancel_requested
    assert any("cancel requested for 2 run(s)" in s.value for s in at.success)


def test_delete_asks_first_then_removes_rows_and_files(page, engine, home):
    r = seed_run(engine, "old")
    files = home / "artifacts" / "runs" / r.id
    files.mkdir(parents=True)
    (files / "last.pt").write_bytes(b"x")
    at = _click(_select(page("runs.py"), 0), "Delete")
    assert any("cannot be undone" in w.value for w in at.warning)
    assert repo.get_run(engine, r.id)  # nothing happened yet
    at = _click(at, "Keep")
    assert repo.get_run(engine, r.id) and not at.warning
    at = _click(_click(_select(at, 0), "Delete"), "Delete permanently")
    with pytest.raises(repo.RunNotFound):
        repo.get_run(engine, r.id)
    assert not files.exists()
    assert any("deleted 1 run(s)" in s.value for s in at.success)


def test_rerun_queues_the_same_spec_as_a_child(page, engine, broker):
    r = seed_run(engine, "base", lr=0.02, spec={"device": "cpu"})
    at = _click(_select(page("runs.py"), 0), "Re-run")
    child = next(x for x in repo.list_runs(engine).runs if x.id != r.id)
    assert child.status == "queued" and child.parent_id == r.id and child.spec == r.spec
    headers = json.loads(broker.lrange("cpu", 0, -1)[0])["headers"]
    assert child.id in headers["argsrepr"]
    assert any("queued 1 new run(s)" in s.value for s in at.success)


def test_compare_and_clone_open_their_pages(page, engine):
    a, b = seed_run(engine, "a", epochs=2), seed_run(engine, "b", epochs=2, lr=0.01)
    at = _click(_select(page("runs.py"), 0, 1), "Compare")
    assert at.title[0].value == "Compare"
    assert set(at.multiselect(key="cmp.ids").value) == {a.id, b.id}
    at = _click(_select(page("runs.py"), 0), "Clone")
    assert at.title[0].value == "New run"
    assert at.number_input(key="nr.f.optim.lr").value == pytest.approx(0.01)
