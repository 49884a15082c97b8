"""The fair queue, replayed: a simulated day of a team's submissions against the real claim on a real database.

    python benchmarks/bench_queue.py                 # SQLite, and Postgres when its programs are installed
    python benchmarks/bench_queue.py --no-postgres

No training and no broker: WORKERS simulated GPU workers, and a simulated clock. Whenever a worker is free and a
run is queued, it claims one, as a worker does on each message (a message is a token for its queue): under `fifo`
the oldest queued run (what the broker's order alone gave), under `fair` db.queue_order.claim_next, the function
the workers call. Both claim with the real conditional UPDATE and pass the simulated `now`; the claimed run then
"runs" for its simulated duration. The day (DAY below): ada launches a 40-trial sweep at 9:00, cyd a 12-trial
sweep at 9:30; bob and dan submit single runs through the day.

Prints `name=value` lines:
- share_<person>_<policy>, fair_share_<person>: each person's fraction of the GPU time used in the morning window
  (9:00 to 13:00, while the sweeps contend), against a max-min fair split of it (each person gets an equal part,
  less if they asked for less: the water-filling of their submitted demand, capped by the window).
- longest_single_wait_min_<policy>: the longest wait (minutes) of a single run (not a sweep trial) for a GPU.
- claim_ms_median / claim_ms_p90 / claim_ms_min / claim_ms_max: claim_next with CLAIM_QUEUED runs queued (20 owners,
  three priorities, a day of finished runs behind them). Target: median <= 20 ms.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from sqlalchemy import Engine, insert, select, text, update  # noqa: E402

from db import repo  # noqa: E402
from db.engine import connection_scope, make_engine  # noqa: E402
from db.migrate import upgrade  # noqa: E402
from db.models import Run  # noqa: E402

WORKERS = 4
START = datetime(2026, 1, 5, 9, 0, tzinfo=UTC)
WINDOW = (START, START + timedelta(hours=4))
HALF_LIFE_S = 4 * 3600.0
CLAIM_QUEUED = 10_000
CLAIMS = 50
GPU = {"device": "cuda"}


def _day() -> list[tuple[float, str, float, bool]]:
    """(minutes after 9:00, person, minutes it trains, a sweep's trial) for every run of the day."""
    day = [(0.0, "ada", 30.0, True) for _ in range(40)]
    day += [(30.0, "cyd", 20.0, True) for _ in range(12)]
    day += [(m, "bob", 45.0, False) for m in (5.0, 90.0, 240.0, 360.0)]
    day += [(60.0 * h + 10, "dan", 15.0, False) for h in range(1, 9)]
    day += [(300.0, "cyd", 60.0, False), (301.0, "cyd", 60.0, False)]
    return sorted(day, key=lambda d: d[0])


DAY = _day()


def _oldest(engine: Engine, worker: str, now: datetime):
    """The broker's order: the oldest queued run, claimed with the same conditional UPDATE."""
    while True:
        with connection_scope(engine) as conn:
            query = select(Run.id).where(Run.status == "queued", Run.queue == "gpu")
            first = conn.execute(query.order_by(Run.created_at, Run.id).limit(1)).scalar()
        if first is None:
            return None
        if (run := repo.claim_run(engine, first, worker, now=now)) is not None:
            return run


def _submit(engine: Engine, at: datetime, person: str, minutes: float, trial: bool) -> tuple[str, float, bool]:
    run = repo.create_run(engine, GPU, owner=person, name=f"{person}-{'trial' if trial else 'run'}")
    with connection_scope(engine, write=True) as conn:  # the simulated submit time
        conn.execute(update(Run).where(Run.id == run.id).values(created_at=at))
    return run.id, minutes, trial


def _finish(engine: Engine, run_id: str, at: datetime) -> None:
    with connection_scope(engine, write=True) as conn:
        conn.execute(update(Run).where(Run.id == run_id).values(status="completed", finished_at=at))


def simulate(engine: Engine, policy: str) -> dict[str, float]:
    """Replay DAY under `policy`; the figures of the module docstring for it."""
    pending = list(DAY)
    runs: dict[str, tuple[str, float, bool, datetime]] = {}  # id: person, minutes, trial, submitted
    busy: dict[str, tuple[datetime, str]] = {}  # worker: (ends at, run id)
    spans: list[tuple[str, datetime, datetime]] = []  # person, start, end
    waits: list[float] = []
    now = START
    while True:
        for worker, (end, run_id) in list(busy.items()):
            if end <= now:
                _finish(engine, run_id, end)
                del busy[worker]
        while pending and START + timedelta(minutes=pending[0][0]) <= now:
            minute, person, minutes, trial = pending.pop(0)
            at = START + timedelta(minutes=minute)
            run_id, _, _ = _submit(engine, at, person, minutes, trial)
            runs[run_id] = (person, minutes, trial, at)
        for worker in (f"w{i}" for i in range(WORKERS)):
            if worker in busy:
                continue
            run = _oldest(engine, worker, now) if policy == "fifo" else _claim_fair(engine, worker, now)
            if run is None:
                break
            person, minutes, trial, submitted = runs[run.id]
            end = now + timedelta(minutes=minutes)
            busy[worker] = (end, run.id)
            spans.append((person, now, end))
            if not trial:
                waits.append((now - submitted).total_seconds() / 60)
        upcoming = [end for end, _ in busy.values()] + [START + timedelta(minutes=p[0]) for p in pending[:1]]
        if not upcoming:
            break
        now = min(upcoming)
    return _figures(spans, waits)


def _claim_fair(engine: Engine, worker: str, now: datetime):
    return repo.claim_next(engine, "gpu", worker, now=now, half_life_s=HALF_LIFE_S)


def _figures(spans: list[tuple[str, datetime, datetime]], waits: list[float]) -> dict[str, float]:
    lo, hi = WINDOW
    used: dict[str, float] = {}
    for person, start, end in spans:
        overlap = (min(end, hi) - max(start, lo)).total_seconds()
        used[person] = used.get(person, 0.0) + max(overlap, 0.0)
    total = sum(used.values()) or 1.0
    out = {f"share_{p}": used.get(p, 0.0) / total for p in sorted({d[1] for d in DAY})}
    out["longest_single_wait_min"] = max(waits, default=0.0)
    return out


def fair_shares() -> dict[str, float]:
    """Max-min fair split of the window's GPU time: water-filling of each person's demand within the window (the
    minutes they submitted before its end, no more than the window could give them)."""
    lo, hi = WINDOW
    capacity = WORKERS * (hi - lo).total_seconds()
    demand: dict[str, float] = {}
    for minute, person, minutes, _ in DAY:
        at = START + timedelta(minutes=minute)
        if at < hi:
            demand[person] = demand.get(person, 0.0) + min(minutes * 60, (hi - at).total_seconds())
    shares, left, people = {}, capacity, sorted(demand, key=demand.get)
    for i, person in enumerate(people):
        give = min(demand[person], left / (len(people) - i))
        shares[person], left = give, left - give
    given = sum(shares.values())
    return {f"fair_share_{p}": shares.get(p, 0.0) / given for p in sorted({d[1] for d in DAY})}


def claim_times(url: str) -> list[float]:
    """Milliseconds per claim_next with CLAIM_QUEUED runs queued."""
    engine = make_engine(url)
    now = START + timedelta(hours=12)
    rows = []
    for i in range(CLAIM_QUEUED + 2000):
        finished = i >= CLAIM_QUEUED  # a day of finished runs: what the owners' recent GPU time is read from
        rows.append(
            dict(
                id=f"q{i:011d}",
                name=f"run {i}",
                owner=f"person{i % 20}",
                status="completed" if finished else "queued",
                spec=GPU,
                spec_hash="0" * 64,
                created_at=now - timedelta(seconds=CLAIM_QUEUED + 2000 - i),
                started_at=now - timedelta(hours=(i % 24) + 1) if finished else None,
                finished_at=now - timedelta(hours=i % 24) if finished else None,
                attempt=1 if finished else 0,
                summary={},
                cancel_requested=False,
                queue="gpu",
                priority=(i % 3) - 1,
            )
        )
    with connection_scope(engine, write=True) as conn:
        for first in range(0, len(rows), 1000):
            conn.execute(insert(Run), rows[first : first + 1000])
    if engine.dialect.name == "postgresql":  # the statistics and visibility map autovacuum keeps after such an insert
        with engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
            conn.execute(text("VACUUM ANALYZE run"))
    times = []
    for k in range(CLAIMS):
        t = time.perf_counter()
        run = repo.claim_next(engine, "gpu", f"w{k}", now=now, half_life_s=HALF_LIFE_S)
        times.append((time.perf_counter() - t) * 1000)
        assert run is not None
    engine.dispose()
    return times


def run_backend(name: str, new_url) -> None:
    fair = fair_shares()
    for policy in ("fifo", "fair"):
        url = new_url(f"day_{policy}")
        upgrade(url)
        engine = make_engine(url)
        figures = simulate(engine, policy)
        engine.dispose()
        for key, value in figures.items():
            print(f"{name}_{key}_{policy}={value:.3f}", flush=True)
    for key, value in fair.items():
        print(f"{name}_{key}={value:.3f}", flush=True)
    url = new_url("claim")
    upgrade(url)
    ms = claim_times(url)
    q = statistics.quantiles(ms, n=10)
    print(f"{name}_claim_ms_median={statistics.median(ms):.2f}")
    print(f"{name}_claim_ms_p90={q[-1]:.2f}")
    print(f"{name}_claim_ms_min={min(ms):.2f}")
    print(f"{name}_claim_ms_max={max(ms):.2f}", flush=True)


def run_postgres() -> None:
    from tests._servers import PostgresUnavailable, start_postgres

    try:
        server = start_postgres(durable=True)
    except PostgresUnavailable as exc:
        print(f"# postgres skipped: {exc}", file=sys.stderr)
        return
    try:
        run_backend("postgres", server.create_database)
    finally:
        server.stop()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--no-postgres", action="store_true")
    args = parser.parse_args()
    print(f"# {WORKERS} workers; {len(DAY)} runs in the day; {CLAIM_QUEUED} queued for the claim's time", flush=True)
    with tempfile.TemporaryDirectory(prefix="torchdeck-bench-") as tmp:
        run_backend("sqlite", lambda name: f"sqlite:///{tmp}/{name}.db")
    if not args.no_postgres:
        run_postgres()


if __name__ == "__main__":
    main()
