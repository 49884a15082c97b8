"""Dashboard benchmark: the figures a user feels.

    python benchmarks/bench_app.py                # full sizes
    python benchmarks/bench_app.py --quick        # 1k runs, 20 × 10k points, 10 latency samples, 20 s windows
    python benchmarks/bench_app.py --only live    # one part: runs, compare or live

Prints `name=value` lines:
- runs_page_ms_10k: server time to render the Runs page (Streamlit's AppTest, caches cleared
  before each render, median of 5) over 10,000 runs with summary metrics. Target ≤ 1,000 ms.
- runs_page_ms_100k: the same over 100,000 runs with a metric filter typed in (`val/acc > 0.5`, which
  keeps about half of them). Target ≤ 1,000 ms.
- run_page_ms_20x100k: the Compare page of 20 runs × 100,000 points each (train/loss, plus val/loss
  and val/acc per epoch), from navigation inside the app until every chart is drawn with its 20
  traces in Chromium (Playwright), median of 5, nothing cached on the server. The first visit of a
  fresh browser (a full page load that also compiles Plotly) is printed as a comment. Target ≤ 2,000 ms.
- compare_ms_100x100k: the same in-app visit with 100 runs × 100,000 points each (median of 3).
  Target ≤ 3,000 ms.
- live_latency_s_p95: a metric point committed the way the worker's DB sink writes it (worker/sink.py)
  until the Run page open in Chromium draws it; p95 over the samples. Target ≤ 0.5 s. (The sink's
  buffering, 1 s by default, comes on top.)
- server_cpu_per_viewer_pct / browser_cpu_per_viewer_pct: the dashboard server's CPU (and this benchmark's
  Chromium's) while live Run pages are open on a real training run (benchmarks/_viewer.py), in % of one core,
  per viewer, with one page open and with three (`_3_viewers`: what a run's watchers share); the median of
  10-s samples taken in 2 rounds (1 with --quick) whose 1- and 3-viewer windows alternate in order, the server's
  idle CPU (no page open, same run training) subtracted. Each sample fails the benchmark (exit status 1, the
  reason printed) unless the run was running at its start and end and stored new points in between, and every
  open page drew newer steps: a page on a finished run costs nothing and measures nothing. The spread (n, min,
  median, max) is printed above each pair. Targets ≤ 5 % (server) and ≤ 10 % (browser).

Other processes on the machine (tests beside it) change wall-clock figures; the CPU figures are process CPU
time, and the load average at the start and the end is printed (`# load ...`) to say under what load they were
taken.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from sqlalchemy import Engine, insert

from core.config import RunSpec
from db import repo
from db.engine import connection_scope, make_engine
from db.metrics import prepare, write_batch
from db.migrate import upgrade
from db.models import Run
from db.types import MetricPoint, utcnow

CHROMIUM_ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
]
SPEC = RunSpec.model_validate({"data": {"name": "digits", "image_size": 16}, "train": {"epochs": 10}}).model_dump(
    mode="json"
)


FILTER = "val/acc > 0.5"  # the Runs page's metric filter of runs_page_ms_100k
COMPARED = 100  # runs seeded for the Compare figures: all of them for compare_ms_100x100k, 20 for run_page_ms_20x100k
STEPS = 10  # metric points per key of each seeded run


def _value(j: int, step: int) -> float:
    """The seeded runs' val/loss and val/acc at `step`, for the j-th run of its batch of 1,000."""
    return (j % 97) / 97 + step / 100


def _passing(n: int) -> int:
    """How many of n seeded runs FILTER keeps: their last val/acc above 0.5."""
    return sum(_value(i % 1000, STEPS - 1) > 0.5 for i in range(n))


def emit(name: str, value: float) -> None:
    print(f"{name}={value:.4g}", flush=True)


def seed_runs(engine: Engine, n: int) -> None:
    """n finished runs with summaries and a few metric points each (bulk inserts, not timed)."""
    now = utcnow()
    for first in range(0, n, 1000):
        ids = [f"r{i:011d}" for i in range(first, min(first + 1000, n))]
        with connection_scope(engine, write=True) as conn:
            conn.execute(
                insert(Run),
                [
                    {
                        "id": run_id,
                        "name": f"run-{run_id}",
                        "owner": ("ana", "bo", "chen")[i % 3],
                        "status": "completed",
                        "spec": SPEC,
                        "spec_hash": "0" * 64,
                        "created_at": now,
                        "started_at": now,
                        "finished_at": now,
                        "attempt": 1,
                        "progress": 1.0,
                        "summary": {"best": {"metric": "val/acc", "value": 0.9, "epoch": 7}},
                        "cancel_requested": False,
                        "worker_id": "cpu@bench",
                    }
                    for i, run_id in enumerate(ids)
                ],
            )
            for j, run_id in enumerate(ids):
                points = [MetricPoint(k, s, _value(j, s)) for k in ("val/loss", "val/acc") for s in range(STEPS)]
                write_batch(conn, prepare(run_id, points))


