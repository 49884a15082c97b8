"""A queued run's priority, changed by the service the pages and `torchdeck priority` use: its owner may lower it
or bring it back to normal, another member may not touch it, and only an admin may raise a run above normal."""

from __future__ import annotations

from datetime import timedelta

import pytest
import streamlit as st
from seeding import seed_run
from sqlalchemy import update
from test_auth import ADMIN, ANA, BOB, claims, team, team_page, user  # noqa: F401 - `team` is a fixture

from app import auth
from app.services.queue_place import start_eta_s
from app.services.runs import set_priority
from core.names import queue_of
from db import repo
from db.models import Run
from db.types import utcnow

SPEC = {"device": "cuda", "data": {"name": "digits"}, "model": {"name": "mlp"}}


def test_the_owner_may_lower_their_run_and_another_member_may_not_touch_it(team, engine):
    bob = user(BOB)
    run = repo.create_run(engine, SPEC, owner=bob.id)
    assert set_priority(run.id, "low", engine=engine, by=bob).priority == -1
    with pytest.raises(auth.PermissionDenied, match=f"may not reprioritise run {run.id}: it belongs to "):
        set_priority(run.id, "normal", engine=engine, by=user(ANA))
    assert repo.get_run(engine, run.id).priority == -1
    assert set_priority(run.id, "normal", engine=engine, by=bob).priority == 0


def test_only_an_admin_raises_a_run_above_normal(team, engine):
    bob = user(BOB)
    run = repo.create_run(engine, SPEC, owner=bob.id)
    with pytest.raises(
        auth.PermissionDenied,
        match="may not give a run high priority: only a maintainer of project default or an admin may",
    ):
        set_priority(run.id, "high", engine=engine, by=bob)
    assert repo.get_run(engine, run.id).priority == 0
    assert set_priority(run.id, "high", engine=engine, by=user(ADMIN)).priority == 1


def test_a_run_that_left_the_queue_keeps_its_priority(team, engine):
    bob = user(BOB)
    run = repo.create_run(engine, SPEC, owner=bob.id)
    repo.claim_run(engine, run.id, "w1")
    with pytest.raises(ValueError, match=f"run {run.id} is running: only a queued run's priority changes"):
        set_priority(run.id, "low", engine=engine, by=bob)
    with pytest.raises(ValueError, match="priority 'urgent': one of low, normal, high"):
        set_priority(run.id, "urgent", engine=engine, by=user(ADMIN))


def test_the_overview_shows_each_queued_run_in_the_order_workers_take_them_and_why(page, engine):
    st.cache_data.clear()
    done = seed_run(engine, "yesterday", owner="ada", status="completed")  # ada trained a while ago
    with engine.begin() as c:
        c.execute(update(Run).where(Run.id == done.id).values(started_at=utcnow() - timedelta(hours=2)))
    seed_run(engine, "ada-first", owner="ada", status="queued")
    seed_run(engine, "bob-later", owner="bob", status="queued")
    urgent = seed_run(engine, "cyd-urgent", owner="cyd", status="queued")
    repo.set_priority(engine, urgent.id, 1)
    at = page("overview.py")
    table = next(df.value for df in at.dataframe if "why" in df.value).set_index("run")
    assert [table.loc[n, "position"] for n in ("cyd-urgent", "bob-later", "ada-first")] == [1, 2, 3]
    assert table.loc["cyd-urgent", "why"] == "high priority; cyd has no recent GPU time"
    assert table.loc["ada-first", "why"].startswith("normal priority; ada has ")
    assert "of recent GPU time" in table.loc["ada-first", "why"]
    assert set(table["starts in"]) == {"no worker takes it"}  # (nobody consumes their queue)


def test_a_queued_runs_start_is_estimated_from_its_position_the_workers_and_the_queues_recent_runs():
    assert start_eta_s(1, 2, 600.0) == 300.0  # next: the runs now on the workers are half done, on average
    assert start_eta_s(2, 2, 600.0) == 300.0  # two workers take the first two together
    assert start_eta_s(5, 2, 600.0) == 1500.0  # two rounds of both workers, then half a run
    assert start_eta_s(1, 0, 600.0) is None  # nobody takes it
    assert start_eta_s(1, 2, None) is None  # nothing to go by


