"""MLflow ingest benchmark: metric points per second that the real `mlflow` client's log_batch gets into torchdeck
(its MLflow tracking endpoint, app/tracking/) and into MLflow's own tracking server, side by side in one run.

    python benchmarks/bench_mlflow_ingest.py                            # 5 repeats of 100,000 points
    python benchmarks/bench_mlflow_ingest.py --points 50000 --repeats 3

Two servers, each started fresh on SQLite under one temporary directory, no network needed:
- torchdeck: `python -m app.cli ui` (local mode, no broker, as tests/e2e/conftest.py's serve_ui starts it) on a
  migrated database; the client logs into http://127.0.0.1:<port>/_torchdeck/mlflow;
- MLflow: `mlflow server --backend-store-uri sqlite:///... --workers 1` (uvicorn, one process, as torchdeck's
  dashboard is one), telemetry off, its job runner off (MLFLOW_SERVER_ENABLE_JOB_EXECUTION=false: GenAI jobs'
  worker processes, whose start would otherwise eat the CPU of the first repeats).
The client is this process: `MlflowClient(tracking_uri=...)` per side, the same installed mlflow client for both.

What is timed: `--points` points (`--keys` metric keys, logged step by step as a training loop logs them, the same
values and timestamps for both sides) sent with `MlflowClient.log_batch(run_id, metrics=[Metric(...), ...],
synchronous=True)`, `--batch` metrics per call (1,000: MLflow's per-request maximum), into a fresh run of each side
per repeat; from the first call to the last call's answer. The two sides alternate within each repeat, and which goes
first alternates between repeats (machines are noisy).

Preconditions, checked before anything is timed and failing loudly: both servers answer (their health URLs), and
take one small warm-up batch that reads back whole. After each timed repeat, each side's run holds every point
sent (read back with `MlflowClient.get_metric_history`, which both answer: every key, step, value and timestamp).

Prints a comment line per repeat with each side's points/s (and its time per log_batch call, with the part of it
that is this process's own CPU: the client's serialising, a floor that no server removes), then
`torchdeck_points_per_s=<median>`, `mlflow_server_points_per_s=<median>`,
`mlflow_client_ingest_vs_mlflow_server_min=` and `_max=` (the spread of the per-repeat ratios torchdeck/MLflow),
and last the headline, `mlflow_client_ingest_vs_mlflow_server=<median of the per-repeat ratios>`. Target: >= 3.
"""

from __future__ import annotations

import argparse
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
# Before mlflow is imported: no usage reports from the client (this process) nor from the MLflow server.
os.environ.update(MLFLOW_DISABLE_TELEMETRY="true", DO_NOT_TRACK="true")

from mlflow.entities import Metric  # noqa: E402
from mlflow.tracking import MlflowClient  # noqa: E402

from app.tracking import PATH  # noqa: E402
from db.migrate import upgrade  # noqa: E402
from tests._servers import free_port, stop_group, wait_http  # noqa: E402

START_TIMEOUT_S = 180  # a bound, never a wait: MLflow migrates its fresh database at start
BASE_MS = 1_767_225_600_000  # 2026-01-01, the timestamp of step 0
EXPERIMENT = "bench-mlflow-ingest"
SIDES = ("torchdeck", "mlflow_server")


