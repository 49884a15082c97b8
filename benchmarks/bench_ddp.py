"""Training throughput of one run on 2 processes (DistributedDataParallel over gloo, on the CPU) against
the same run on 1 process, at the same global batch.

Same model (simple_cnn), data (synthetic 3×32×32), global batch (64: 32 per rank on 2 processes), optimizer
(Adam) and metrics (log_every=10, per-layer diagnostics every 50 steps). The single process uses every core;
each of the 2 ranks gets half of them (what a run with resources.gpus=2 on device cpu does). Steps/s come
from the runs' own epoch times (training only, the first epoch a warm-up, process start-up excluded); the
two set-ups alternate `--repeats` times and the medians are compared. Last line:
ddp2_vs_single_throughput=<x> (above 1: the 2 processes train faster).
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile

import torch

from core.config import RunSpec
from core.events import MemorySink
from core.names import EPOCH_TIME
from core.train import run_training


def steps_per_s(gpus: int, steps: int, epochs: int, cores: int) -> list[float]:
    """Steps/s of each epoch after the first of one run on `gpus` processes."""
    bs = 64
    spec = RunSpec.from_dict(
        {
            "data": {
                "name": "synthetic",
                "num_classes": 10,
                "num_samples": bs * steps * 5 // 4,
                "size": 32,
                "channels": 3,
                "val_fraction": 0.2,
            },
            "model": {"name": "simple_cnn"},
            "optim": {"name": "adam", "lr": 1e-3},
            "train": {"batch_size": bs, "epochs": epochs, "log_every": 10, "diag_every": 50, "steps_per_epoch": steps},
            "export": {"formats": []},
            "checkpoint": {"save_last": False, "save_best": False},
            "resources": {"gpus": gpus},
            "device": "cpu",
            "seed": 0,
        }
    )
    torch.set_num_threads(cores)  # the 2-process run sets its ranks' threads itself (cores // 2 each)
    sink = MemorySink()
    with tempfile.TemporaryDirectory() as d:
        summary = run_training(spec, d, sink)
    if summary["status"] != "completed":
        raise SystemExit(f"the {gpus}-process run ended {summary['status']}: {summary['error']}")
    return [steps / seconds for _, seconds in sink.series(EPOCH_TIME)[1:]]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--steps", type=int, default=40, help="optimizer steps per epoch")
    ap.add_argument("--epochs", type=int, default=3, help="epochs per run (the first is a warm-up)")
    ap.add_argument("--repeats", type=int, default=2)
    args = ap.parse_args()
    cores = os.cpu_count() or 1
    single, ddp = [], []
    for r in range(args.repeats):
        for gpus in (1, 2) if r % 2 == 0 else (2, 1):
            (single if gpus == 1 else ddp).extend(steps_per_s(gpus, args.steps, args.epochs, cores))
    s, d = statistics.median(single), statistics.median(ddp)
    print(f"cores={cores} global_batch=64 steps={args.steps} epochs={args.epochs} repeats={args.repeats}")
    print(f"single_steps_per_s={s:.3f}")
    print(f"ddp2_steps_per_s={d:.3f}")
    print(f"ddp2_vs_single_throughput={d / s:.3f}")


if __name__ == "__main__":
    main()