def runs_page_ms(n_runs: int, expression: str | None = None, matching: int | None = None) -> float:
    """The Runs page's server time over `n_runs` seeded runs, with the filter `expression` typed in (when
    given, `matching` of them pass it)."""
    import streamlit as st
    from streamlit.testing.v1 import AppTest

    engine = make_engine()
    t0 = time.perf_counter()
    seed_runs(engine, n_runs)
    print(f"# seeded {n_runs:,} runs in {time.perf_counter() - t0:.0f} s", flush=True)
    at = AppTest.from_file(str(ROOT / "app" / "main.py"), default_timeout=120).run()
    at.switch_page("app_pages/runs.py").run()  # imports and engine warmed, as in a live server
    if expression:
        at.text_input(key="runs.q").set_value(expression).run()
    shown = matching if expression else n_runs
    assert any(f"{shown:,} run(s) match" in c.value for c in at.caption), [c.value for c in at.caption]
    times = []
    for _ in range(5):
        st.cache_data.clear()
        t0 = time.perf_counter()
        at.run()
        times.append((time.perf_counter() - t0) * 1000)
    assert not at.exception
    return statistics.median(times)


def seed_series(engine: Engine, n_runs: int, n_points: int) -> list[str]:
    ids = []
    epochs = 10
    per_epoch = n_points // epochs
    for i in range(n_runs):
        spec = {**SPEC, "optim": {**SPEC["optim"], "lr": 0.001 * (1 + i)}}
        r = repo.create_run(engine, spec, name=f"lr-{i:02d}")
        repo.claim_run(engine, r.id, "cpu@bench", device="cpu")
        for first in range(1, n_points + 1, 50_000):
            steps = range(first, min(first + 50_000, n_points + 1))
            repo.append_metrics(
                engine,
                r.id,
                [
                    MetricPoint(
                        "train/loss",
                        s,
                        2.3 / (1 + s * (1 + i) / 5e4) + (s % 7) / 100,
                        1 + (s - 1) // per_epoch,
                        1.7e9 + s / 100,
                    )
                    for s in steps
                ],
            )
        repo.append_metrics(
            engine,
            r.id,
            [
                MetricPoint(k, e * per_epoch, v, e, 1.7e9 + e * per_epoch / 100)
                for e in range(1, epochs + 1)
                for k, v in (("val/loss", 1 / e), ("val/acc", 0.9 - 0.2 / e + i / 1000), ("epoch_time_s", 10.0))
            ],
        )
        repo.finish_run(engine, r.id, "completed", summary={"best": {"metric": "val/acc", "value": 0.9, "epoch": 10}})
        ids.append(r.id)
    return ids


class Server:
    """The dashboard on a free port, started with the command `torchdeck up` uses (app.cli.processes.ui_command)."""

    def __init__(self, home: Path) -> None:
        import socket

        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            self.port = s.getsockname()[1]
        env = {**os.environ, "TORCHDECK_HOME": str(home)}
        self.log = open(home / "ui.log", "wb")  # noqa: SIM115
        from app.cli.processes import ui_command

        self.proc = subprocess.Popen(
            ui_command(home, self.port), cwd=ROOT, env=env, stdout=self.log, stderr=subprocess.STDOUT
        )
        self.url = f"http://127.0.0.1:{self.port}"
        for _ in range(240):
            try:
                with urllib.request.urlopen(self.url + "/_stcore/health", timeout=2):
                    return
            except OSError:
                time.sleep(0.25)
        raise RuntimeError("streamlit did not start")

    def stop(self) -> None:
        self.proc.terminate()
        self.proc.wait(20)
        self.log.close()


DRAWN_JS = """([n, traces]) => {
    const plots = Array.from(document.querySelectorAll('.js-plotly-plot'))
        .filter(gd => !(gd.data && gd.data[0] && gd.data[0].type === 'parcoords'));  // the hyperparameter tab
    return plots.length >= n && plots.every(gd => gd._fullData && gd.data.length >= traces
        && gd.querySelectorAll('.scatterlayer .trace').length >= traces);
}"""


NAVIGATE_JS = """(url) => { window.history.pushState({}, '', url);
    window.dispatchEvent(new PopStateEvent('popstate', {state: {}})); }"""


