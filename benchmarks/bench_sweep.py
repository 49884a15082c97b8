"""Sweeps: what successive halving saves, what it costs, and how fast a worker goes from one trial to the next.

The digits preset (real data, the reference small CNN, early stopping as in the preset), a 16-configuration
grid over the learning rate (4 values, log-spaced) and the weight decay (4 values), run twice through real
workers (a private Redis, SQLite, `--workers` CPU workers side by side): without a pruner, then with `asha`.

- asha_epoch_fraction: epochs trained with ASHA / epochs trained by the full sweep (target ≤ 0.5).
- asha_best_gap_pts: the full sweep's best val/acc − the ASHA sweep's best, in accuracy points (target ≤ 0.5).
- trial_handoff_s: median, over consecutive trials on one worker (both sweeps), from a trial's end to the next
  trial's first stored training step (warm worker; target ≤ 2 s), printed with its spread (n, min, median, max),
  per sweep too, and after short trials (< 5 s) apart: ASHA prunes most trials after an epoch of about a second.
- trial_handoff_claim_s: the same to the next trial's claim (the sweep's advance, the broker, the claim).

What a hand-off waits on, measured from the stored timestamps of real runs of this benchmark (issue 22): the
sweep's advance (queued 0.03-0.4 s after the trial's end, by the worker where it ended), the broker and the
claim (+0.03 s), then the next run's process: until the worker's run processes were forked from a server that
imported torch once (worker.tasks.start_context, TORCHDECK_RUN_START), each one was a spawned interpreter
importing torch, torchvision, core and sklearn's digits reader, 4-5 s of CPU, 8-14 s of wall time on this
2-core machine beside two training runs. It was spawned when the previous trial started, so after a trial
shorter than that (a pruned one) the next trial waited 4-13 s for its process's imports: the median over both
sweeps then sat on the boundary between the fast half and the slow half (1.1-2.7 s). The workers log
"handed to a process still importing" when it happens (counted below; the workers run at INFO here).
Then 0.1-0.2 s from the process's start to the first step (data, model, the first batch).
"""

from __future__ import annotations

import argparse
import itertools
import os
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

SPACE = {
    "space": {
        "optim.lr": {"loguniform": [3e-4, 3e-1], "num": 4},
        "optim.weight_decay": {"choice": [0.0, 1e-4, 1e-3, 1e-2]},
    },
    "method": "grid",
    "objective": {"metric": "val/acc", "mode": "max"},
}


def _stack(home: Path, workers: int):
    from app.cli.processes import ProcessGroup, start_private_redis, worker_commands

    group = ProcessGroup()
    broker = start_private_redis(home, group)
    env = {
        "TORCHDECK_HOME": str(home),
        "TORCHDECK_BROKER_URL": broker,
        "TORCHDECK_DATABASE_URL": f"sqlite:///{home / 'torchdeck.db'}",
    }
    os.environ.update(env)
    from db.migrate import upgrade

    upgrade()
    for i, (cmd, extra) in enumerate(worker_commands(None, ["cpu"], "INFO", cpu_workers=workers)):
        group.start(f"worker{i}", cmd, env={**env, **extra}, log=home / f"worker{i}.log")
    return group


def _sweep(pruner: str, epochs: int, parallel: int, timeout_s: float):
    from app.services.broker import get_engine
    from app.services.sweeps import submit_sweep
    from core.config import load_spec
    from db import repo
    from sweep.spec import SweepSpec

    base = load_spec(
        ROOT / "configs" / "digits_simple_cnn.yaml", ["device=cpu", "export.formats=[]", f"train.epochs={epochs}"]
    )
    spec = SweepSpec.model_validate(
        {
            **SPACE,
            "base": base.model_dump(mode="json"),
            "budget": {"parallel": parallel},
            "pruner": {"kind": pruner, "min_epochs": 1, "reduction_factor": 3},
        }
    )
    engine = get_engine()
    sweep = submit_sweep(spec, owner="bench", engine=engine)
    deadline = time.monotonic() + timeout_s
    while not repo.get_sweep(engine, sweep.id).finished:
        if time.monotonic() > deadline:
            raise SystemExit(f"sweep {sweep.id} did not end within {timeout_s:.0f} s")
        time.sleep(0.5)
    return engine, sweep


@dataclass
class Handoff:
    claim_s: float  # the trial's end → the next trial claimed on the same worker
    first_step_s: float  # → the next trial's first stored train/loss point
    previous_s: float  # how long the trial that ended had trained (its first stored step → its end)