def _worker(engine, queue: str) -> None:
    repo.upsert_worker(engine, "w@box", hostname="box", queues=[queue], devices=[{"kind": "cpu", "cores": 4}])


def _took(engine, run, minutes: float) -> None:
    with engine.begin() as c:
        c.execute(update(Run).where(Run.id == run.id).values(started_at=run.finished_at - timedelta(minutes=minutes)))


def test_the_run_page_shows_a_queued_runs_place_and_lets_its_owner_lower_it(team, engine, monkeypatch):
    monkeypatch.setenv("TORCHDECK_STALE_AFTER_S", "3600")  # the planted worker stays live however slow the pages
    for minutes in (20, 30, 40):  # the queue's recent run time: a median of 30 minutes
        _took(engine, seed_run(engine, f"done-{minutes}", owner=ANA, status="completed"), minutes)
    first = seed_run(engine, "anas", owner=ANA, status="queued")
    bobs = seed_run(engine, "bobs", owner=BOB, status="queued")
    _worker(engine, queue_of(first.spec))
    at = team_page("run.py", claims(BOB), id=bobs.id)
    assert not at.exception
    place = next(c.value for c in at.caption if "Position" in c.value)
    # bob has no recent GPU time, ana has 1.5 h: bob's run goes first though queued later
    assert place.startswith(f"Position **1** of 2 in queue `{queue_of(bobs.spec)}`")
    assert "normal priority; its owner has no recent GPU time" in place
    assert "starts in about 15m" in place
    box = next(s for s in at.selectbox if s.label == "Priority")
    assert box.options == ["low", "normal"] and box.value == "normal"
    box.set_value("low").run()
    assert repo.get_run(engine, bobs.id).priority == -1
    assert [q.id for q in repo.queue_order(engine, queue_of(bobs.spec))] == [first.id, bobs.id]
    at = team_page("run.py", claims(BOB), id=bobs.id)
    assert "Position **2** of 2" in next(c.value for c in at.caption if "Position" in c.value)


def test_only_the_owner_and_admins_get_the_priority_control(team, engine):
    bobs = seed_run(engine, "bobs", owner=BOB, status="queued")
    at = team_page("run.py", claims(ANA), id=bobs.id)
    assert any("Position **1** of 1" in c.value for c in at.caption)
    assert "no live worker takes this queue" in next(c.value for c in at.caption if "Position" in c.value)
    assert not [s for s in at.selectbox if s.label == "Priority"]
    at = team_page("run.py", claims(ADMIN), id=bobs.id)
    box = next(s for s in at.selectbox if s.label == "Priority")
    assert box.options == ["low", "normal", "high"]
    box.set_value("high").run()
    assert repo.get_run(engine, bobs.id).priority == 1


def test_torchdeck_priority_moves_a_queued_run_and_refuses_a_finished_one(engine):
    from typer.testing import CliRunner

    from app.cli import app

    queued = seed_run(engine, "waiting", owner="ada", status="queued")
    done = seed_run(engine, "done", owner="ada", status="completed")
    result = CliRunner().invoke(app, ["priority", queued.id, "high"])
    assert result.exit_code == 0 and result.output.strip() == f"{queued.id}: priority high"
    assert repo.get_run(engine, queued.id).priority == 1
    result = CliRunner().invoke(app, ["priority", done.id, "low"])
    assert (
        result.exit_code == 2 and f"run {done.id} is completed: only a queued run's priority changes" in result.output
    )
    result = CliRunner().invoke(app, ["priority", queued.id, "urgent"])
    assert result.exit_code == 2 and "priority 'urgent': one of low, normal, high" in result.output


