"""The run lifecycle as workers and the UI drive it."""

from __future__ import annotations

import math
import threading
from datetime import timedelta

import pytest
from sqlalchemy import Engine, text, update

from db import repo
from db.engine import connection_scope
from db.models import Run
from db.types import EventInput, MetricPoint, utcnow

SPEC = {"data": {"name": "digits"}, "model": {"name": "mlp"}, "optim": {"lr": 0.01}}


def test_a_new_run_is_queued_with_its_spec_and_hash(engine: Engine) -> None:
    run = repo.create_run(engine, SPEC, name="baseline", owner="ada", tags=["lr-sweep", "lr-sweep", "mlp"])
    assert run.status == "queued"
    assert run.spec == SPEC
    assert run.tags == ("lr-sweep", "mlp")
    assert (run.name, run.owner, run.attempt, run.cancel_requested) == ("baseline", "ada", 0, False)
    assert run.created_at.tzinfo is not None
    assert len(run.id) == 12 and "/" not in run.id
    # The hash ignores key order: the same spec submitted twice is recognisable.
    reordered = {"optim": {"lr": 0.01}, "model": {"name": "mlp"}, "data": {"name": "digits"}}
    assert repo.create_run(engine, reordered).spec_hash == run.spec_hash
    assert repo.create_run(engine, {**SPEC, "seed": 1}).spec_hash != run.spec_hash
    assert repo.get_run(engine, run.id) == run


def test_a_clone_points_to_its_parent(engine: Engine) -> None:
    parent = repo.create_run(engine, SPEC)
    child = repo.create_run(engine, SPEC, parent_id=parent.id)
    assert child.parent_id == parent.id
    with pytest.raises(repo.RunNotFound):
        repo.create_run(engine, SPEC, parent_id="nosuchrun")


