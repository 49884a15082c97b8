"""Storage benchmark: ingest, a 1M-point chart, the runs table of 10k runs.

    python benchmarks/bench_db.py            # SQLite, and Postgres when its programs are installed
    python benchmarks/bench_db.py --quick    # 100k points, 1k runs

Prints `name=value` lines. Each figure is followed by a ratio against a bare
DBAPI baseline doing the same job in the same run, so the overhead of
torchdeck's layer reads independently of the machine. A ratio above 1 means
torchdeck is faster than the baseline:
- ingest_vs_raw_executemany: torchdeck's points/s over a bare `executemany` of
  the same rows into an identical, empty table. The two alternate chunk by
  chunk so that a busy machine slows both alike; the baseline's rows are built
  before its clock starts, torchdeck's from MetricPoints inside it. torchdeck
  also checks the run, skips stored points and maintains the rollup. The
  baseline's own rate is printed too (ingest_raw_executemany_pts_per_s).
- series_vs_raw_select: the time to SELECT every point of the series (what a
  chart without downsampling would do) over torchdeck's time.
- list_runs_vs_raw_select: one raw SQL page (count, 50 runs, their summary
  rows) over torchdeck's page (which also fetches tags and builds records).
Targets: >= 200,000 points/s ingest, <= 50 ms series, <= 300 ms list.
Postgres runs with fsync on, as a real server would.
"""

from __future__ import annotations

import argparse
import os
import sqlite3
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from sqlalchemy import Engine, insert  # noqa: E402
from sqlalchemy.engine import make_url  # noqa: E402

from db import repo  # noqa: E402
from db.engine import connection_scope, make_engine  # noqa: E402
from db.metrics import prepare, write_batch  # noqa: E402
from db.migrate import upgrade  # noqa: E402
from db.models import Run  # noqa: E402
from db.types import MetricPoint, utcnow  # noqa: E402

BATCH = 10_000  # points per append: a sink flush from a fast training loop
CHUNK = 100_000  # ingest alternates torchdeck and the baseline every CHUNK points
KEY = "train/loss"
SUMMARY_KEYS = ("train/loss", "val/loss", "val/acc")
PAGE_SQL = (
    "SELECT count(*) FROM run",
    "SELECT * FROM run ORDER BY created_at DESC, id DESC LIMIT 50",
    "SELECT * FROM metric_rollup WHERE run_id IN ({marks}) AND level = 63",
)


def emit(name: str, value: float) -> None:
    print(f"{name}={value:.4g}" if isinstance(value, float) else f"{name}={value}", flush=True)


def median_ms(fn: Callable[[], object], repeat: int = 15) -> float:
    """Median wall time of `fn` in ms, after one warm-up call."""
    fn()
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        fn()
        times.append((time.perf_counter() - start) * 1000)
    return statistics.median(times)


