"""The reaper against a real Redis and a real database, in this process: it sends again exactly the runs
whose broker message is gone, and its transitions never undo a worker's claim."""

from __future__ import annotations

from datetime import timedelta

from sqlalchemy import update

from core.names import RUN_TASK
from db.models import Run
from db.repo import claim_run, create_run, get_run, list_events, mark_lost
from db.types import utcnow
from worker import reaper as worker_reaper
from worker.broker import run_ids_in_broker
from worker.settings import WorkerSettings


def _age(engine, run_id: str, seconds: float) -> None:
    old = utcnow() - timedelta(seconds=seconds)
    with engine.begin() as c:
        c.execute(update(Run).where(Run.id == run_id).values(created_at=old, heartbeat_at=old))


def test_only_runs_without_a_message_are_sent_again(reaper):
    engine, app, client = reaper
    settings = WorkerSettings(requeue_after_s=60)
    waiting = create_run(engine, {"device": "gpu"}, name="waits for a GPU worker")
    orphan = create_run(engine, {"device": "cpu"}, name="its message was lost")
    worker_reaper.send(waiting)
    for r in (waiting, orphan):
        _age(engine, r.id, 120)
    assert run_ids_in_broker(app, ("gpu", "cpu"), RUN_TASK) == {waiting.id}
    assert worker_reaper.resend_missing(engine, settings) == [orphan.id]
    assert client.llen("gpu") == 1 and client.llen("cpu") == 1  # the waiting run was not sent twice
    # both have their message now: a long queue is never flooded
    assert worker_reaper.resend_missing(engine, settings) == []
    assert "resent" in {e.code for e in list_events(engine, orphan.id)}
    assert "resent" not in {e.code for e in list_events(engine, waiting.id)}
    fresh = create_run(engine, {"device": "cpu"}, name="just created: its message is on its way")
    assert fresh.id not in worker_reaper.resend_missing(engine, settings)


def test_a_lost_run_claimed_meanwhile_is_never_failed_by_the_reaper(reaper):
    engine, _, _ = reaper
    run = create_run(engine, {"device": "cpu"})
    claim_run(engine, run.id, "w1")
    _age(engine, run.id, 120)
    assert mark_lost(engine, 60) == [run.id]
    claim_run(engine, run.id, "w2")  # a worker took it between the reaper's read and its write
    from db.repo import finish_run

    assert finish_run(engine, run.id, "failed", only_from=("lost",)) is None
    assert get_run(engine, run.id).status == "running"


def test_a_message_delivered_but_not_acknowledged_counts_as_present_while_recent(reaper):
    engine, app, client = reaper
    run = create_run(engine, {"device": "cpu"})
    worker_reaper.send(run)
    with app.connection_for_read() as conn:  # a worker took the message and has not acknowledged it yet
        queue = conn.SimpleQueue("cpu", no_ack=False)
        message = queue.get(timeout=10)
        assert client.llen("cpu") == 0
        assert run_ids_in_broker(app, ("gpu", "cpu"), RUN_TASK) == {run.id}
        # ... unless it was delivered long ago: that worker died with it, and the run needs a new message
        assert run_ids_in_broker(app, ("gpu", "cpu"), RUN_TASK, delivered_within_s=-1) == set()
        message.ack()
        queue.close()
    assert run_ids_in_broker(app, ("gpu", "cpu"), RUN_TASK) == set()
