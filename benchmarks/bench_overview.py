"""Overview benchmark: the server time of one refresh of the Overview page's live part.

    python benchmarks/bench_overview.py            # 50 running runs, 9 samples
    python benchmarks/bench_overview.py --runs 200 # more

Prints `overview_ms_50_running=<ms>`: app.ui.overview_view.load (everything one refresh shows: the pages of
running, finished and queued runs, their diagnosis findings, their small curves, the owners' names, the
queues' workers), uncached, median of the samples, over a SQLite database in a temporary folder holding 50
running runs of about 2,000 train/loss points and 20 val/acc points each, a few with diagnosis warnings,
plus finished and queued runs. Between two samples every running run writes new points, as the workers
would (not timed). Target ≤ 300 ms.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from sqlalchemy import Engine

from core.config import RunSpec
from db import repo
from db.engine import make_engine
from db.migrate import upgrade
from db.types import EventInput, MetricPoint

SPEC = RunSpec.model_validate(
    {"data": {"name": "digits", "image_size": 16}, "train": {"epochs": 20, "early_stopping": {"monitor": "val/acc"}}}
).model_dump(mode="json")
STEPS, EPOCHS = 2000, 20


def seed(engine: Engine, running: int) -> list[str]:
    """`running` runs with STEPS train/loss and EPOCHS val/acc points, 5 finished, 10 queued; the running ids."""
    ids = []
    for i in range(running + 5):
        r = repo.create_run(engine, SPEC, name=f"run-{i}", owner=("ana", "bo", "chen")[i % 3])
        repo.claim_run(engine, r.id, f"w{i % 8}", device="cuda:0")
        points = [MetricPoint("train/loss", s, 2.3 / (1 + 0.01 * s), 1 + s // 100) for s in range(1, STEPS + 1)]
        points += [MetricPoint("val/acc", e * 100, 0.5 + e / 50, e) for e in range(1, EPOCHS + 1)]
        repo.append_metrics(engine, r.id, points)
        repo.heartbeat(engine, r.id, worker_id=f"w{i % 8}", progress=0.5)
        if i % 7 == 0:
            repo.append_events(engine, r.id, [EventInput("diagnosis", "warning", "overfitting", code="overfitting")])
        if i >= running:
            repo.finish_run(engine, r.id, "completed", summary={"best": {"metric": "val/acc", "value": 0.9}})
        else:
            ids.append(r.id)
    for i in range(10):
        repo.create_run(engine, SPEC, name=f"queued-{i}", owner="ana")
    for w in range(8):
        repo.upsert_worker(engine, f"w{w}", hostname=f"gpu{w}", queues=["gpu"], current_run_id=None)
    return ids


def write_more(engine: Engine, ids: list[str], step: int) -> None:
    for run_id in ids:
        repo.append_metrics(engine, run_id, [MetricPoint("train/loss", s, 0.1, 21) for s in range(step, step + 10)])


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=50)
    ap.add_argument("--samples", type=int, default=9)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        url = f"sqlite:///{Path(tmp) / 'torchdeck.db'}"
        os.environ["TORCHDECK_DATABASE_URL"] = url
        upgrade(url)
        engine = make_engine(url)
        ids = seed(engine, args.runs)
        import streamlit.logger

        streamlit.logger.set_log_level("error")  # no "no runtime found" noise outside a page
        from app.ui import overview_view

        times, step = [], STEPS + 1
        overview_view.load(engine, 24 * 3600)  # warm: imports, the connection pool
        for _ in range(args.samples):
            write_more(engine, ids, step)
            step += 10
            t0 = time.perf_counter()
            snap = overview_view.load(engine, 24 * 3600)
            times.append((time.perf_counter() - t0) * 1000)
        assert len(snap.running) == args.runs and all(len(c) > 0 for c in snap.running["loss"])
        engine.dispose()
    print(f"# samples (ms): {', '.join(f'{t:.0f}' for t in times)}")
    print(f"overview_ms_{args.runs}_running={statistics.median(times):.4g}", flush=True)


if __name__ == "__main__":
    main()
