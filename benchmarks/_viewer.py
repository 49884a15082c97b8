"""What one live page costs while a real run trains: the dashboard server's CPU and the browser's.

A digits run is executed by the worker's own code (worker.child.run_child in a spawned process,
writing through its DB sink), so the page sees the metric stream of a real run: per-step loss, lr,
gradient norms and throughput every `log_every` steps, per-layer diagnostics, per-epoch validation,
system metrics. CPU is process CPU time over a window (psutil), not wall time, so a busy machine
changes it little."""

from __future__ import annotations

import multiprocessing as mp
import time

import psutil
from sqlalchemy import Engine

from db import repo

# Long enough to outlast the measurement; cancelled afterwards. One torch thread: the other core
# is left to the server and the browser, as in local mode on a small machine.
RUN_SPEC = {"data": {"name": "digits", "image_size": 16}, "model": {"name": "simple_cnn"},
            "train": {"epochs": 500, "batch_size": 32, "log_every": 5, "diag_every": 25,
                      "early_stopping": {"enabled": False}},
            "loader": {"num_workers": 0}, "seed": 0}


def _child(run_id: str, worker_id: str, url: str) -> None:
    import logging

    import torch

    torch.set_num_threads(1)
    logging.disable(logging.INFO)
    from worker.child import run_child

    run_child(run_id, worker_id, url)


def start_training(engine: Engine, url: str) -> tuple[str, mp.Process]:
    """A real run, claimed by a bench worker id and trained in a spawned process."""
    r = repo.create_run(engine, RUN_SPEC, name="live-viewer-bench")
    repo.claim_run(engine, r.id, "cpu@viewer-bench", device="cpu")
    proc = mp.get_context("spawn").Process(target=_child, args=(r.id, "cpu@viewer-bench", url), daemon=True)
    proc.start()
    deadline = time.monotonic() + 300
    while not repo.series(engine, r.id, "train/loss", max_points=10).steps:  # training has begun
        if time.monotonic() > deadline or not proc.is_alive():
            raise RuntimeError("the bench run never logged train/loss")
        time.sleep(0.5)
    return r.id, proc


def stop_training(engine: Engine, run_id: str, proc: mp.Process) -> None:
    repo.request_cancel(engine, run_id)
    proc.join(120)
    if proc.is_alive():
        proc.kill()


def _cpu_s(procs: list[psutil.Process]) -> dict[int, float]:
    out = {}
    for p in procs:
        try:
            t = p.cpu_times()
        except psutil.Error:  # a renderer that went away
            continue
        out[p.pid] = t.user + t.system
    return out


def _spent(before: dict[int, float], after: dict[int, float]) -> float:
    """CPU seconds spent between two readings by the processes present in both."""
    return sum(after[pid] - before[pid] for pid in before.keys() & after.keys())


def browser_processes() -> list[psutil.Process]:
    return [p for p in psutil.process_iter(["name"]) if "chrom" in (p.info["name"] or "").lower()]


def cpu_pct(server_pid: int, seconds: float) -> tuple[float, float]:
    """(server %, browser %) of one core over `seconds` of wall time."""
    server = [psutil.Process(server_pid)]
    browser = browser_processes()
    s0, b0, t0 = _cpu_s(server), _cpu_s(browser), time.perf_counter()
    time.sleep(seconds)
    s1, b1, wall = _cpu_s(server), _cpu_s(browser), time.perf_counter() - t0
    return 100 * _spent(s0, s1) / wall, 100 * _spent(b0, b1) / wall


def viewer_cost(browser, server_url: str, server_pid: int, run_id: str, viewers: int, seconds: float,
                ready) -> tuple[float, float]:
    """(server %, browser %) per viewer with `viewers` pages open on the run's live Run page.
    `ready(page)` waits until a page has drawn its charts. The idle server (no page open) is
    measured first and subtracted."""
    idle_server, _ = cpu_pct(server_pid, min(seconds, 10))
    pages = []
    for _ in range(viewers):
        page = browser.new_page(viewport={"width": 1400, "height": 1200})
        page.goto(f"{server_url}/run?id={run_id}")
        ready(page)
        pages.append(page)
    time.sleep(3)  # past the first full renders
    server, chromium = cpu_pct(server_pid, seconds)
    for page in pages:
        page.close()
    return max(server - idle_server, 0.0) / viewers, chromium / viewers