def make_points(count: int, keys: int, seed: int = 0) -> list[Metric]:
    """`count` points, step by step, `keys` keys a step (a training loop's loss, accuracy, ...)."""
    rng = random.Random(seed)
    names = [f"metric_{k:02d}" for k in range(keys)]
    return [
        Metric(names[i % keys], rng.random(), BASE_MS + 10 * (i // keys), i // keys)  # key, value, timestamp, step
        for i in range(count)
    ]


@contextmanager
def _serving(cmd: list[str], env: dict[str, str], cwd: Path, log: Path, health: str) -> Iterator[None]:
    with open(log, "wb") as out:
        proc = subprocess.Popen(cmd, cwd=cwd, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        wait_http(health, START_TIMEOUT_S, proc, log)
        yield
    finally:
        stop_group(proc)


@contextmanager
def torchdeck_server(tmp: Path) -> Iterator[str]:
    """torchdeck's dashboard on a fresh migrated SQLite database (local mode: no token); yields its MLflow URI."""
    home = tmp / "torchdeck"
    home.mkdir()
    db_url = f"sqlite:///{home / 'torchdeck.db'}"
    upgrade(db_url)
    port = free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith("TORCHDECK_")}
    env.update(
        TORCHDECK_HOME=str(home),
        TORCHDECK_DATABASE_URL=db_url,
        TORCHDECK_BROKER_URL="redis://127.0.0.1:1/0",  # no broker: nothing here enqueues
        PYTHONUNBUFFERED="1",
    )
    cmd = [sys.executable, "-m", "app.cli", "ui", "--port", str(port)]
    with _serving(cmd, env, ROOT, home / "ui.log", f"http://127.0.0.1:{port}/_stcore/health"):
        yield f"http://127.0.0.1:{port}{PATH}"


@contextmanager
def mlflow_server(tmp: Path) -> Iterator[str]:
    """MLflow's own tracking server (3.x: uvicorn), one worker, on a fresh SQLite database; yields its URI."""
    home = tmp / "mlflow"
    home.mkdir()
    port = free_port()
    mlflow = Path(sys.executable).parent / "mlflow"
    cmd = [str(mlflow), "server", "--backend-store-uri", f"sqlite:///{home / 'mlflow.db'}"]
    cmd += ["--artifacts-destination", str(home / "mlartifacts"), "--host", "127.0.0.1", "--port", str(port)]
    cmd += ["--workers", "1"]
    # Its job runner (7 huey consumer processes for GenAI jobs, nothing of tracking) off: starting, they take some
    # 20 CPU seconds, which would land in the first repeats; off, the server is only what tracking needs.
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false"}
    with _serving(cmd, env, home, home / "server.log", f"http://127.0.0.1:{port}/health"):
        yield f"http://127.0.0.1:{port}"


def log_points(client: MlflowClient, experiment_id: str, points: list[Metric], batch: int) -> tuple[str, float, float]:
    """A fresh run, then every point through log_batch, `batch` a call; (the run's id, seconds of the logging, CPU
    seconds of this process meanwhile: the client's own share, the same work for both sides)."""
    run_id = client.create_run(experiment_id).info.run_id
    cpu0, t0 = time.process_time(), time.perf_counter()
    for start in range(0, len(points), batch):
        client.log_batch(run_id, metrics=points[start : start + batch], synchronous=True)
    return run_id, time.perf_counter() - t0, time.process_time() - cpu0


def check_stored(client: MlflowClient, run_id: str, points: list[Metric], side: str) -> None:
    """Every point sent is in the run: each key's history holds exactly its steps, values and timestamps."""
    sent: dict[str, list[tuple[int, float, int]]] = {}
    for p in points:
        sent.setdefault(p.key, []).append((p.step, p.value, p.timestamp))
    for key, expected in sent.items():
        got = sorted((m.step, m.value, m.timestamp) for m in client.get_metric_history(run_id, key))
        if got != expected:
            missing = len(set(expected) - set(got))
            raise SystemExit(
                f"{side}: run {run_id} metric {key!r} holds {len(got)} points, {len(expected)} were sent "
                f"({missing} sent points not read back)"
            )


def _clients(stack: ExitStack, tmp: Path) -> dict[str, tuple[MlflowClient, str]]:
    """Both servers started and warmed up: side → (its client, the benchmark's experiment id)."""
    uris = {
        "torchdeck": stack.enter_context(torchdeck_server(tmp)),
        "mlflow_server": stack.enter_context(mlflow_server(tmp)),
    }
    out = {}
    for side, uri in uris.items():
        client = MlflowClient(tracking_uri=uri)
        experiment_id = client.create_experiment(EXPERIMENT)
        warm = make_points(20, 2, seed=1)
        run_id, _, _ = log_points(client, experiment_id, warm, len(warm))
        check_stored(client, run_id, warm, side)
        out[side] = (client, experiment_id)
    return out


def run_repeats(clients: dict[str, tuple[MlflowClient, str]], points: list[Metric], args) -> dict[str, list[float]]:
    """Points per second of each side in each repeat (sides alternating, the first side alternating too)."""
    rates: dict[str, list[float]] = {side: [] for side in SIDES}
    calls = -(-len(points) // args.batch)
    for repeat in range(args.repeats):
        order = SIDES if repeat % 2 == 0 else SIDES[::-1]
        client_ms = {}
        for side in order:
            client, experiment_id = clients[side]
            run_id, seconds, cpu = log_points(client, experiment_id, points, args.batch)
            check_stored(client, run_id, points, side)
            rates[side].append(len(points) / seconds)
            client_ms[side] = f"{1000 * seconds / calls:.0f} ms a call, {1000 * cpu / calls:.0f} of them client CPU"
        print(
            f"# repeat {repeat + 1} ({order[0]} first): torchdeck {rates['torchdeck'][-1]:,.0f} points/s "
            f"({client_ms['torchdeck']}), mlflow_server {rates['mlflow_server'][-1]:,.0f} points/s "
            f"({client_ms['mlflow_server']}), ratio {rates['torchdeck'][-1] / rates['mlflow_server'][-1]:.2f}",
            flush=True,
        )
    return rates


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--points", type=int, default=100_000, help="points per repeat and side")
    ap.add_argument("--batch", type=int, default=1000, help="metrics per log_batch call (MLflow's maximum: 1000)")
    ap.add_argument("--keys", type=int, default=10, help="metric keys a step")
    ap.add_argument("--repeats", type=int, default=5)
    args = ap.parse_args()
    if not (1 <= args.batch <= 1000 and args.points >= args.keys >= 1 and args.repeats >= 1):
        ap.error("--batch 1..1000, --points >= --keys >= 1, --repeats >= 1")
    points = make_points(args.points, args.keys)
    print(
        f"# {args.repeats} repeats of {args.points:,} points ({args.keys} keys, {args.points // args.keys:,} steps), "
        f"log_batch of {args.batch}, a fresh run per repeat and side; SQLite on both",
        flush=True,
    )
    with tempfile.TemporaryDirectory(prefix="bench-mlflow-ingest-") as tmp, ExitStack() as stack:
        clients = _clients(stack, Path(tmp))
        rates = run_repeats(clients, points, args)
    ratios = [t / m for t, m in zip(rates["torchdeck"], rates["mlflow_server"])]
    print(f"torchdeck_points_per_s={statistics.median(rates['torchdeck']):.0f}")
    print(f"mlflow_server_points_per_s={statistics.median(rates['mlflow_server']):.0f}")
    print(f"mlflow_client_ingest_vs_mlflow_server_min={min(ratios):.2f}")
    print(f"mlflow_client_ingest_vs_mlflow_server_max={max(ratios):.2f}")
    print(f"mlflow_client_ingest_vs_mlflow_server={statistics.median(ratios):.2f}", flush=True)


if __name__ == "__main__":
    main()