def compare_page_ms(page, server: Server, ids: list[str], repeats: int = 5) -> tuple[float, float]:
    """(first visit, median in-app visit) in ms.

    First visit: a full page load in a fresh browser, which also downloads and compiles the chart
    library (Plotly, loaded lazily by Streamlit). In-app visit: the way users move between pages
    (the page's URL changes inside the running app, as the sidebar and the Runs page's Compare
    button do), from the Workers page (no chart on it), in a tab that has drawn a chart before. Each
    in-app visit lists the 20 runs in another order, so the server never answers from its cache."""

    def drawn(n_runs: int, t0: float) -> float:
        page.wait_for_function(DRAWN_JS, arg=[3, n_runs], timeout=120_000, polling=20)
        return (time.perf_counter() - t0) * 1000

    page.goto(server.url + "/workers")  # the server warm (imports, engine); the browser without Plotly yet
    page.get_by_text("Queue").first.wait_for(timeout=120_000)
    t0 = time.perf_counter()
    page.goto(f"{server.url}/compare?ids={','.join(ids[:2])}")
    first = drawn(2, t0)
    times = []
    for k in range(repeats):
        order = ids[k:] + ids[:k]
        # Leave for a page without charts first: otherwise the previous visit's 20 drawn traces
        # would satisfy the wait at once and the figure would time nothing.
        page.evaluate(NAVIGATE_JS, "/workers")
        page.wait_for_function("() => !document.querySelector('.js-plotly-plot')", timeout=60_000, polling=20)
        t0 = time.perf_counter()
        page.evaluate(NAVIGATE_JS, f"/compare?ids={','.join(order)}")
        times.append(drawn(len(ids), t0))
    print(
        f"# {len(ids)} runs, in-app visits (ms; the first with nothing of these runs cached on the server): "
        + " ".join(f"{v:.0f}" for v in times),
        flush=True,
    )
    return first, statistics.median(times)


LAST_STEP_JS = """() => { for (const gd of document.querySelectorAll('.js-plotly-plot')) {
    const t = (gd._fullData || []).find(d => d.name === 'train/loss');
    if (t && t.x.length) return t.x[t.x.length - 1]; } return -1; }"""


def _chart_frame(page, timeout_s: float = 120):
    """The frame of the live Loss chart (the Run page draws live charts in component frames)."""
    from playwright.sync_api import Error as PlaywrightError

    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        for frame in page.frames:
            try:
                if frame.evaluate(LAST_STEP_JS) >= 1:
                    return frame
            except PlaywrightError:  # frames come and go while the page loads
                continue
        time.sleep(0.1)
    raise TimeoutError("the Run page never drew train/loss")


def _wait_step(frame, step: int, timeout_s: float = 30) -> None:
    deadline = time.monotonic() + timeout_s
    while frame.evaluate(LAST_STEP_JS) < step:
        if time.monotonic() > deadline:
            raise TimeoutError(f"step {step} not drawn within {timeout_s} s")
        time.sleep(0.02)


def live_latency_p95(page, server: Server, engine: Engine, samples: int) -> float:
    """p95 of: a worker's write committed (the call its DB sink makes when it flushes) → drawn in the browser.
    The sink's own buffering (worker.settings flush_s, 1 s by default) comes on top."""
    r = repo.create_run(engine, SPEC, name="live")
    repo.claim_run(engine, r.id, "cpu@bench", device="cpu")
    repo.append_metrics(engine, r.id, [MetricPoint("train/loss", 1, 2.3, 1, time.time())], worker_id="cpu@bench")
    page.goto(f"{server.url}/run?id={r.id}")
    frame = _chart_frame(page)
    latencies = []
    for i in range(samples):
        step = 2 + i
        time.sleep(0.37 * (i % 4))  # writes land at every phase of the page's refresh cycle
        repo.append_metrics(
            engine, r.id, [MetricPoint("train/loss", step, 2.3 / step, 1, time.time())], worker_id="cpu@bench"
        )
        t0 = time.perf_counter()
        _wait_step(frame, step)
        latencies.append(time.perf_counter() - t0)
    print("# live latencies (s): " + " ".join(f"{v:.2f}" for v in latencies), flush=True)
    return statistics.quantiles(latencies, n=20, method="inclusive")[-1] if len(latencies) >= 2 else latencies[0]


def _last_drawn(page, frame):
    """(the last train/loss step drawn on the page's live chart, its frame): the frame found again if it was
    replaced."""
    from playwright.sync_api import Error as PlaywrightError

    try:
        return frame.evaluate(LAST_STEP_JS), frame
    except PlaywrightError:
        frame = _chart_frame(page)
        return frame.evaluate(LAST_STEP_JS), frame


