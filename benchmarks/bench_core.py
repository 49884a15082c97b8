"""Per-step cost of torchdeck's training loop against the seeds' bare loop.

Same model (simple_cnn), data (synthetic 3×32×32), batch (64), optimizer (Adam), threads and
device. core runs with every metric and diagnosis on (log_every=10, per-layer norms and
update ratios every 50 steps, accuracy, data-wait, throughput) and a JSON-lines sink. The bare
loop is the textbook one: zero_grad, forward, cross-entropy, backward, step, loss.item().

Last lines: core_step_ms, bare_step_ms, core_vs_bare_ratio_ci95=<lo>-<hi> and core_vs_bare_ratio=<x>, the median
of the per-pair ratios of the undisturbed pairs. Exit status 1, with the reason, when fewer than 10 pairs ran
undisturbed: on a busy machine it prints no figure rather than a wrong one.

Why it is measured this way (issue 22: the old headline, the ratio of the two medians of 9 interleaved epochs
each, read 0.977, 1.004, 1.024, 1.093 and 1.126 in five runs, an effect of a few per cent buried in its spread):

- What disturbs it, measured here (2-core Firecracker VM, other engineers' tests beside it): any other runnable
  process. With 2 torch threads on 2 cores, every op of an epoch needs both cores; when another process takes
  one, the other thread waits at each op's barrier and the epoch is 2-18× slower per step (10 ms → 20-190 ms),
  its CPU per wall second falls from 1.87-1.98 to 0.6-1.5 and its involuntary context switches rise from 60-250
  to 300-5,700. Whichever side of a pair it hits decides that pair (ratios 0.06-11.8 were seen), and a
  median of 9 per side takes whichever side was unlucky more often. So each pair is checked: a pair counts only
  if both its epochs kept CPU ≥ 0.92 × threads per wall second; the others are printed (marked *) and left out,
  and pairs are added until --pairs undisturbed ones (20) are timed, at most 4× as many or --max-seconds.
  Under a load average of 8-12 no pair was undisturbed: the benchmark then fails, saying so.
- Paired and alternated: each core epoch is compared with its neighbouring bare epoch, run back to back, so
  what changes slower than a pair (the host's speed: both sides' step times moved together by ±6 % within
  undisturbed runs) weighs on both alike; the order inside a pair alternates (core first, then bare first).
  No order effect was found (core-first vs bare-first medians 1.019/1.014, 1.021/1.040, 1.049/1.040).
- The spread is printed with the figure: the IQR of the per-pair ratios, a bootstrap 95 % interval of their
  median, min and max, the medians of the first and the second half (a drift), of the core-first and
  bare-first pairs (an order effect), and the ratio of the medians over all pairs (the old headline).
- Warm-up until stable: at least 5 pairs (10 s) and until 2 undisturbed pairs in a row stop getting faster,
  at most 12 pairs or a third of --max-seconds. Once, right after bench_transfer.py, with only 2 warm-up pairs,
  the first 9 pairs read 1.04-1.07 and the next 11 1.01-1.04 (no preemption, no steal, both sides equally
  fast): a drift this benchmark now prints; the alternated comparison (fresh vs after bench_transfer) that
  would say whether the previous benchmark causes it could not be run undisturbed on this machine (load 8-12).
- The Python garbage collector runs between epochs, never inside one; torch's inter-op pool is 1 thread
  (unused here); the intra-op threads are --threads (2; --threads 1 leaves a core to the rest of the machine
  and measures the overhead against a slower step: a different figure). The host's steal time and the load
  average at the start and the end are printed: this VM exposes no CPU frequency, so a thermal or frequency
  change after a previous benchmark shows only as a drift.

Runs here (load average 1.8-4.3 at their start), median of the undisturbed pairs (bootstrap interval): 1.018
(1.008-1.030), 1.028 (16 of 30 pairs kept; computed afterwards), 1.030 (1.018-1.040), 1.027 (1.018-1.070; 20 of
64 kept) and 1.041 (1.032-1.050; right after bench_transfer.py). Their ratios of the medians: 1.008, 0.991,
1.024, 0.983, 1.036; under load 8-12: 1.197, 0.961 (and no figure from the new one).
"""

from __future__ import annotations

import argparse
import gc
import os
import random
import resource
import statistics
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import nn

from core.config import RunSpec
from core.engine import train_one_epoch
from core.events import JsonlSink, NeverStop
from core.train import build_trainer, seed_everything


def bare_epoch(
    model: nn.Module, opt: torch.optim.Optimizer, x: torch.Tensor, y: torch.Tensor, bs: int, steps: int
) -> None:
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


@dataclass
class Epoch:
    wall: float  # seconds per step
    cpu: float  # this process's CPU seconds per wall second
    preempted: int  # involuntary context switches during the epoch
    faults: int  # minor page faults (memory the kernel had to map) during the epoch