def curve(n: int) -> list[MetricPoint]:
    value, points = 5.0, []
    for step in range(n):
        value = value * 0.99999 + ((step * 7919) % 101 - 50) * 1e-4
        points.append(MetricPoint(KEY, step, value, epoch=step // 10_000, wall_time=1.7e9 + step))
    return points


class RawSQLite:
    """The baseline: the sqlite3 module with the same pragmas, nothing else."""

    mark = "?"

    def __init__(self, url: str) -> None:
        self.conn = sqlite3.connect(make_url(url).database or "", isolation_level=None)
        self.conn.execute("PRAGMA synchronous=NORMAL")
        self.conn.execute("PRAGMA journal_mode=WAL")

    def insert(self, rows: list[tuple]) -> None:
        for i in range(0, len(rows), BATCH):
            self.conn.execute("BEGIN IMMEDIATE")
            self.conn.executemany("INSERT INTO metric VALUES (?, ?, ?, ?, ?, ?, ?)", rows[i : i + BATCH])
            self.conn.execute("COMMIT")

    def execute(self, sql: str, params: Any = ()) -> list[tuple]:
        return self.conn.execute(sql, params).fetchall()


class RawPostgres:
    """The baseline: psycopg 3, executemany (and COPY, the fastest way in)."""

    mark = "%s"

    def __init__(self, url: str) -> None:
        import psycopg

        parts = make_url(url)
        self.conn = psycopg.connect(
            dbname=parts.database, user=parts.username, host=parts.query["host"], port=int(parts.query["port"])
        )

    def insert(self, rows: list[tuple]) -> None:
        for i in range(0, len(rows), BATCH):
            with self.conn.cursor() as cur:
                cur.executemany("INSERT INTO metric VALUES (%s, %s, %s, %s, %s, %s, %s)", rows[i : i + BATCH])
            self.conn.commit()

    def copy(self, rows: list[tuple]) -> None:
        for i in range(0, len(rows), BATCH):
            with self.conn.cursor() as cur, cur.copy("COPY metric FROM STDIN") as copy:
                for row in rows[i : i + BATCH]:
                    copy.write_row(row)
            self.conn.commit()

    def execute(self, sql: str, params: Any = ()) -> list[tuple]:
        return self.conn.execute(sql, params).fetchall()  # type: ignore[arg-type]


def bench_ingest(engine: Engine, raw: Any, points: list[MetricPoint], raw_every: int) -> tuple[str, dict[str, float]]:
    """Points/s of torchdeck and of the baselines, alternating chunk by chunk."""
    run_id = repo.create_run(engine, {"bench": "ingest"}).id
    spent = {"torchdeck": 0.0, "raw": 0.0, "copy": 0.0}
    raw_points = 0
    for n, first in enumerate(range(0, len(points), CHUNK)):
        chunk = points[first : first + CHUNK]
        start = time.perf_counter()
        for i in range(0, len(chunk), BATCH):
            repo.append_metrics(engine, run_id, chunk[i : i + BATCH])
        spent["torchdeck"] += time.perf_counter() - start
        if n % raw_every:
            continue
        raw_points += len(chunk)
        for method, prefix in (("raw", "raw"), ("copy", "cpy")):
            if method == "copy" and not hasattr(raw, "copy"):
                continue
            rows = [(prefix + run_id[3:], p.key, p.step, p.epoch, p.value, False, p.wall_time) for p in chunk]
            start = time.perf_counter()
            getattr(raw, "insert" if method == "raw" else "copy")(rows)
            spent[method] += time.perf_counter() - start
    rates = {"torchdeck": len(points) / spent["torchdeck"], "raw": raw_points / spent["raw"]}
    if spent["copy"]:
        rates["copy"] = raw_points / spent["copy"]
    return run_id, rates


def seed_runs(engine: Engine, n_runs: int) -> None:
    """n_runs finished runs, each with a few summary metrics (bulk, not timed)."""
    now = utcnow()
    for first in range(0, n_runs, 1000):
        ids = [f"b{i:011d}" for i in range(first, min(first + 1000, n_runs))]
        with connection_scope(engine, write=True) as conn:
            conn.execute(
                insert(Run),
                [
                    dict(
                        id=run_id,
                        name=f"run {run_id}",
                        owner="bench",
                        status="completed",
                        spec={"i": run_id},
                        spec_hash="0" * 64,
                        created_at=now,
                        attempt=1,
                        summary={},
                        cancel_requested=False,
                    )
                    for run_id in ids
                ],
            )
            for j, run_id in enumerate(ids):
                points = [MetricPoint(k, s, (j % 97) / 97 + s / 100) for k in SUMMARY_KEYS for s in range(20)]
                write_batch(conn, prepare(run_id, points))


def raw_page(raw: Any) -> None:
    raw.execute(PAGE_SQL[0])
    ids = [row[0] for row in raw.execute(PAGE_SQL[1])]
    raw.execute(PAGE_SQL[2].format(marks=", ".join([raw.mark] * len(ids))), ids)


def run_backend(name: str, url: str, raw_url: str, n_points: int, n_runs: int) -> None:
    upgrade(url)
    upgrade(raw_url)
    engine = make_engine(url)
    raw_ingest = RawSQLite(raw_url) if name == "sqlite" else RawPostgres(raw_url)
    # Postgres' executemany is slow: measure it on every fifth chunk only.
    run_id, rates = bench_ingest(engine, raw_ingest, curve(n_points), raw_every=1 if name == "sqlite" else 5)
    raw = RawSQLite(url) if name == "sqlite" else RawPostgres(url)

    chart = repo.series(engine, run_id, KEY)
    series_ms = median_ms(lambda: repo.series(engine, run_id, KEY))
    select_all = f"SELECT step, value FROM metric WHERE run_id = {raw.mark} AND key = {raw.mark} ORDER BY step"
    raw_series_ms = median_ms(lambda: raw.execute(select_all, (run_id, KEY)), repeat=5)

    seed_runs(engine, n_runs)
    page = repo.list_runs(engine, limit=50)
    assert len(page.runs) == 50 and all(r.metrics for r in page.runs), "listed runs carry summaries"
    list_ms = median_ms(lambda: repo.list_runs(engine, limit=50))
    raw_list_ms = median_ms(lambda: raw_page(raw))
    engine.dispose()

    size = f"{n_points // 1_000_000}m" if n_points >= 1_000_000 else f"{n_points // 1000}k"
    emit(f"ingest_pts_per_s_{name}", round(rates["torchdeck"]))
    emit(f"ingest_vs_raw_executemany_{name}", rates["torchdeck"] / rates["raw"])
    emit(f"ingest_raw_executemany_pts_per_s_{name}", round(rates["raw"]))  # how busy the machine was
    if "copy" in rates:
        emit(f"ingest_vs_raw_copy_{name}", rates["torchdeck"] / rates["copy"])
    emit(f"series_ms_{size}_{name}", series_ms)
    emit(f"series_points_{size}_{name}", len(chart))
    emit(f"series_vs_raw_select_{name}", raw_series_ms / series_ms)
    emit(f"list_runs_ms_{n_runs // 1000}k_{name}", list_ms)
    emit(f"list_runs_vs_raw_select_{name}", raw_list_ms / list_ms)


def run_postgres(n_points: int, n_runs: int) -> None:
    from tests._servers import PostgresUnavailable, start_postgres

    try:
        server = start_postgres(durable=True)
    except PostgresUnavailable as exc:
        print(f"# postgres skipped: {exc}", file=sys.stderr)
        return
    try:
        run_backend("postgres", server.create_database("bench"), server.create_database("bench_raw"), n_points, n_runs)
    finally:
        server.stop()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="100k points and 1k runs")
    parser.add_argument("--no-postgres", action="store_true")
    args = parser.parse_args()
    n_points, n_runs = (100_000, 1_000) if args.quick else (1_000_000, 10_000)
    print(f"# {os.cpu_count()} CPUs; ratios > 1: torchdeck faster than the raw baseline", flush=True)
    with tempfile.TemporaryDirectory(prefix="torchdeck-bench-") as tmp:
        run_backend("sqlite", f"sqlite:///{tmp}/bench.db", f"sqlite:///{tmp}/raw.db", n_points, n_runs)
    if not args.no_postgres:
        run_postgres(n_points, n_runs)


if __name__ == "__main__":
    main()
