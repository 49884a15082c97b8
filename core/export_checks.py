"""How an export is checked against the eager model: its logits at the full batch and at the check batch sizes
(parity), its latency, and the exporter's own words (exceptions and warnings) reduced to what the report shows.
core/export.py produces each format and calls these on the file it reloaded."""

from __future__ import annotations

import re
import statistics
import time
import warnings
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import torch

LATENCY_BATCHES = (1, 32)
LATENCY_REPEATS = 20  # median of this many timed calls, after LATENCY_WARMUP untimed ones
LATENCY_WARMUP = 3
LATENCY_BUDGET_S = 1.0  # a slow model stops earlier (≥3 timed calls): the median stays quick on CPU

Runner = Callable[[torch.Tensor], torch.Tensor]  # float batch → logits, whatever runtime is behind it


class ExportError(RuntimeError):
    """A format that could not be produced or verified; the message is what the user sees."""


# --- the exporter's words ----------------------------------------------------------------------


_NOISE = ("TORCH_LOGS", "TORCHDYNAMO_", "docs.google.com", "draft_export", "data-dependent friendly APIs")


def message(e: BaseException, limit: int = 1500) -> str:
    """The useful part of an exporter's exception: no ANSI colours, the summary the dynamo exporter puts
    under '## Exception summary' rather than its generic 'next steps', no debug-flag boilerplate."""
    text = re.sub(r"\x1b\[[0-9;]*m", "", str(e)).strip()
    if "## Exception summary" in text:
        text = text.split("## Exception summary", 1)[1].split("(Refer to the full stack trace", 1)[0].strip()
    lines = [ln.rstrip() for ln in text.splitlines() if not any(n in ln for n in _NOISE)]
    text = re.sub(r"\n{3,}", "\n\n", "\n".join(lines)).strip()
    text = f"{type(e).__name__}: {text}" if text else type(e).__name__
    return text if len(text) <= limit else text[:limit] + " …"


@contextmanager
def recorded() -> Iterator[list[warnings.WarningMessage]]:
    """Record every warning: TracerWarnings decide trace vs script, the rest become the format's notes
    (torch 2.14 deprecates TorchScript; the report says so rather than hiding it)."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")  # also the ones Python would show once per location only
        yield caught


def notes(caught: list[warnings.WarningMessage]) -> list[str]:
    seen = dict.fromkeys(f"{w.category.__name__}: {str(w.message).splitlines()[0]}" for w in caught)
    return list(seen)[:10]


def batch_of(x: torch.Tensor, n: int) -> torch.Tensor:
    """Exactly n real samples, cycling through the batch when it is smaller than n."""
    idx = torch.arange(n) % x.shape[0]
    return x[idx].contiguous()


def _finite(v: float) -> float | None:
    return round(v, 8) if v == v and abs(v) != float("inf") else None  # JSON has no NaN/inf


# --- verification --------------------------------------------------------------------------------


def parity(run: Runner, inputs: torch.Tensor, refs: dict[int, torch.Tensor], atol: float) -> dict[str, Any]:
    """Logit differences against the eager model on the full batch and on the check batch sizes."""
    outs: dict[int, torch.Tensor] = {}
    for n, ref in refs.items():
        outs[n] = run(batch_of(inputs, n)).float()
        if outs[n].shape != ref.shape:
            raise ExportError(f"output shape {tuple(outs[n].shape)} at batch {n}, eager gives {tuple(ref.shape)}")
    per_batch = {str(n): _finite((outs[n] - ref).abs().max().item()) for n, ref in refs.items()}
    n = inputs.shape[0]
    diff = (outs[n] - refs[n]).abs()
    return {
        "max_abs_diff": _finite(diff.max().item()),
        "mean_abs_diff": _finite(diff.mean().item()),
        "top1_agreement": round((outs[n].argmax(1) == refs[n].argmax(1)).float().mean().item() * 100, 3),
        "passed": all(d is not None and d <= atol for d in per_batch.values()),
        "atol": atol,
        "max_abs_diff_by_batch": per_batch,
    }


def latency(run: Runner, inputs: torch.Tensor) -> dict[str, float]:
    """Median wall time (ms) per call at each latency batch size."""
    out = {}
    for n in LATENCY_BATCHES:
        x = batch_of(inputs, n)
        for _ in range(LATENCY_WARMUP):
            run(x)
        times: list[float] = []
        deadline = time.perf_counter() + LATENCY_BUDGET_S
        while len(times) < LATENCY_REPEATS and (len(times) < min(3, LATENCY_REPEATS) or time.perf_counter() < deadline):
            t0 = time.perf_counter()
            run(x)
            times.append(time.perf_counter() - t0)
        out[f"b{n}"] = round(statistics.median(times) * 1000, 4)
    return out
