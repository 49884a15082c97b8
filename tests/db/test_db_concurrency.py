"""Eight workers logging at full speed while the dashboard reads: no "database is
locked", no lost or doubled point, on SQLite and on Postgres.

Separate processes (spawned, as torchdeck's workers are), each with its own
engine, as in production.
"""

from __future__ import annotations

import multiprocessing
import time
from concurrent.futures import ProcessPoolExecutor

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
            stored = conn.execute(text(
                "SELECT count(*), count(DISTINCT step), sum(step) FROM metric WHERE run_id = :r AND key = :k"
            ), {"r": run_id, "k": "train/loss"}).one()
            assert tuple(stored) == (STEPS, STEPS, STEPS * (STEPS - 1) // 2)
            per_level = conn.execute(text(
                "SELECT level, sum(count) FROM metric_rollup WHERE run_id = :r GROUP BY level"
            ), {"r": run_id}).all()
            assert {int(total) for _, total in per_level} == {POINTS_PER_WRITER}
    for run_id in run_ids:
        chart = repo.series(engine, run_id, "train/loss")
        assert chart.total_points == STEPS and chart.max.value == 1.0  # type: ignore[union-attr]
