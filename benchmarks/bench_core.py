"""Per-step cost of torchdeck's training loop against the seeds' bare loop.

Same model (simple_cnn), data (synthetic 3×32×32), batch (64), optimizer (Adam), threads and
device. core runs with every metric and diagnosis on (log_every=10, per-layer norms and
update ratios every 50 steps, accuracy, data-wait, throughput) and a JSON-lines sink. The bare
loop is the textbook one: zero_grad, forward, cross-entropy, backward, step, loss.item().
Both run interleaved; the ratio is of the medians. Last line: core_vs_bare_ratio=<x>.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time

import torch
from torch import nn

from core.config import RunSpec
from core.engine import train_one_epoch
from core.events import JsonlSink, NeverStop
from core.train import build_trainer, seed_everything


def bare_epoch(model: nn.Module, opt: torch.optim.Optimizer, x: torch.Tensor, y: torch.Tensor, bs: int, steps: int) -> None:
    crit = nn.CrossEntropyLoss()
    model.train()
    perm = torch.randperm(len(y))
    for i in range(steps):
        idx = perm[i * bs : (i + 1) * bs]
        opt.zero_grad()
        loss = crit(model(x[idx]), y[idx])
        loss.backward()
        opt.step()
        loss.item()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--steps", type=int, default=100, help="steps per timed epoch")
    ap.add_argument("--repeats", type=int, default=9)
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    bs = 64
    spec = RunSpec.from_dict({
        "data": {"name": "synthetic", "num_classes": 10, "num_samples": bs * args.steps * 5 // 4, "size": 32, "channels": 3,
                 "val_fraction": 0.2},
        "model": {"name": "simple_cnn"}, "optim": {"name": "adam", "lr": 1e-3},
        "train": {"batch_size": bs, "log_every": 10, "diag_every": 50, "steps_per_epoch": args.steps, "grad_clip": {"mode": "none"}},
        "export": {"formats": []}, "device": "cpu", "seed": 0,
    })
    seed_everything(0, False)
    with tempfile.TemporaryDirectory() as d:
        sink = JsonlSink(d)
        t = build_trainer(spec, __import__("pathlib").Path(d), sink, NeverStop(), torch.device("cpu"))
        # The bare loop gets the same images, already normalised (its best case), and the same architecture.
        xb = t.pre_val(t.data.train.images).contiguous()
        yb = t.data.train.labels
        bare_model = type(t.model.net)(3, 10, 32, (16, 32), 128, 0.0)
        bare_opt = torch.optim.Adam(bare_model.parameters(), lr=1e-3)
        train_one_epoch(t, 1)  # warm-up both
        bare_epoch(bare_model, bare_opt, xb, yb, bs, args.steps)
        core_t, bare_t = [], []
        for r in range(args.repeats):
            for which in ((0, 1) if r % 2 == 0 else (1, 0)):
                t0 = time.perf_counter()
                if which == 0:
                    train_one_epoch(t, r + 2)
                    core_t.append((time.perf_counter() - t0) / args.steps)
                else:
                    bare_epoch(bare_model, bare_opt, xb, yb, bs, args.steps)
                    bare_t.append((time.perf_counter() - t0) / args.steps)
        sink.close()
    core_ms, bare_ms = statistics.median(core_t) * 1e3, statistics.median(bare_t) * 1e3
    print(f"threads={args.threads} batch={bs} steps={args.steps} repeats={args.repeats}")
    print(f"core_step_ms={core_ms:.3f}")
    print(f"bare_step_ms={bare_ms:.3f}")
    print(f"core_vs_bare_ratio={core_ms / bare_ms:.3f}")


if __name__ == "__main__":
    main()