def test_claim_is_atomic_exactly_one_of_many_workers_wins(engine: Engine) -> None:
    run = repo.create_run(engine, SPEC)
    barrier = threading.Barrier(6)
    results: list[object] = []

    def claim(worker: str) -> None:
        barrier.wait()
        results.append(repo.claim_run(engine, run.id, worker))

    threads = [threading.Thread(target=claim, args=(f"w{i}",)) for i in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    winners = [r for r in results if r is not None]
    assert len(results) == 6 and len(winners) == 1
    stored = repo.get_run(engine, run.id)
    assert stored.status == "running" and stored.attempt == 1
    assert stored.worker_id == winners[0].worker_id  # type: ignore[attr-defined]


@pytest.mark.parametrize("status", ["completed", "early_stopped", "cancelled", "failed", "diverged"])
def test_a_finished_run_is_never_claimed_again(engine: Engine, status: str) -> None:
    run = repo.create_run(engine, SPEC)
    assert repo.claim_run(engine, run.id, "w1") is not None
    assert repo.finish_run(engine, run.id, status) is not None
    assert repo.claim_run(engine, run.id, "w2") is None
    assert repo.get_run(engine, run.id).status == status


def test_a_lost_run_is_claimed_again_with_a_new_attempt(engine: Engine) -> None:
    run = repo.create_run(engine, SPEC)
    first = repo.claim_run(engine, run.id, "w1", device="cuda:0")
    assert first is not None and first.started_at is not None
    _age_heartbeat(engine, run.id, seconds=120)
    assert [r.id for r in repo.stale_runs(engine, older_than_s=60)] == [run.id]
    assert repo.mark_lost(engine, older_than_s=60) == [run.id]
    assert repo.get_run(engine, run.id).status == "lost"
    again = repo.claim_run(engine, run.id, "w2", device="cuda:1")
    assert again is not None
    assert (again.status, again.attempt, again.worker_id, again.device) == ("running", 2, "w2", "cuda:1")
    assert again.started_at == first.started_at  # a resumed run keeps its start time
    # The first worker, slow but alive, learns it no longer owns the run.
    reply = repo.heartbeat(engine, run.id, worker_id="w1")
    assert reply.should_stop and not reply.owned
    assert repo.finish_run(engine, run.id, "completed", worker_id="w1") is None
    assert repo.finish_run(engine, run.id, "completed", worker_id="w2") is not None


def test_runs_waiting_too_long_for_a_worker_are_listed_for_the_reaper(engine: Engine) -> None:
    run = repo.create_run(engine, SPEC)
    fresh = repo.create_run(engine, SPEC)
    lost = repo.create_run(engine, SPEC)
    repo.claim_run(engine, lost.id, "w1")
    _age_heartbeat(engine, lost.id, seconds=120)
    assert repo.mark_lost(engine, older_than_s=60) == [lost.id]  # its reaper may die before sending it
    with engine.begin() as conn:
        conn.execute(update(Run).where(Run.id == run.id).values(created_at=utcnow() - timedelta(seconds=300)))
    assert {r.id for r in repo.unclaimed_runs(engine, older_than_s=200)} == {run.id}
    waiting = {r.id for r in repo.unclaimed_runs(engine, older_than_s=60)}
    assert waiting == {run.id, lost.id} and fresh.id not in waiting  # created just now: its message is on its way
    assert repo.claim_run(engine, lost.id, "w2").attempt == 2
    assert repo.claim_run(engine, run.id, "w2") is not None
    assert {r.id for r in repo.unclaimed_runs(engine, older_than_s=60)} == set()  # claimed: not waiting any more


def test_fresh_heartbeats_are_not_stale(engine: Engine) -> None:
    run = repo.create_run(engine, SPEC)
    repo.claim_run(engine, run.id, "w1")
    reply = repo.heartbeat(engine, run.id, worker_id="w1", progress=0.25)
    assert reply.owned and not reply.should_stop
    assert repo.get_run(engine, run.id).progress == 0.25
    assert repo.stale_runs(engine, older_than_s=60) == []
    assert repo.mark_lost(engine, older_than_s=60) == []


def test_a_slow_worker_heartbeat_revives_its_lost_run(engine: Engine) -> None:
    run = repo.create_run(engine, SPEC)
    repo.claim_run(engine, run.id, "w1")
    _age_heartbeat(engine, run.id, seconds=120)
    repo.mark_lost(engine, older_than_s=60)
    assert repo.heartbeat(engine, run.id, worker_id="w1").owned
    assert repo.get_run(engine, run.id).status == "running"


def test_cancel_a_queued_run_at_once_and_a_running_one_through_its_worker(engine: Engine) -> None:
    queued = repo.create_run(engine, SPEC)
    assert repo.request_cancel(engine, queued.id).status == "cancelled"
    assert repo.claim_run(engine, queued.id, "w1") is None

    running = repo.create_run(engine, SPEC)
    repo.claim_run(engine, running.id, "w1")
    asked = repo.request_cancel(engine, running.id)
    assert asked.status == "running" and asked.cancel_requested
    assert repo.heartbeat(engine, running.id, worker_id="w1").should_stop
    done = repo.finish_run(engine, running.id, "cancelled", worker_id="w1")
    assert done is not None and done.status == "cancelled" and done.finished_at is not None

    finished = repo.request_cancel(engine, running.id)
    assert finished.status == "cancelled"


def test_finish_records_summary_error_and_is_final(engine: Engine) -> None:
    run = repo.create_run(engine, SPEC)
    repo.claim_run(engine, run.id, "w1")
    summary = {"best": {"metric": "val/acc", "value": 0.97, "epoch": 4}, "final_loss": math.nan}
    done = repo.finish_run(engine, run.id, "diverged", summary=summary, error="loss became NaN at step 812")
    assert done is not None
    assert done.summary["best"] == {"metric": "val/acc", "value": 0.97, "epoch": 4}
    assert done.summary["final_loss"] == "nan"  # JSON has no NaN; float("nan") reads it back
    assert done.error == "loss became NaN at step 812"
    assert repo.finish_run(engine, run.id, "completed") is None
    assert repo.get_run(engine, run.id).status == "diverged"
    with pytest.raises(ValueError, match="does not finish a run"):
        repo.finish_run(engine, run.id, "running")


def test_delete_removes_everything_and_reports_artifacts(engine: Engine) -> None:
    parent = repo.create_run(engine, SPEC, tags=["x"])
    child = repo.create_run(engine, SPEC, parent_id=parent.id)
    repo.append_metrics(engine, parent.id, [MetricPoint("loss", s, 1.0 / (s + 1)) for s in range(3000)])
    repo.append_events(engine, parent.id, [EventInput("lifecycle", "info", "started")])
    a = repo.add_artifact(engine, parent.id, "checkpoint", "file:///runs/p/last.pt")
    b = repo.add_artifact(engine, parent.id, "onnx", "s3://bucket/runs/p/model.onnx")
    other = repo.create_run(engine, SPEC)
    repo.append_metrics(engine, other.id, [MetricPoint("loss", 0, 1.0)])

    assert sorted(repo.delete_run(engine, parent.id)) == sorted([a.uri, b.uri])
    with pytest.raises(repo.RunNotFound):
        repo.get_run(engine, parent.id)
    with pytest.raises(repo.ArtifactNotFound):
        repo.get_artifact(engine, a.id)
    assert repo.get_run(engine, child.id).parent_id is None
    assert repo.get_run(engine, other.id).metrics["loss"].count == 1
    with connection_scope(engine) as conn:
        for table in ("metric", "metric_rollup", "event", "artifact", "run_tag"):
            query = text(f"SELECT count(*) FROM {table} WHERE run_id = :run_id")
            assert conn.execute(query, {"run_id": parent.id}).scalar() == 0, table


def test_a_running_run_is_deleted_only_when_forced(engine: Engine) -> None:
    run = repo.create_run(engine, SPEC)
    repo.claim_run(engine, run.id, "w1")
    with pytest.raises(repo.RunStillActive, match="cancel it"):
        repo.delete_run(engine, run.id)
    assert repo.delete_run(engine, run.id, force=True) == []


def test_unknown_runs_are_reported_by_id(engine: Engine) -> None:
    for call in (
        lambda: repo.get_run(engine, "nosuchrun"),
        lambda: repo.claim_run(engine, "nosuchrun", "w1"),
        lambda: repo.heartbeat(engine, "nosuchrun"),
        lambda: repo.request_cancel(engine, "nosuchrun"),
        lambda: repo.finish_run(engine, "nosuchrun", "failed"),
        lambda: repo.delete_run(engine, "nosuchrun"),
        lambda: repo.append_metrics(engine, "nosuchrun", [MetricPoint("loss", 0, 1.0)]),
        lambda: repo.append_events(engine, "nosuchrun", []),
        lambda: repo.add_artifact(engine, "nosuchrun", "checkpoint", "file:///x"),
        lambda: repo.series(engine, "nosuchrun", "loss"),
        lambda: repo.metric_keys(engine, "nosuchrun"),
    ):
        with pytest.raises(repo.RunNotFound, match="'nosuchrun'"):
            call()


def test_bad_run_fields_are_refused_before_writing(engine: Engine) -> None:
    with pytest.raises(ValueError, match="name is 201 characters"):
        repo.create_run(engine, SPEC, name="x" * 201)
    with pytest.raises(ValueError, match="tag"):
        repo.create_run(engine, SPEC, tags=["ok", " "])
    with pytest.raises(ValueError, match="not JSON-serializable"):
        repo.create_run(engine, {"path": object()})
    run = repo.create_run(engine, SPEC)
    repo.claim_run(engine, run.id, "w1")
    with pytest.raises(ValueError, match="progress"):
        repo.heartbeat(engine, run.id, progress=1.5)
    assert repo.list_runs(engine).total == 1


def _age_heartbeat(engine: Engine, run_id: str, seconds: float) -> None:
    with connection_scope(engine, write=True) as conn:
        conn.execute(update(Run).where(Run.id == run_id).values(heartbeat_at=utcnow() - timedelta(seconds=seconds)))
