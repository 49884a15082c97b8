"""A delivered message is a token for its queue (worker/claim.py), against a real Redis and a real database: the
worker takes the best queued run, the run its message named keeps a message, a lost run is resumed first, and a
message whose run is already taken starts nothing."""

from __future__ import annotations

import pytest

from core.names import RUN_TASK
from db.repo import claim_run, create_run, get_run, mark_lost
from worker.broker import run_ids_in_broker
from worker.claim import take_turn

GPU = {"device": "cuda", "data": {"name": "digits"}, "model": {"name": "mlp"}}


@pytest.fixture
def broker(reaper):
    engine, app, _ = reaper
    return engine, app


def test_a_delivery_for_one_run_takes_the_better_run_and_sends_its_own_again(broker):
    engine, app = broker
    sweep_trial = create_run(engine, GPU, owner="ada")
    colleague = create_run(engine, GPU, owner="bob", priority=1)
    run = take_turn(engine, sweep_trial.id, "w1")
    assert run.id == colleague.id and get_run(engine, colleague.id).worker_id == "w1"
    assert get_run(engine, sweep_trial.id).status == "queued"
    assert run_ids_in_broker(app, ("gpu",), RUN_TASK) == {sweep_trial.id}  # it still has a message


def test_a_delivery_that_takes_its_own_run_sends_nothing(broker):
    engine, app = broker
    run = create_run(engine, GPU, owner="ada")
    assert take_turn(engine, run.id, "w1").id == run.id
    assert run_ids_in_broker(app, ("gpu",), RUN_TASK) == set()


def test_a_lost_run_is_resumed_by_its_message_before_better_queued_runs(broker):
    engine, _ = broker
    lost = create_run(engine, GPU, owner="ada")
    claim_run(engine, lost.id, "w0")
    assert mark_lost(engine, -1) == [lost.id]
    create_run(engine, GPU, owner="bob", priority=1)
    resumed = take_turn(engine, lost.id, "w1")
    assert (resumed.id, resumed.attempt, resumed.worker_id) == (lost.id, 2, "w1")


def test_a_message_whose_run_was_taken_starts_nothing(broker):
    engine, app = broker
    taken = create_run(engine, GPU, owner="ada")
    waiting = create_run(engine, GPU, owner="bob")
    claim_run(engine, taken.id, "w0")
    assert take_turn(engine, taken.id, "w1") is None  # its turn was spent: `waiting` has its own message
    assert get_run(engine, waiting.id).status == "queued"
    assert run_ids_in_broker(app, ("gpu",), RUN_TASK) == set()


def test_real_workers_take_the_runs_in_the_fair_order_and_each_once(stack):
    """A backlog of one person, then a colleague's single run and an urgent one, with a real worker process on each
    backend: the urgent run starts first; then ada and bob have no recent GPU time (a tie, by name: ada), then ada
    has some and bob's run goes before the rest of her backlog; every run completes once."""
    from app.auth import local_user
    from app.services.runs import submit
    from core.config import RunSpec
    from tests.worker.conftest import RUN

    def queue(owner: str, priority: str = "normal") -> str:
        spec = RunSpec.from_dict(RUN, ["train.epochs=1"])
        return submit(spec, owner=owner, engine=stack.engine, priority=priority, by=local_user()).id

    backlog = [queue("ada") for _ in range(3)]
    colleague = queue("bob")
    urgent = queue("cyd", "high")
    stack.start_worker("w1")  # one worker: it takes them one at a time, in the queue's order
    runs = [stack.wait(i, timeout=400) for i in [*backlog, colleague, urgent]]
    assert [r.status for r in runs] == ["completed"] * 5, [(r.id, r.status, r.error) for r in runs]
    assert all(r.attempt == 1 for r in runs)  # each ran once
    started = [r.id for r in sorted(runs, key=lambda r: r.started_at)]
    assert started == [urgent, backlog[0], colleague, backlog[1], backlog[2]]