MIN_KEPT = 10  # fewer undisturbed pairs than this: no figure (exit status 1)


def timed(fn, steps: int) -> Epoch:
    gc.collect()  # between epochs, never inside one
    ru0, c0, t0 = resource.getrusage(resource.RUSAGE_SELF), time.process_time(), time.perf_counter()
    fn()
    wall, cpu, ru1 = time.perf_counter() - t0, time.process_time() - c0, resource.getrusage(resource.RUSAGE_SELF)
    return Epoch(wall / steps, cpu / wall, ru1.ru_nivcsw - ru0.ru_nivcsw, ru1.ru_minflt - ru0.ru_minflt)


CLEAN_CPU = 0.92  # an undisturbed epoch keeps its threads busy: CPU seconds per wall second ≥ this × threads


def clean(pair: tuple[Epoch, Epoch], threads: int) -> bool:
    """Neither epoch of the pair lost its cores to another process (its threads then wait at each op's barrier:
    2-18× slower per step here, and whichever side it hits decides the pair's ratio)."""
    return all(e.cpu >= CLEAN_CPU * threads for e in pair)


def steal_ticks() -> tuple[int, int]:
    """(steal, total) jiffies of the whole machine (/proc/stat), (0, 0) where there is no such file."""
    try:
        with open("/proc/stat") as f:
            fields = [int(v) for v in f.readline().split()[1:]]
    except OSError:
        return 0, 0
    return (fields[7] if len(fields) > 7 else 0), sum(fields[:8])


def quartiles(values: list[float]) -> tuple[float, float, float]:
    q = statistics.quantiles(values, n=4, method="inclusive")
    return q[0], statistics.median(values), q[2]


def bootstrap_median(values: list[float], n: int = 2000, seed: int = 0) -> tuple[float, float]:
    """A 95 % percentile-bootstrap interval of the median."""
    rng = random.Random(seed)
    meds = sorted(statistics.median(rng.choices(values, k=len(values))) for _ in range(n))
    return meds[int(0.025 * n)], meds[int(0.975 * n) - 1]


