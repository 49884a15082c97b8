"""Eight workers logging at full speed while the dashboard reads: no "database is
locked", no lost or doubled point, on SQLite and on Postgres.

Separate processes (spawned, as torchdeck's workers are), each with its own
engine, as in production.
"""

from __future__ import annotations

import multiprocessing
import threading
import time
from concurrent.futures import ProcessPoolExecutor

import pytest
from sqlalchemy import Engine, text

from db import repo
from db.engine import connection_scope, make_engine
from db.types import MetricPoint

WRITERS = 8
POINTS_PER_WRITER = 50_000
KEYS = ("train/loss", "lr")
STEPS = POINTS_PER_WRITER // len(KEYS)
STEPS_PER_FLUSH = 500  # what a sink flushing every ~0.5 s sends from a fast loop
TIMEOUT_S = 240


def _batch(start: int) -> list[MetricPoint]:
    return [
        MetricPoint(key, step, 1.0 / (step + 1) if key == "train/loss" else 0.1, epoch=step // 1000)
        for step in range(start, start + STEPS_PER_FLUSH)
        for key in KEYS
    ]


def write_run(url: str, run_id: str) -> tuple[int, int]:
    """A worker's sink: flush after flush as fast as it can, then replay its first flush."""
    engine = make_engine(url)
    try:
        stored = sum(repo.append_metrics(engine, run_id, _batch(s)) for s in range(0, STEPS, STEPS_PER_FLUSH))
        replayed = repo.append_metrics(engine, run_id, _batch(0))
        return stored, replayed
    finally:
        engine.dispose()


def read_dashboard(url: str, run_ids: list[str]) -> int:
    """The UI polling: the runs table and a chart, until every run is complete."""
    engine = make_engine(url)
    deadline = time.monotonic() + TIMEOUT_S
    polls = 0
    try:
        while time.monotonic() < deadline:
            page = repo.list_runs(engine, limit=50)
            chart = repo.series(engine, run_ids[polls % len(run_ids)], "train/loss")
            assert len(chart) <= 2000
            polls += 1
            counts = [r.metrics["train/loss"].count if "train/loss" in r.metrics else 0 for r in page.runs]
            if counts == [STEPS] * len(run_ids):
                return polls
            time.sleep(0.05)  # a browser polls every second or so; leave the CPUs to the writers
        raise TimeoutError(f"runs still incomplete after {TIMEOUT_S} s: {counts}")
    finally:
        engine.dispose()


def test_eight_writers_and_a_reader_lose_nothing_and_never_lock(engine: Engine) -> None:
    url = engine.url.render_as_string(hide_password=False)
    run_ids = [repo.create_run(engine, {"writer": i}).id for i in range(WRITERS)]
    spawn = multiprocessing.get_context("spawn")
    with ProcessPoolExecutor(max_workers=WRITERS + 1, mp_context=spawn) as pool:
        reader = pool.submit(read_dashboard, url, run_ids)
        writers = [pool.submit(write_run, url, run_id) for run_id in run_ids]
        results = [w.result(timeout=TIMEOUT_S) for w in writers]
        polls = reader.result(timeout=TIMEOUT_S)
    assert results == [(POINTS_PER_WRITER, 0)] * WRITERS
    assert polls >= 1

    with connection_scope(engine) as conn:
        for run_id in run_ids:
            stored = conn.execute(
                text("SELECT count(*), count(DISTINCT step), sum(step) FROM metric WHERE run_id = :r AND key = :k"),
                {"r": run_id, "k": "train/loss"},
            ).one()
            assert tuple(stored) == (STEPS, STEPS, STEPS * (STEPS - 1) // 2)
            per_level = conn.execute(
                text("SELECT level, sum(count) FROM metric_rollup WHERE run_id = :r GROUP BY level"), {"r": run_id}
            ).all()
            assert {int(total) for _, total in per_level} == {POINTS_PER_WRITER}
    for run_id in run_ids:
        chart = repo.series(engine, run_id, "train/loss")
        assert chart.total_points == STEPS and chart.max.value == 1.0  # type: ignore[union-attr]


# SQLite serializes every writer (BEGIN IMMEDIATE): there a delete and a claim cannot interleave at all.
@pytest.mark.parametrize("database_url", ["postgres"], indirect=True)
def test_a_delete_racing_a_claim_on_postgres_never_deletes_a_claimed_run(engine: Engine) -> None:
    """The claim's UPDATE is in flight (uncommitted) when the delete starts: the delete waits for it on the
    run's row and then refuses, instead of deleting a run a worker has just taken."""
    run = repo.create_run(engine, {"lr": 0.1})
    repo.append_metrics(engine, run.id, [MetricPoint("train/loss", 1, 0.5)])
    outcome: list[BaseException | list[str]] = []
    with engine.connect() as claim:
        claim.begin()
        claim.execute(
            text("UPDATE run SET status = 'running', worker_id = 'w1', attempt = 1 WHERE id = :r"), {"r": run.id}
        )
        deleting = threading.Thread(target=lambda: outcome.append(_try_delete(engine, run.id)))
        deleting.start()
        deadline = time.monotonic() + TIMEOUT_S
        waiting = text(
            "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' AND datname = current_database()"
        )
        with make_engine(engine.url.render_as_string(hide_password=False)).connect() as watch:
            while True:
                seen = watch.execute(waiting).scalar()
                watch.rollback()  # pg_stat_activity is a snapshot taken once per transaction: a new one each look
                if seen:
                    break
                assert time.monotonic() < deadline and deleting.is_alive(), f"the delete did not wait: {outcome}"
                time.sleep(0.05)
        claim.commit()
    deleting.join(TIMEOUT_S)
    assert isinstance(outcome[0], repo.RunStillActive), outcome
    kept = repo.get_run(engine, run.id)
    assert kept.status == "running" and kept.metrics["train/loss"].count == 1


def _try_delete(engine: Engine, run_id: str) -> BaseException | list[str]:
    try:
        return repo.delete_run(engine, run_id)
    except Exception as e:  # noqa: BLE001 - the test inspects it
        return e


def test_concurrent_submissions_never_pass_the_queued_limit(engine: Engine) -> None:
    """Eight submissions by one owner at once against a limit of three: exactly three are stored, on both
    backends (SQLite serialises writers; Postgres takes a per-owner lock before counting)."""
    start = threading.Barrier(8)
    outcomes: list[object] = []

    def submit() -> None:
        start.wait(TIMEOUT_S)
        try:
            outcomes.append(repo.create_run(engine, {"lr": 0.1}, owner="ana", max_queued=3).id)
        except repo.QueueLimitReached as e:
            outcomes.append(e)

    threads = [threading.Thread(target=submit) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(TIMEOUT_S)
    assert sum(isinstance(o, str) for o in outcomes) == 3 and len(outcomes) == 8
    assert repo.list_runs(engine, owner="ana").total == 3
    assert repo.create_run(engine, {"lr": 0.1}, owner="bob", max_queued=3).owner == "bob"
