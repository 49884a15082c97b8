"""Sweeps: what successive halving saves, what it costs, and how fast a worker goes from one trial to the next.

The digits preset (real data, the reference small CNN, early stopping as in the preset), a 16-configuration
grid over the learning rate (4 values, log-spaced) and the weight decay (4 values), run twice through real
workers (a private Redis, SQLite, `--workers` CPU workers side by side): without a pruner, then with `asha`.

- asha_epoch_fraction: epochs trained with ASHA / epochs trained by the full sweep (target ≤ 0.5).
- asha_best_gap_pts: the full sweep's best val/acc − the ASHA sweep's best, in accuracy points (target ≤ 0.5).
- trial_handoff_s: median, over consecutive trials on one worker, from a trial's end to the next trial's first
  stored training step (warm worker; target ≤ 2 s).
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

SPACE = {
    "space": {"optim.lr": {"loguniform": [3e-4, 3e-1], "num": 4},
              "optim.weight_decay": {"choice": [0.0, 1e-4, 1e-3, 1e-2]}},
    "method": "grid", "objective": {"metric": "val/acc", "mode": "max"},
}


def _stack(home: Path, workers: int):
    from app.launcher import ProcessGroup, start_private_redis, worker_commands

    group = ProcessGroup()
    broker = start_private_redis(home, group)
    env = {"TORCHDECK_HOME": str(home), "TORCHDECK_BROKER_URL": broker,
           "TORCHDECK_DATABASE_URL": f"sqlite:///{home / 'torchdeck.db'}"}
    os.environ.update(env)
    from db.migrate import upgrade

    upgrade()
    for i, (cmd, extra) in enumerate(worker_commands(None, ["cpu"], "WARNING", cpu_workers=workers)):
        group.start(f"worker{i}", cmd, env={**env, **extra}, log=home / f"worker{i}.log")
    return group


def _sweep(pruner: str, epochs: int, parallel: int, timeout_s: float):
    from app.services import get_engine
    from app.sweeps import submit_sweep
    from core.config import load_spec
    from db import repo
    from sweep.spec import SweepSpec

    base = load_spec(ROOT / "configs" / "digits_simple_cnn.yaml",
                     ["device=cpu", "export.formats=[]", f"train.epochs={epochs}"])
    spec = SweepSpec.model_validate({**SPACE, "base": base.model_dump(mode="json"), "budget": {"parallel": parallel},
                                     "pruner": {"kind": pruner, "min_epochs": 1, "reduction_factor": 3}})
    engine = get_engine()
    sweep = submit_sweep(spec, owner="bench", engine=engine)
    deadline = time.monotonic() + timeout_s
    while not repo.get_sweep(engine, sweep.id).finished:
        if time.monotonic() > deadline:
            raise SystemExit(f"sweep {sweep.id} did not end within {timeout_s:.0f} s")
        time.sleep(0.5)
    return engine, sweep


def _figures(engine, sweep) -> tuple[int, float, list[tuple[float, float]]]:
    """Epochs trained, the best val/acc, and the hand-off times of consecutive trials on one worker."""
    from sqlalchemy import text

    from db import repo

    runs = repo.sweep_runs(engine, sweep.id)
    epochs = sum(int(r.summary.get("epochs_run") or 0) for r in runs)
    best = max(r.metrics["val/acc"].max_value for r in runs if "val/acc" in r.metrics)
    handoffs: list[tuple[float, float]] = []  # (end → next claimed, end → next's first step)
    by_worker: dict[str, list] = {}
    for r in runs:
        by_worker.setdefault(r.worker_id or "", []).append(r)
    with engine.connect() as c:
        for done in by_worker.values():
            done.sort(key=lambda r: r.started_at)
            for prev, nxt in zip(done, done[1:], strict=False):
                first = c.execute(text("select min(wall_time) from metric where run_id=:r and key='train/loss'"),
                                  {"r": nxt.id}).scalar()
                if first is not None and prev.finished_at is not None and nxt.started_at is not None:
                    end = prev.finished_at.timestamp()
                    handoffs.append((nxt.started_at.timestamp() - end, first - end))
    return epochs, best, handoffs


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--epochs", type=int, default=20, help="epochs of each trial (the preset's 20)")
    p.add_argument("--workers", type=int, default=2, help="CPU workers side by side")
    p.add_argument("--timeout", type=float, default=3600)
    a = p.parse_args()
    with tempfile.TemporaryDirectory() as d:
        group = _stack(Path(d), a.workers)
        try:
            t0 = time.monotonic()
            engine, full = _sweep("none", a.epochs, a.workers, a.timeout)
            t1 = time.monotonic()
            _, asha = _sweep("asha", a.epochs, a.workers, a.timeout)
            t2 = time.monotonic()
            full_epochs, full_best, h1 = _figures(engine, full)
            asha_epochs, asha_best, h2 = _figures(engine, asha)
        finally:
            group.stop()
    print(f"full_sweep_epochs={full_epochs}")
    print(f"asha_sweep_epochs={asha_epochs}")
    print(f"full_sweep_wall_s={t1 - t0:.1f}")
    print(f"asha_sweep_wall_s={t2 - t1:.1f}")
    print(f"full_best_val_acc={full_best:.4f}")
    print(f"asha_best_val_acc={asha_best:.4f}")
    print(f"asha_epoch_fraction={asha_epochs / full_epochs:.3f}")
    print(f"asha_best_gap_pts={100 * (full_best - asha_best):.2f}")
    print(f"trial_handoff_claim_s={statistics.median(c for c, _ in h1 + h2):.2f}")  # end → the next trial claimed
    print(f"trial_handoff_s={statistics.median(f for _, f in h1 + h2):.2f}")
    print(f"workers={a.workers} cores={os.cpu_count()}")


if __name__ == "__main__":
    main()
