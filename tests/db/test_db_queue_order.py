"""The fair queue on both backends: the order a queue's runs are taken in (priority, then the owner's recent GPU
time, then age), the claim that follows it under racing workers, and priority changes only while queued."""

from __future__ import annotations

import threading
from datetime import timedelta

import pytest
from sqlalchemy import Engine, update

from db import repo
from db.models import Run
from db.types import utcnow

GPU = {"device": "cuda", "data": {"name": "digits"}, "model": {"name": "mlp"}}
CPU = {"device": "cpu", "data": {"name": "digits"}, "model": {"name": "mlp"}}
HOUR = 3600.0


def _used(engine: Engine, owner: str, start, end) -> str:
    """A finished run of `owner` that held one GPU from `start` to `end`."""
    run = repo.create_run(engine, GPU, owner=owner)
    repo.claim_run(engine, run.id, "w0")
    repo.finish_run(engine, run.id, "completed")
    with engine.begin() as c:
        c.execute(update(Run).where(Run.id == run.id).values(started_at=start, finished_at=end))
    return run.id


def test_priority_first_then_the_owner_with_less_recent_gpu_time_then_the_oldest(engine: Engine) -> None:
    now = utcnow() + timedelta(hours=1)
    _used(engine, "ada", now - timedelta(hours=3), now - timedelta(hours=1))  # two GPU-hours, ended an hour ago
    ada_old = repo.create_run(engine, GPU, owner="ada", name="ada-old")
    bob_1 = repo.create_run(engine, GPU, owner="bob", name="bob-1")
    bob_2 = repo.create_run(engine, GPU, owner="bob", name="bob-2")
    ada_high = repo.create_run(engine, GPU, owner="ada", name="ada-high", priority=1)
    cyd_low = repo.create_run(engine, GPU, owner="cyd", name="cyd-low", priority=-1)
    repo.create_run(engine, CPU, owner="bob", name="elsewhere")  # another queue: not in this one's order

    order = repo.queue_order(engine, "gpu", now=now, half_life_s=4 * HOUR)

    assert [q.id for q in order] == [ada_high.id, bob_1.id, bob_2.id, ada_old.id, cyd_low.id]
    assert [q.position for q in order] == [1, 2, 3, 4, 5]
    ada_usage = {q.owner: q.owner_usage_s for q in order}
    assert ada_usage["ada"] == pytest.approx(2 * HOUR * 0.5 ** (1 / 4))
    assert ada_usage["bob"] == ada_usage["cyd"] == 0.0
    assert [q.id for q in repo.queue_order(engine, "gpu", now=now, limit=2)] == [ada_high.id, bob_1.id]


def test_a_running_run_counts_up_to_now_and_old_usage_fades(engine: Engine) -> None:
    now = utcnow() + timedelta(hours=1)
    busy = repo.create_run(engine, GPU, owner="ada")
    repo.claim_run(engine, busy.id, "w0", now=now - timedelta(minutes=30))  # running: half a GPU-hour so far
    _used(engine, "bob", now - timedelta(days=3, hours=10), now - timedelta(days=3))  # ten hours, three days ago
    ada = repo.create_run(engine, GPU, owner="ada")
    bob = repo.create_run(engine, GPU, owner="bob")

    order = repo.queue_order(engine, "gpu", now=now, half_life_s=4 * HOUR)

    assert [q.id for q in order] == [bob.id, ada.id]  # 10 h × 0.5**18 weighs far less than half an hour now
    assert order[1].owner_usage_s == pytest.approx(HOUR / 2)


def test_racing_claimers_take_every_queued_run_exactly_once_in_order(engine: Engine) -> None:
    runs = [repo.create_run(engine, GPU, owner=f"p{i % 3}") for i in range(24)]
    best = repo.queue_order(engine, "gpu")[0].id
    claimers = 8
    barrier = threading.Barrier(claimers)
    taken: dict[str, list[str]] = {f"w{i}": [] for i in range(claimers)}

    def claim(worker: str) -> None:
        barrier.wait()
        while (run := repo.claim_next(engine, "gpu", worker)) is not None:
            taken[worker].append(run.id)

    threads = [threading.Thread(target=claim, args=(w,)) for w in taken]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    every = [run_id for ids in taken.values() for run_id in ids]
    assert sorted(every) == sorted(r.id for r in runs)  # each once, none left behind
    assert repo.queue_order(engine, "gpu") == []
    assert all(repo.get_run(engine, i).worker_id == w for w, ids in taken.items() for i in ids)  # its claimer's
    assert best in {ids[0] for ids in taken.values() if ids}  # the best run went to one worker's first claim


def test_a_claim_takes_the_best_run_not_the_first_queued(engine: Engine) -> None:
    first = repo.create_run(engine, GPU, owner="ada")
    urgent = repo.create_run(engine, GPU, owner="bob", priority=1)
    assert repo.claim_next(engine, "gpu", "w1").id == urgent.id
    assert repo.claim_next(engine, "gpu", "w1").id == first.id
    assert repo.claim_next(engine, "gpu", "w1") is None


def test_priority_changes_only_while_queued_and_only_to_a_known_level(engine: Engine) -> None:
    run = repo.create_run(engine, GPU, owner="ada")
    assert repo.set_priority(engine, run.id, 1).priority == 1
    with pytest.raises(ValueError, match="priority 5"):
        repo.set_priority(engine, run.id, 5)
    with pytest.raises(ValueError, match="priority 2"):
        repo.create_run(engine, GPU, owner="ada", priority=2)
    repo.claim_run(engine, run.id, "w1")
    assert repo.set_priority(engine, run.id, -1) is None
    assert repo.get_run(engine, run.id).priority == 1
    with pytest.raises(repo.RunNotFound):
        repo.set_priority(engine, "nosuchrun", 0)


