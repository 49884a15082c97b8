"""A run's own process: spawned fresh for each run (CUDA is never forked, DataLoader workers are
allowed, and all memory returns to the OS when it exits). It trains with core, writes to the
database through the buffered sink, and records the run's end itself."""

from __future__ import annotations

import ctypes
import logging
import os
import signal
import threading
import time
import traceback

from worker.settings import WorkerSettings

log = logging.getLogger("torchdeck.child")


def die_with_parent() -> None:
    """Linux: SIGKILL this process when the worker that spawned it dies (kill -9 included), so an
    orphan never keeps training unseen; the reaper then re-queues the run and it resumes."""
    try:
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except OSError:
        return


class TermFlag:
    """SIGTERM from the supervisor (cancel grace expired) asks the loop to stop between steps."""

    def __init__(self) -> None:
        self.set = False
        signal.signal(signal.SIGTERM, self._on_term)

    def _on_term(self, signum: int, frame: object) -> None:
        self.set = True


class RunControl:
    def __init__(self, sink, term: TermFlag):
        self.sink, self.term = sink, term

    def should_stop(self) -> bool:
        return self.term.set or self.sink.should_stop()


class SystemMonitor:
    """CPU %, RSS (this process and its loader workers) and per-GPU utilisation, memory, temperature
    as `sys/…` metrics. Their step is the Unix time in seconds, unique across resumed attempts."""

    def __init__(self, sink, period_s: float):
        self.sink, self.period = sink, period_s
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="sys-metrics", daemon=True)

    def start(self) -> SystemMonitor:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()

    def _loop(self) -> None:
        import psutil

        proc = psutil.Process()
        proc.cpu_percent(None)
        while not self._stop.wait(self.period):
            try:
                values = sample_system(proc)
            except Exception:  # noqa: BLE001 - monitoring must never break a run
                continue
            self.sink.metrics(int(time.time()), 0, values)


def sample_system(proc) -> dict[str, float]:
    import psutil

    procs = [proc, *proc.children(recursive=True)]
    rss = 0.0
    for p in procs:
        try:
            rss += p.memory_info().rss
        except psutil.Error:
            continue
    values = {"sys/cpu_percent": proc.cpu_percent(None), "sys/rss_mb": rss / 2**20,
              "sys/host_cpu_percent": psutil.cpu_percent(None)}
    values.update(gpu_metrics())
    return values


def gpu_metrics() -> dict[str, float]:
    """Per visible GPU via NVML (nvidia-ml-py); nothing on machines without one."""
    try:
        import pynvml

        pynvml.nvmlInit()
    except Exception:  # noqa: BLE001 - no driver, no GPU: no GPU metrics
        return {}
    out: dict[str, float] = {}
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    indices = [int(i) for i in visible.split(",") if i.strip().isdigit()] if visible else range(pynvml.nvmlDeviceGetCount())
    for n, i in enumerate(indices):
        h = pynvml.nvmlDeviceGetHandleByIndex(i)
        util = pynvml.nvmlDeviceGetUtilizationRates(h)
        mem = pynvml.nvmlDeviceGetMemoryInfo(h)
        out[f"sys/gpu{n}_util"] = float(util.gpu)
        out[f"sys/gpu{n}_mem_mb"] = mem.used / 2**20
        out[f"sys/gpu{n}_temp_c"] = float(pynvml.nvmlDeviceGetTemperature(h, pynvml.NVML_TEMPERATURE_GPU))
    return out


def spare_main(conn) -> None:
    """A fresh process that imports the heavy libraries ahead of time, then waits for one run.
    The worker keeps one such spare ready, so a new run starts in about a second instead of
    paying torch's import; each process still serves exactly one run and exits."""
    die_with_parent()
    import core.train  # noqa: F401 - the point: torch, torchvision and core imported before the run arrives
    import worker.sink  # noqa: F401

    try:
        job = conn.recv()
    except EOFError:  # the worker went away before giving us a run
        return
    if job is not None:
        run_child(*job)


def run_child(run_id: str, worker_id: str, db_url: str) -> None:
    """Run one run to its end (in a spare process; see worker.tasks.supervise)."""
    die_with_parent()
    logging.basicConfig(level=logging.INFO, format=f"%(asctime)s run {run_id} %(levelname)s %(message)s")
    term = TermFlag()
    from core.config import RunSpec
    from core.train import run_training
    from db.engine import make_engine
    from db.repo import finish_run, get_run
    from db.store import StoreError
    from worker.artifacts import fetch_checkpoints, localize_dataset
    from worker.sink import DbSink

    settings = WorkerSettings()
    engine = make_engine(db_url)
    out, store_error = settings.run_dir(run_id), None
    try:
        store = settings.store()
    except StoreError as e:  # a wrong TORCHDECK_ARTIFACTS: the run fails saying so
        store, store_error = None, e
    sink = DbSink(engine, run_id, worker_id, settings, store=store, run_dir=out)
    monitor = SystemMonitor(sink, settings.sys_metrics_s).start()
    try:
        if store_error is not None:
            raise store_error
        run = retrying(lambda: get_run(engine, run_id), "read the run")
        spec = RunSpec.model_validate(run.spec)
        if sink.uploader is not None:
            # Another host may have run the earlier attempts: resume from the checkpoint in the store,
            # and read an uploaded dataset from the store when its folder is not on this host.
            for path in fetch_checkpoints(store, run_id, out):
                sink.uploader.mark_present(path)
                sink.event("lifecycle", "info", f"fetched {path.name} from {store.url} to resume",
                           {"code": "checkpoint_fetched"})
        spec = localize_dataset(spec, store, engine) if store is not None else spec
        resume = (out / "checkpoints" / "last.pt").is_file()
        summary = run_training(spec, out, sink, RunControl(sink, term), resume=resume)
        status, error = summary["status"], summary.get("error")
    except Exception as e:  # noqa: BLE001 - recorded on the run, never lost in a log
        status, error, summary = "failed", f"{e.__class__.__name__}: {e}", {}
        sink.event("lifecycle", "error", error, {"code": "failed", "traceback": traceback.format_exc()})
    finally:
        monitor.stop()
    sink.close()
    if not sink._owned:
        log.warning("another worker owns run %s now; leaving its status alone", run_id)
        return
    retrying(lambda: finish_run(engine, run_id, status, summary=summary, error=error, worker_id=worker_id), "record the end of the run")


def retrying(fn, what: str, total_s: float = 120.0):
    """Call fn until it succeeds: a database that is briefly away (restart, failover) must not fail a run."""
    from sqlalchemy.exc import OperationalError

    delay, deadline = 0.5, time.monotonic() + total_s
    while True:
        try:
            return fn()
        except OperationalError as e:
            if time.monotonic() > deadline:
                raise
            log.warning("could not %s (%s); retrying in %.1fs", what, e.__class__.__name__, delay)
            time.sleep(delay)
            delay = min(5.0, delay * 2)
