"""What one live page costs while a real run trains: the dashboard server's CPU and the browser's.

A digits run is executed by the worker's own code (worker.child.run_child in a spawned process,
writing through its DB sink), so the page sees the metric stream of a real run: per-step loss, lr,
gradient norms and throughput every `log_every` steps, per-layer diagnostics, per-epoch validation,
system metrics. CPU is process CPU time over a window (psutil), not wall time, so a busy machine
changes it little. The browser is this benchmark's own Chromium (the descendants of this process),
never another Chromium on the machine (tests running beside it).

A figure measured on a run that has ended is not a live page's cost (the page then redraws nothing):
every measuring window, the idle server's included, reads the run at its start and at its end, and the
benchmark fails (NotTraining) unless the run was `running` at both ends and stored new train/loss points
in between, and unless every open page drew newer steps at the end than at the start. The run is long
(RUN_SPEC: 10,000 epochs, about a day here) and cancelled when the measurement is done.
"""

from __future__ import annotations

import multiprocessing as mp
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import psutil
from sqlalchemy import Engine, text

from db import repo

# Far longer than any measurement (the bench cancels it afterwards). One torch thread: the other core is left to
# the server and the browser, as in local mode on a small machine.
RUN_SPEC = {
    "data": {"name": "digits", "image_size": 16},
    "model": {"name": "simple_cnn"},
    "train": {
        "epochs": 10_000,
        "batch_size": 32,
        "log_every": 5,
        "diag_every": 25,
        "early_stopping": {"enabled": False},
    },
    "loader": {"num_workers": 0},
    "seed": 0,
}


class NotTraining(RuntimeError):
    """A measuring window in which the run was not training from start to end: its figure would not be a live
    page's cost."""


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


def training_mark(engine: Engine, run_id: str) -> tuple[str, int]:
    """(the run's status, the last train/loss step stored)."""
    with engine.connect() as c:
        last = c.execute(
            text("select max(step) from metric where run_id=:r and key='train/loss'"), {"r": run_id}
        ).scalar()
    return repo.get_run(engine, run_id).status, int(last or 0)


def check_training(what: str, before: tuple[str, int], after: tuple[str, int]) -> int:
    """The train/loss steps stored during the window `what`; NotTraining unless the run trained throughout."""
    if before[0] != "running" or after[0] != "running" or after[1] <= before[1]:
        raise NotTraining(
            f"{what}: the run was {before[0]} at the window's start (last step {before[1]}) and "
            f"{after[0]} at its end (last step {after[1]}); a figure of a run that is not training "
            "is not a live page's cost"
        )
    return after[1] - before[1]


def browser_processes() -> list[psutil.Process]:
    """This benchmark's Chromium: the descendants of this process (Playwright's driver, then the browser)."""
    out = []
    for p in psutil.Process().children(recursive=True):
        try:
            if "chrom" in p.name().lower():
                out.append(p)
        except psutil.Error:
            continue
    return out


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


@dataclass
class Sample:
    server_pct: float  # the server's CPU over the window, % of one core
    browser_pct: float  # this benchmark's Chromium, all its processes
    steps: int  # train/loss steps the run stored during the window


def sample(
    engine: Engine,
    run_id: str,
    server_pid: int,
    seconds: float,
    what: str,
    drawn: Callable[[], list[int]] | None = None,
) -> Sample:
    """One measuring window of `seconds`: the run must train throughout it, and each open page (`drawn()`: the
    last step each page has drawn) must draw newer steps by its end."""
    server, browser = [psutil.Process(server_pid)], browser_processes()
    mark0, pages0 = training_mark(engine, run_id), (drawn() if drawn else [])
    s0, b0, t0 = _cpu_s(server), _cpu_s(browser), time.perf_counter()
    time.sleep(seconds)
    s1, b1, wall = _cpu_s(server), _cpu_s(browser), time.perf_counter() - t0
    steps = check_training(what, mark0, training_mark(engine, run_id))
    if drawn:
        pages1 = drawn()
        stale = [i for i, (a, b) in enumerate(zip(pages0, pages1, strict=True)) if b <= a]
        if stale:
            raise NotTraining(
                f"{what}: page(s) {stale} drew no newer step during the window (last drawn "
                f"{pages0} → {pages1}): not a live page"
            )
    return Sample(100 * _spent(s0, s1) / wall, 100 * _spent(b0, b1) / wall, steps)


@dataclass
class ViewerCost:
    viewers: int
    idle: list[Sample] = field(default_factory=list)  # the server with no page open, same run training
    open: list[Sample] = field(default_factory=list)  # with `viewers` pages open

    def server_per_viewer(self) -> list[float]:
        """Per open-page sample: (server − the idle server's median) / viewers."""
        idle = statistics.median(s.server_pct for s in self.idle)
        return [(s.server_pct - idle) / self.viewers for s in self.open]

    def browser_per_viewer(self) -> list[float]:
        return [s.browser_pct / self.viewers for s in self.open]


def viewer_cost(
    browser,
    server_url: str,
    server_pid: int,
    engine: Engine,
    run_id: str,
    viewers: int,
    seconds: float,
    ready: Callable,
    last_drawn: Callable,
    sample_s: float = 10.0,
    into: ViewerCost | None = None,
) -> ViewerCost:
    """`viewers` pages open on the run's live Run page for `seconds`, in samples of `sample_s`, after one idle
    sample of the server with no page open. `ready(page)` waits until a page has drawn its charts and returns
    the chart's frame; `last_drawn(page, frame)` is the last step drawn there (and may find the frame again)."""
    cost = into or ViewerCost(viewers)
    time.sleep(3)  # the sessions of pages closed just before are gone
    cost.idle.append(sample(engine, run_id, server_pid, sample_s, "idle server"))
    pages = []
    try:
        for _ in range(viewers):
            page = browser.new_page(viewport={"width": 1400, "height": 1200})
            page.goto(f"{server_url}/run?id={run_id}")
            pages.append([page, ready(page)])
        time.sleep(3)  # past the first full renders

        def drawn() -> list[int]:
            out = []
            for entry in pages:
                step, entry[1] = last_drawn(*entry)
                out.append(step)
            return out

        for k in range(max(1, round(seconds / sample_s))):
            cost.open.append(
                sample(engine, run_id, server_pid, sample_s, f"{viewers} viewer(s), sample {k + 1}", drawn)
            )
    finally:
        for page, _ in pages:
            page.close()
    return cost


def spread(values: list[float]) -> str:
    def fmt(v: float) -> str:
        return f"{v:.0f}" if abs(v) >= 100 else f"{v:.3g}"

    return (
        f"n={len(values)} min {fmt(min(values))} median {fmt(statistics.median(values))} max {fmt(max(values))}"
        if values
        else "n=0"
    )