def viewer_lines(browser, server: Server, engine: Engine, seconds: float, rounds: int) -> None:
    """One live run; `rounds` rounds, each one window of 1 viewer and one of 3 (their order alternating by
    round, so a drift of the machine's load or of the run's size weighs on both alike), of seconds / rounds
    each, in 10-s samples. Every window fails the benchmark unless the run trained throughout it (_viewer)."""
    from benchmarks import _viewer

    run_id, proc = _viewer.start_training(engine, str(engine.url))
    costs = {1: _viewer.ViewerCost(1), 3: _viewer.ViewerCost(3)}
    try:
        for r in range(rounds):
            for viewers in (1, 3) if r % 2 == 0 else (3, 1):
                _viewer.viewer_cost(
                    browser,
                    server.url,
                    server.proc.pid,
                    engine,
                    run_id,
                    viewers,
                    seconds / rounds,
                    ready=_chart_frame,
                    last_drawn=_last_drawn,
                    into=costs[viewers],
                )
    except _viewer.NotTraining as e:
        raise SystemExit(f"bench_app: {e}") from None
    finally:
        _viewer.stop_training(engine, run_id, proc)
    for viewers, cost in costs.items():
        suffix = "" if viewers == 1 else f"_{viewers}_viewers"
        srv, chromium = cost.server_per_viewer(), cost.browser_per_viewer()
        print(
            f"# {viewers} viewer(s), per viewer, samples of 10 s over {rounds} round(s): server % "
            f"{_viewer.spread(srv)}; browser % {_viewer.spread(chromium)}; idle server % "
            f"{_viewer.spread([s.server_pct for s in cost.idle])}; train/loss steps stored per sample "
            f"{_viewer.spread([s.steps for s in cost.open])}",
            flush=True,
        )
        emit(f"server_cpu_per_viewer_pct{suffix}", statistics.median(srv))
        emit(f"browser_cpu_per_viewer_pct{suffix}", statistics.median(chromium))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--only", choices=("runs", "compare", "live"), help="measure one part only")
    args = ap.parse_args()
    n_runs, n_points, samples = (1_000, 10_000, 10) if args.quick else (10_000, 100_000, 20)
    print(f"# load {' '.join(f'{x:.2f}' for x in os.getloadavg())} at the start, {os.cpu_count()} cores", flush=True)
    try:
        _main(args, n_runs, n_points, samples)
    finally:
        print(f"# load {' '.join(f'{x:.2f}' for x in os.getloadavg())} at the end", flush=True)


def _main(args: argparse.Namespace, n_runs: int, n_points: int, samples: int) -> None:
    if args.only in (None, "runs"):
        with tempfile.TemporaryDirectory(prefix="torchdeck-bench-app-") as tmp:
            os.environ["TORCHDECK_HOME"] = tmp
            os.environ.pop("TORCHDECK_DATABASE_URL", None)
            upgrade()
            emit(f"runs_page_ms_{n_runs // 1000}k", runs_page_ms(n_runs))
        with tempfile.TemporaryDirectory(prefix="torchdeck-bench-app-") as tmp:
            os.environ["TORCHDECK_HOME"] = tmp
            upgrade()
            many = n_runs * 10
            emit(f"runs_page_ms_{many // 1000}k", runs_page_ms(many, FILTER, matching=_passing(many)))
    if args.only == "runs":
        return
    with tempfile.TemporaryDirectory(prefix="torchdeck-bench-app-") as tmp:
        os.environ["TORCHDECK_HOME"] = tmp
        upgrade()
        engine = make_engine()
        ids = []
        if args.only != "live":
            t0 = time.perf_counter()
            ids = seed_series(engine, COMPARED, n_points)
            print(f"# seeded {COMPARED} runs × {n_points:,} points in {time.perf_counter() - t0:.0f} s", flush=True)
        server = Server(Path(tmp))
        from playwright.sync_api import sync_playwright

        try:
            with sync_playwright() as p:
                browser = p.chromium.launch(executable_path="/usr/bin/chromium", args=CHROMIUM_ARGS)
                page = browser.new_page(viewport={"width": 1400, "height": 1200})
                if ids:
                    first, returning = compare_page_ms(page, server, ids[:20])
                    print(
                        f"# first visit, full page load of a fresh browser (downloads and compiles Plotly; "
                        f"2 runs): {first:.0f} ms",
                        flush=True,
                    )
                    emit(f"run_page_ms_20x{n_points // 1000}k", returning)
                    _, hundred = compare_page_ms(page, server, ids, repeats=3)
                    emit(f"compare_ms_{len(ids)}x{n_points // 1000}k", hundred)
                if args.only != "compare":
                    emit("live_latency_s_p95", live_latency_p95(page, server, engine, samples))
                    page.close()
                    viewer_lines(browser, server, engine, 20 if args.quick else 60, 1 if args.quick else 2)
                browser.close()
        finally:
            server.stop()


if __name__ == "__main__":
    main()