def test_torchdeck_submit_queues_a_run_at_the_priority_asked(engine, broker, tmp_path):
    import yaml
    from typer.testing import CliRunner

    from app.cli import app

    spec = tmp_path / "spec.yaml"
    spec.write_text(yaml.safe_dump({"name": "overnight", "data": {"name": "digits"}, "device": "cpu"}))
    done = CliRunner().invoke(app, ["submit", str(spec), "--priority", "low"])
    assert done.exit_code == 0, done.output
    run = repo.get_run(engine, done.output.strip().splitlines()[-1])
    assert (run.status, run.priority) == ("queued", -1) and broker.llen("cpu") == 1
    refused = CliRunner().invoke(app, ["submit", str(spec), "--priority", "urgent"])
    assert refused.exit_code == 1 and "priority 'urgent': one of low, normal, high" in refused.output
    assert broker.llen("cpu") == 1  # nothing stored, nothing sent


def _running_sweep(engine, owner: str):
    from sweep import control
    from tests.app.sweep_seeding import sweep_spec

    return control.create(engine, sweep_spec(1, budget={"parallel": 2}), owner=owner, send=lambda run: None)


def test_a_sweeps_owner_lowers_its_trials_on_its_page_and_only_an_admin_raises_them(team, engine):
    from app.services.sweeps import set_sweep_priority

    sweep = _running_sweep(engine, user(BOB).id)
    queued = [r.id for r in repo.sweep_runs(engine, sweep.id)]
    assert len(queued) == 2
    at = team_page("sweep.py", claims(ANA), id=sweep.id)
    assert not at.exception and not [s for s in at.selectbox if s.label == "Priority of its trials"]
    with pytest.raises(auth.PermissionDenied, match=f"may not reprioritise sweep {sweep.id}"):
        set_sweep_priority(sweep.id, "low", by=user(ANA), engine=engine)
    at = team_page("sweep.py", claims(BOB), id=sweep.id)
    box = next(s for s in at.selectbox if s.label == "Priority of its trials")
    assert box.options == ["low", "normal"] and box.value == "normal"
    box.set_value("low").run()
    assert not at.exception
    assert repo.get_sweep(engine, sweep.id).priority == -1
    assert [repo.get_run(engine, i).priority for i in queued] == [-1, -1]
    with pytest.raises(auth.PermissionDenied, match="only a maintainer of project default or an admin may"):
        set_sweep_priority(sweep.id, "high", by=user(BOB), engine=engine)
    assert set_sweep_priority(sweep.id, "high", by=user(ADMIN), engine=engine) == 2


def test_torchdeck_priority_takes_a_sweep_too(engine):
    from typer.testing import CliRunner

    from app.cli import app

    sweep = _running_sweep(engine, "ada")
    done = CliRunner().invoke(app, ["priority", sweep.id, "low"])
    assert done.exit_code == 0, done.output
    assert done.output.strip() == f"sweep {sweep.id}: priority low (2 queued run(s) moved, and its trials to come)"
    assert {r.priority for r in repo.sweep_runs(engine, sweep.id)} == {-1}
    missing = CliRunner().invoke(app, ["priority", "nosuchthing", "low"])
    assert missing.exit_code == 2 and "no run or sweep 'nosuchthing'" in missing.output


def test_torchdeck_sweep_launches_its_trials_at_the_priority_asked(engine, broker, tmp_path):
    import yaml
    from typer.testing import CliRunner

    from app.cli import app
    from tests.app.sweep_seeding import sweep_spec

    data = sweep_spec(1, budget={"parallel": 2}).model_dump(mode="json", by_alias=True, exclude_none=True)
    (tmp_path / "sweep.yaml").write_text(yaml.safe_dump(data))
    done = CliRunner().invoke(app, ["sweep", str(tmp_path / "sweep.yaml"), "--priority", "low"])
    assert done.exit_code == 0, done.output
    sweep_id = done.output.strip().splitlines()[-1]
    assert repo.get_sweep(engine, sweep_id).priority == -1
    assert [r.priority for r in repo.sweep_runs(engine, sweep_id)] == [-1, -1]