def _figures(engine, sweep) -> tuple[int, float, list[Handoff]]:
    """Epochs trained, the best val/acc, and the hand-offs between consecutive trials on one worker."""
    from sqlalchemy import text

    from db import repo

    runs = repo.sweep_runs(engine, sweep.id)
    epochs = sum(int(r.summary.get("epochs_run") or 0) for r in runs)
    best = max(r.metrics["val/acc"].max_value for r in runs if "val/acc" in r.metrics)
    handoffs: list[Handoff] = []
    by_worker: dict[str, list] = {}
    for r in runs:
        by_worker.setdefault(r.worker_id or "", []).append(r)
    with engine.connect() as c:

        def first_step(run_id: str) -> float | None:
            return c.execute(
                text("select min(wall_time) from metric where run_id=:r and key='train/loss'"), {"r": run_id}
            ).scalar()

        for done in by_worker.values():
            done.sort(key=lambda r: r.started_at)
            for prev, nxt in itertools.pairwise(done):
                first, trained_from = first_step(nxt.id), first_step(prev.id)
                if None not in (first, trained_from, prev.finished_at, nxt.started_at):
                    end = prev.finished_at.timestamp()
                    handoffs.append(Handoff(nxt.started_at.timestamp() - end, first - end, end - trained_from))
    return epochs, best, handoffs


def spread(values: list[float]) -> str:
    if not values:
        return "n=0"
    return f"n={len(values)} min {min(values):.2f} median {statistics.median(values):.2f} max {max(values):.2f}"


def waited_for_imports(home: Path) -> int:
    """Runs the workers handed to a process still importing (worker.tasks.Spare.take logs it)."""
    return sum(
        log.read_text(errors="replace").count("handed to a process still importing") for log in home.glob("worker*.log")
    )


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--epochs", type=int, default=20, help="epochs of each trial (the preset's 20)")
    p.add_argument("--workers", type=int, default=2, help="CPU workers side by side")
    p.add_argument("--timeout", type=float, default=3600)
    a = p.parse_args()
    print(f"# load {' '.join(f'{x:.2f}' for x in os.getloadavg())} at the start", flush=True)
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
            waited = waited_for_imports(Path(d))
        finally:
            group.stop()
    handoffs = h1 + h2
    if len(handoffs) < 10:
        raise SystemExit(
            f"bench_sweep: only {len(handoffs)} hand-offs between consecutive trials on one worker "
            "(at least 10 needed for a median)"
        )
    print(f"full_sweep_epochs={full_epochs}")
    print(f"asha_sweep_epochs={asha_epochs}")
    print(f"full_sweep_wall_s={t1 - t0:.1f}")
    print(f"asha_sweep_wall_s={t2 - t1:.1f}")
    print(f"full_best_val_acc={full_best:.4f}")
    print(f"asha_best_val_acc={asha_best:.4f}")
    print(f"asha_epoch_fraction={asha_epochs / full_epochs:.3f}")
    print(f"asha_best_gap_pts={100 * (full_best - asha_best):.2f}")
    for name, h in (("full sweep", h1), ("asha sweep", h2)):
        print(f"# hand-offs of the {name} (s): " + " ".join(f"{x.first_step_s:.2f}" for x in h))
    short = [h.first_step_s for h in handoffs if h.previous_s < 5]
    print(
        f"# hand-off (s), end → first step: {spread([h.first_step_s for h in handoffs])}; after a trial of < 5 s: "
        f"{spread(short)}; after a longer one: {spread([h.first_step_s for h in handoffs if h.previous_s >= 5])}"
    )
    print(f"# hand-off (s), end → claimed: {spread([h.claim_s for h in handoffs])}")
    print(
        f"# runs handed to a process still importing (workers' logs; the first run of each worker included): {waited}"
    )
    print(f"trial_handoff_claim_s={statistics.median(h.claim_s for h in handoffs):.2f}")
    print(f"trial_handoff_max_s={max(h.first_step_s for h in handoffs):.2f}")
    print(f"trial_handoff_s={statistics.median(h.first_step_s for h in handoffs):.2f}")
    print(f"workers={a.workers} cores={os.cpu_count()} run_start={os.environ.get('TORCHDECK_RUN_START', 'forkserver')}")
    print(f"# load {' '.join(f'{x:.2f}' for x in os.getloadavg())} at the end", flush=True)


if __name__ == "__main__":
    main()