def test_a_queues_typical_run_time_is_the_median_of_its_newest_completed_runs(engine: Engine) -> None:
    now = utcnow()
    for i, minutes in enumerate((10, 20, 30, 600)):  # the oldest (ten hours) is not among the newest three
        _used(engine, "ada", now - timedelta(hours=i + 1, minutes=minutes), now - timedelta(hours=i + 1))
    failed = repo.create_run(engine, GPU, owner="ada")
    repo.claim_run(engine, failed.id, "w0")
    repo.finish_run(engine, failed.id, "failed")  # only completed runs say how long a run takes
    assert repo.typical_run_s(engine, ["gpu", "cpu"], last=3) == {"gpu": pytest.approx(20 * 60.0)}
    assert repo.typical_run_s(engine, []) == {}


def test_one_queues_walk_of_the_index_finds_the_same_groups_as_a_scan_of_every_queue(engine: Engine) -> None:
    for i in range(24):  # owners in and out of order, every priority, another queue, and runs no longer queued
        run = repo.create_run(engine, GPU if i % 5 else CPU, owner=f"p{(i * 7) % 6}", priority=i % 3 - 1)
        if i % 4 == 0:
            repo.claim_run(engine, run.id, "w0")
    now = utcnow()  # (running runs count up to now: one now for both)
    walked = repo.queue_order(engine, "gpu", now=now)  # one queue: the recursive walk
    scanned = repo.queue_orders(engine, ["gpu", "cpu"], now=now)["gpu"]  # several: one DISTINCT over them
    assert [q.id for q in walked] == [q.id for q in scanned]
    assert {(q.priority, q.owner) for q in walked} == {
        (r.priority, r.owner) for r in repo.list_runs(engine, status="queued", limit=100).runs if r.spec == GPU
    }


def test_a_run_on_several_gpus_counts_each_of_them(engine: Engine) -> None:
    now = utcnow() + timedelta(hours=1)
    pair = repo.create_run(engine, {**GPU, "resources": {"gpus": 2}}, owner="ada")  # the gpu-x2 queue
    repo.claim_run(engine, pair.id, "w0", now=now - timedelta(hours=1))
    usage = repo.recent_usage(engine, ["ada", "bob"], now=now, half_life_s=4 * HOUR)
    assert usage == {"ada": pytest.approx(2 * HOUR), "bob": 0.0}


def test_0012_gives_existing_runs_their_queue_and_goes_down_and_up_again(database_url: str) -> None:
    import sqlalchemy as sa

    from db.engine import make_engine
    from db.migrate import downgrade, upgrade
    from db.models import UTCDateTime

    upgrade(database_url, "0011")
    engine = make_engine(database_url)
    try:
        old = sa.table(  # the run table as 0011 left it: no queue, no priority
            "run",
            *(sa.column(c) for c in ("id", "name", "owner", "status", "spec_hash", "attempt", "cancel_requested")),
            sa.column("spec", sa.JSON),
            sa.column("summary", sa.JSON),
            sa.column("created_at", UTCDateTime()),
        )
        specs = {"single": GPU, "pair": {**GPU, "resources": {"gpus": 2}}, "cpu": CPU}
        with engine.begin() as c:
            for name, spec in specs.items():
                c.execute(
                    sa.insert(old).values(
                        id=name,
                        name=name,
                        owner="ada",
                        status="queued",
                        spec=spec,
                        spec_hash="0" * 64,
                        attempt=0,
                        cancel_requested=False,
                        summary={},
                        created_at=utcnow(),
                    )
                )
        upgrade(database_url)
        with engine.connect() as c:
            assert dict(c.execute(sa.select(Run.id, Run.queue)).all()) == {
                "single": "gpu",
                "pair": "gpu-x2",
                "cpu": "cpu",
            }
            assert {p for (p,) in c.execute(sa.select(Run.priority))} == {0}
        assert downgrade(database_url, "0011") == "0011"
        assert not {"queue", "priority"} & {col["name"] for col in sa.inspect(engine).get_columns("run")}
        upgrade(database_url)
        assert [q.id for q in repo.queue_order(engine, "gpu")] == ["single"]
    finally:
        engine.dispose()


def test_the_dashboards_list_of_waiting_runs_starts_with_who_goes_next_however_many_wait(engine: Engine) -> None:
    now = utcnow() + timedelta(hours=1)
    _used(engine, "ada", now - timedelta(hours=3), now - timedelta(hours=1))  # ada's sweep has had its share
    sweep = [repo.create_run(engine, GPU, owner="ada") for _ in range(12)]
    cpu = [repo.create_run(engine, CPU, owner="ada") for _ in range(3)]
    lost = repo.create_run(engine, GPU, owner="cyd")
    repo.claim_run(engine, lost.id, "w0")
    repo.mark_lost(engine, -1)
    single = repo.create_run(engine, GPU, owner="bob")  # queued last, goes first
    shown = repo.waiting(engine, limit=5, now=now)
    assert shown.total == 12 + 3 + 1 + 1
    # the lost run; then the queues' first two places (each queue's in its order): cpu, then gpu with bob's run first
    assert [r.id for r in shown.runs] == [lost.id, cpu[0].id, cpu[1].id, single.id, sweep[0].id]
    assert shown.places[single.id].position == 1 and shown.places[sweep[-1].id].position == 13
    assert lost.id not in shown.places  # a lost run has no place: its own message resumes it