def load() -> str:
    return " ".join(f"{x:.2f}" for x in os.getloadavg())


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--steps", type=int, default=100, help="steps per timed epoch")
    ap.add_argument(
        "--pairs",
        "--repeats",
        type=int,
        default=20,
        dest="pairs",
        help="undisturbed (core, bare) pairs to time (at most 4× as many are run)",
    )
    ap.add_argument(
        "--max-seconds",
        type=float,
        default=420,
        help="stop adding pairs (warm-up included) after this long: the default run stays under 8 min",
    )
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--verbose", action="store_true", help="print every pair: ms per step, CPU per wall s, preemptions")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    try:
        torch.set_num_interop_threads(1)
    except RuntimeError:  # already set (an inter-op pool in use): nothing here uses it
        pass
    print(f"# load {load()} at the start, {os.cpu_count()} cores", flush=True)
    bs = 64
    spec = RunSpec.from_dict(
        {
            "data": {
                "name": "synthetic",
                "num_classes": 10,
                "num_samples": bs * args.steps * 5 // 4,
                "size": 32,
                "channels": 3,
                "val_fraction": 0.2,
            },
            "model": {"name": "simple_cnn"},
            "optim": {"name": "adam", "lr": 1e-3},
            "train": {
                "batch_size": bs,
                "log_every": 10,
                "diag_every": 50,
                "steps_per_epoch": args.steps,
                "grad_clip": {"mode": "none"},
            },
            "export": {"formats": []},
            "device": "cpu",
            "seed": 0,
        }
    )
    seed_everything(0, False)
    with tempfile.TemporaryDirectory() as d:
        sink = JsonlSink(d)
        t = build_trainer(spec, Path(d), sink, NeverStop(), torch.device("cpu"))
        # The bare loop gets the same images, already normalised (its best case), and the same architecture.
        xb = t.pre_val(t.data.train.images).contiguous()
        yb = t.data.train.labels
        bare_model = type(t.model.net)(3, 10, 32, (16, 32), 128, 0.0)
        bare_opt = torch.optim.Adam(bare_model.parameters(), lr=1e-3)
        epoch = 0

        def pair(core_first: bool) -> tuple[Epoch, Epoch]:
            nonlocal epoch
            epoch += 1

            def run_core() -> Epoch:
                return timed(lambda: train_one_epoch(t, epoch), args.steps)

            def run_bare() -> Epoch:
                return timed(lambda: bare_epoch(bare_model, bare_opt, xb, yb, bs, args.steps), args.steps)

            if core_first:
                c = run_core()
                return c, run_bare()
            b = run_bare()
            return run_core(), b

        start = time.monotonic()
        deadline, warm_deadline = start + args.max_seconds, start + args.max_seconds / 3
        warm: list[tuple[Epoch, Epoch]] = []
        while (
            len(warm) < 12 and time.monotonic() < warm_deadline
        ):  # ≥ 5 pairs, until 2 undisturbed ones stop getting faster
            warm.append(pair(len(warm) % 2 == 0))
            last = [p for p in warm[-3:] if clean(p, args.threads)]
            if len(warm) >= 5 and len(last) >= 2 and all(last[-1][k].wall >= 0.98 * last[-2][k].wall for k in (0, 1)):
                break
        steal0, total0 = steal_ticks()
        pairs: list[tuple[Epoch, Epoch]] = []
        while sum(clean(p, args.threads) for p in pairs) < args.pairs:
            if len(pairs) >= 4 * args.pairs or time.monotonic() > deadline:
                break
            pairs.append(pair(len(pairs) % 2 == 0))
        steal1, total1 = steal_ticks()
        sink.close()
    if not pairs:
        raise SystemExit(
            f"bench_core: no pair was timed within --max-seconds {args.max_seconds:.0f} ({len(warm)} warm-up "
            f"pairs took {sum(e.wall for p in warm for e in p) * args.steps:.0f} s): the machine is too busy"
        )
    kept = [p for p in pairs if clean(p, args.threads)]
    all_ratios = [c.wall / b.wall for c, b in pairs]
    print(
        f"threads={args.threads} batch={bs} steps={args.steps} pairs={len(pairs)} undisturbed_pairs={len(kept)} "
        f"warmup_pairs={len(warm)}"
    )
    print(
        "# per-pair ratios (* disturbed): "
        + " ".join(f"{r:.3f}" + ("" if clean(p, args.threads) else "*") for r, p in zip(all_ratios, pairs, strict=True))
    )
    if args.verbose:
        for i, (c, b) in enumerate(pairs):
            print(
                f"# pair {i:2d} ({'core' if i % 2 == 0 else 'bare'} first): "
                f"core {c.wall * 1e3:6.2f} ms cpu {c.cpu:.2f} preempted {c.preempted:5d} faults {c.faults:6d} | "
                f"bare {b.wall * 1e3:6.2f} ms cpu {b.cpu:.2f} preempted {b.preempted:5d} faults {b.faults:6d} "
                f"| ratio {c.wall / b.wall:.3f}"
            )
    print(
        f"# disturbance: {len(pairs) - len(kept)} of {len(pairs)} pairs had an epoch whose CPU per wall s fell under "
        f"{CLEAN_CPU} × {args.threads} threads (another process took a core); involuntary context switches per epoch, "
        f"median {statistics.median(e.preempted for p in pairs for e in p):.0f} (undisturbed "
        f"{statistics.median(e.preempted for p in kept for e in p) if kept else float('nan'):.0f}); host steal "
        f"{100 * (steal1 - steal0) / max(1, total1 - total0):.1f} %; load {load()} at the end"
    )
    print(
        f"# all {len(pairs)} pairs: median ratio {statistics.median(all_ratios):.3f}, min {min(all_ratios):.3f} "
        f"max {max(all_ratios):.3f}; ratio of the medians (the old headline) "
        f"{statistics.median(c.wall for c, _ in pairs) / statistics.median(b.wall for _, b in pairs):.3f}"
    )
    if len(kept) < MIN_KEPT:
        raise SystemExit(
            f"bench_core: only {len(kept)} of {len(pairs)} pairs ran undisturbed (at least {MIN_KEPT} "
            f"needed): the machine was too busy for a figure of a few per cent; run it again on a quieter "
            f"machine, or with --threads 1"
        )
    ratios = [c.wall / b.wall for c, b in kept]
    q1, med, q3 = quartiles(ratios)
    lo, hi = bootstrap_median(ratios)
    half = len(ratios) // 2
    order = {
        first: [
            c.wall / b.wall for i, (c, b) in enumerate(pairs) if (i % 2 == 0) == first and clean((c, b), args.threads)
        ]
        for first in (True, False)
    }
    print(
        f"# undisturbed pairs: ratio median {med:.3f}, IQR {q1:.3f}-{q3:.3f}, bootstrap 95 % interval of the median "
        f"{lo:.3f}-{hi:.3f}, min {min(ratios):.3f} max {max(ratios):.3f}; order: core first "
        f"{statistics.median(order[True]) if order[True] else float('nan'):.3f}, bare first "
        f"{statistics.median(order[False]) if order[False] else float('nan'):.3f}; drift: first half "
        f"{statistics.median(ratios[:half] or ratios):.3f}, second half {statistics.median(ratios[half:]):.3f}"
    )
    print(f"core_step_ms={statistics.median(c.wall for c, _ in kept) * 1e3:.3f}")
    print(f"bare_step_ms={statistics.median(b.wall for _, b in kept) * 1e3:.3f}")
    print(f"core_vs_bare_ratio_ci95={lo:.3f}-{hi:.3f}")
    print(f"core_vs_bare_ratio={med:.3f}")


if __name__ == "__main__":
    main()
