"""A run's own process: spawned fresh for each run (CUDA is never forked, DataLoader workers are
allowed, and all memory returns to the OS when it exits). It trains with core, writes to the
database through the buffered sink, and records the run's end itself."""

from __future__ import annotations

import logging
import os
import signal
import threading
import time
import traceback

from core.names import CHECKPOINT_FILES, SYS_CPU, SYS_HOST_CPU, SYS_RSS, gpu_key
from core.process import die_with_parent, keep_large_allocations
from core.redact import redact_logs
from worker.settings import WorkerSettings

log = logging.getLogger("torchdeck.child")


class TermFlag:
    """SIGTERM from the supervisor (cancel grace expired) asks the loop to stop between steps."""

    def __init__(self) -> None:
        self.set = False
        signal.signal(signal.SIGTERM, self._on_term)

    def _on_term(self, signum: int, frame: object) -> None:
        self.set = True


class RunControl:
    def __init__(self, sink, term: TermFlag, engine=None, run=None):
        self.sink, self.term, self.engine, self.run = sink, term, engine, run

    def should_stop(self) -> bool:
        return self.term.set or self.sink.should_stop()

    def judge_epoch(self, epoch: int) -> str | None:
        """A sweep's trial: the pruner's verdict at this epoch end, from the stored objective (so this epoch's
        metrics are stored first). Taken once per trial and epoch; a resumed attempt reads the stored one."""
        if self.run is None or self.run.sweep_id is None:
            return None
        from sweep.control import judge_run

        self.sink.flush()
        try:
            return retrying(lambda: judge_run(self.engine, self.run, epoch), "judge the trial")
        except Exception as e:  # noqa: BLE001 - a pruner that cannot decide never stops a trial
            self.sink.event(
                "lifecycle",
                "warning",
                f"the sweep's pruner could not judge epoch {epoch} ({e.__class__.__name__}: {e}); the trial goes on",
                {"code": "judge_failed"},
            )
            return None


class SystemMonitor:
    """CPU %, RSS (this process and its loader workers) and per-GPU utilisation, memory, temperature
    as `sys/…` metrics: one sample when the run starts, one every `period_s`, one when it stops, so a run
    of any length has them. Their step is the Unix time in seconds (always increasing within a run,
    unique across resumed attempts), which the charts show as wall time."""

    def __init__(self, sink, period_s: float):
        self.sink, self.period = sink, period_s
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="sys-metrics", daemon=True)
        self._proc = None
        self._last_step = 0

    def start(self) -> SystemMonitor:
        import psutil

        self._proc = psutil.Process()
        self._proc.cpu_percent(None)  # CPU percentages compare with the previous call: prime them
        psutil.cpu_percent(None)
        time.sleep(0.05)
        self._sample()
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout=10)
        if self._proc is not None:
            self._sample()

    def _loop(self) -> None:
        while not self._stop.wait(self.period):
            self._sample()

    def _sample(self) -> None:
        try:
            values = sample_system(self._proc)
        except Exception:  # noqa: BLE001 - monitoring must never break a run
            return
        step = max(int(time.time()), self._last_step + 1)
        self._last_step = step
        self.sink.metrics(step, 0, values)


def sample_system(proc) -> dict[str, float]:
    import psutil

    procs = [proc, *proc.children(recursive=True)]
    rss = 0.0
    for p in procs:
        try:
            rss += p.memory_info().rss
        except psutil.Error:
            continue
    values = {SYS_CPU: proc.cpu_percent(None), SYS_RSS: rss / 2**20, SYS_HOST_CPU: psutil.cpu_percent(None)}
    values.update(gpu_metrics())
    return values


def gpu_metrics() -> dict[str, float]:
    """Per GPU this process sees (CUDA_VISIBLE_DEVICES, in CUDA's order) via NVML (nvidia-ml-py); nothing on
    machines without one. A figure NVML does not give for a device (a MIG slice's utilisation) is left out."""
    try:
        import pynvml

        pynvml.nvmlInit()
        handles = nvml_handles(pynvml, os.environ.get("CUDA_VISIBLE_DEVICES"))
    except Exception:  # noqa: BLE001 - no driver, no GPU: no GPU metrics
        return {}
    out: dict[str, float] = {}
    for n, h in enumerate(handles):
        reads = {
            "util": lambda h=h: pynvml.nvmlDeviceGetUtilizationRates(h).gpu,
            "mem_mb": lambda h=h: pynvml.nvmlDeviceGetMemoryInfo(h).used / 2**20,
            "temp_c": lambda h=h: pynvml.nvmlDeviceGetTemperature(h, pynvml.NVML_TEMPERATURE_GPU),
        }
        for what, read in reads.items():
            try:
                out[gpu_key(n, what)] = float(read())
            except Exception:  # noqa: BLE001 - not supported on this device
                continue
    return out


def visible_devices(value: str | None) -> list[int | str] | None:
    """CUDA_VISIBLE_DEVICES as CUDA reads it: None when unset (every GPU), else its entries up to the first that is
    neither an index nor a GPU-/MIG- UUID (CUDA ignores the rest: `-1` hides every GPU, as `` does)."""
    if value is None:
        return None
    out: list[int | str] = []
    for entry in (e.strip() for e in value.split(",")):
        if entry.isdigit():
            out.append(int(entry))
        elif entry.startswith(("GPU-", "MIG-")):
            out.append(entry)
        else:
            break
    return out


def nvml_handles(nvml, visible: str | None) -> list:
    """The NVML handles of the GPUs CUDA shows a process with this CUDA_VISIBLE_DEVICES, in CUDA's order: an index
    is NVML's (workers number CUDA's devices by PCI bus, as NVML does: CUDA_DEVICE_ORDER below), a UUID (whole, or a
    GPU's unique prefix, as CUDA takes it) is looked up by UUID. CUDA stops at an entry it cannot find: so does this."""
    entries = visible_devices(visible)
    count = nvml.nvmlDeviceGetCount()
    if entries is None:
        return [nvml.nvmlDeviceGetHandleByIndex(i) for i in range(count)]
    out = []
    for e in entries:
        try:
            out.append(nvml.nvmlDeviceGetHandleByIndex(e) if isinstance(e, int) else _handle_by_uuid(nvml, e, count))
        except Exception:  # noqa: BLE001 - no such GPU here
            break
    return out


def _handle_by_uuid(nvml, uuid: str, count: int):
    try:
        return nvml.nvmlDeviceGetHandleByUUID(uuid)
    except Exception:  # noqa: BLE001 - not a whole UUID: CUDA also takes a prefix that names one GPU
        handles = [nvml.nvmlDeviceGetHandleByIndex(i) for i in range(count)]
        uuids = [nvml.nvmlDeviceGetUUID(h) for h in handles]  # str (bytes from older nvidia-ml-py)
        found = [h for h, u in zip(handles, uuids) if (u.decode() if isinstance(u, bytes) else u).startswith(uuid)]
        if len(found) != 1:
            raise LookupError(f"{uuid} names {len(found)} GPUs here") from None
        return found[0]


# CUDA numbers GPUs fastest first unless told otherwise, NVML (and `torchdeck worker --gpus`) by PCI bus: every worker
# process imports this module (worker.tasks) before any CUDA use, and its run processes inherit this, so a worker's
# CUDA_VISIBLE_DEVICES=1 is NVML's GPU 1 for CUDA too.
os.environ.setdefault("CUDA_DEVICE_ORDER", "PCI_BUS_ID")


# Exit code of a run process that gave its run up because another worker owns it now, or it was
# deleted: the supervisor records nothing for it (the run is not this worker's any more).
ABANDONED_EXIT = 75
# Exit code of a run process whose multi-process run lost one of its other ranks (core.distributed.RankLost):
# the run is not failed, the supervisor marks it lost at once and re-queues it to resume from its checkpoint.
RANK_LOST_EXIT = 76
PULSE_S = 0.5  # how often a run process proves to its supervisor that it is alive and scheduled


def start_pulse(pulse) -> None:
    """Tick `pulse` (a shared double) with the monotonic clock, from the moment the process starts: the
    supervisor heartbeats the run for its child only while the ticks come (a stopped or hung process
    stops them, and its run becomes lost instead of being kept alive by the supervisor)."""
    if pulse is None:
        return

    def tick() -> None:
        while True:
            pulse.value = time.monotonic()
            time.sleep(PULSE_S)

    threading.Thread(target=tick, name="pulse", daemon=True).start()


def spare_main(conn, pulse=None, ready=None) -> None:
    """A process kept ready for the worker's next run: the heavy libraries imported ahead of time (already
    there when it was forked from the worker's fork server, imported here when it was spawned: see
    worker.preload), then it waits for one run. A new run starts at once instead of paying torch's import;
    each process still serves exactly one run and exits. `ready` (a shared double) gets the monotonic time
    its imports were done, so the worker can tell whether a run had to wait for them."""
    die_with_parent()
    keep_large_allocations()  # a run's batches and activations reuse their memory from step to step
    redact_logs()
    start_pulse(pulse)
    import worker.preload  # noqa: F401 - the point: torch, torchvision, core and the digits reader imported

    if ready is not None:
        ready.value = time.monotonic()

    try:
        job = conn.recv()
    except EOFError:  # the worker went away before giving us a run
        return
    if job is not None:
        code = run_child(*job)
        # Everything is stored (the sink is closed, the run finished): skip the interpreter's teardown of torch,
        # which can take seconds, so the worker moves on to its next run (a sweep's next trial) at once.
        logging.shutdown()
        os._exit(code)


def _abandon(reason: str) -> None:
    """From the sink's threads: this process no longer owns its run. Exit now, before the loop writes
    another file into a run folder that a new owner is using."""
    log.warning("%s: stopping this run process without touching the run", reason)
    logging.shutdown()
    os._exit(ABANDONED_EXIT)


def rank_loss(exc: BaseException) -> dict | None:
    """What is known of the lost rank when `exc` says another process of a multi-process run died
    (core.distributed.RankLost), else None. Told by class as well as by name: the training core that defines
    it may be absent or older on this host, and a one-process run never needs it."""
    try:
        from core.distributed import RankLost
    except Exception:  # noqa: BLE001 - absent (or broken) here: only the name can tell, and a one-process run goes on
        RankLost = None  # noqa: N806
    named = any(c.__name__ == "RankLost" for c in type(exc).__mro__)
    if not named and not (RankLost is not None and isinstance(exc, RankLost)):
        return None
    found = {k: getattr(exc, k) for k in ("rank", "world_size", "exitcode") if isinstance(getattr(exc, k, None), int)}
    return {**found, "error": f"{exc.__class__.__name__}: {exc}"}


def record_failure(sink, exc: BaseException) -> bool:
    """Record on the run why training raised `exc`; True when it was a lost rank, which does not fail the run:
    the run process then exits with RANK_LOST_EXIT and its supervisor re-queues the run to resume."""
    lost = rank_loss(exc)
    if lost is None:
        sink.event(
            "lifecycle",
            "error",
            f"{exc.__class__.__name__}: {exc}",
            {"code": "failed", "traceback": "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))},
        )
        return False
    which = f"rank {lost['rank']}" if "rank" in lost else "a rank"
    if "world_size" in lost:
        which += f" of {lost['world_size']}"
    sink.event(
        "lifecycle",
        "warning",
        f"{which} of this run's processes died ({lost['error']}); the run is marked "
        "lost and resumes from its last checkpoint, on this worker or another that offers the same GPUs",
        {"code": "rank_lost", **lost},
    )
    return True


def run_child(run_id: str, worker_id: str, db_url: str) -> int:
    """Run one run to its end (in a spare process; see worker.tasks.supervise); the process's exit code:
    0, or RANK_LOST_EXIT when a lost rank left the run to be resumed (its supervisor marks it lost)."""
    die_with_parent()
    logging.basicConfig(level=logging.INFO, format=f"%(asctime)s run {run_id} %(levelname)s %(message)s")
    term = TermFlag()
    from db.artifacts import StoreError
    from db.engine import make_engine
    from db.repo import finish_run
    from worker.sink import DbSink

    settings = WorkerSettings()
    engine = make_engine(db_url)
    out, store_error, rank_lost = settings.run_dir(run_id), None, False
    run = _owned_run(engine, run_id, worker_id)
    try:
        store = settings.store()
    except StoreError as e:  # a wrong TORCHDECK_ARTIFACTS: the run fails saying so
        store, store_error = None, e
    sink = DbSink(
        engine, run_id, worker_id, settings, store=store, run_dir=out, attempt=run.attempt, on_abandon=_abandon
    )
    monitor = SystemMonitor(sink, settings.sys_metrics_s).start()
    try:
        if store_error is not None:
            raise store_error
        summary = _train(run, engine, store, sink, RunControl(sink, term, engine, run), out)
        status, error = summary["status"], summary.get("error")
    except Exception as e:  # noqa: BLE001 - recorded on the run, never lost in a log
        status, error, summary = "failed", f"{e.__class__.__name__}: {e}", {}
        rank_lost = record_failure(sink, e)
    finally:
        monitor.stop()
    sink.close()
    if sink.abandoned is not None:
        _abandon(sink.abandoned)
    if rank_lost:
        return RANK_LOST_EXIT
    if sink.degraded:
        summary = {**summary, "degraded": sink.degraded}
    retrying(
        lambda: finish_run(engine, run_id, status, summary=summary, error=error, worker_id=worker_id),
        "record the end of the run",
    )
    return 0


def _owned_run(engine, run_id: str, worker_id: str):
    """The run this process was handed, still this worker's; otherwise the process exits (_abandon): the run was
    deleted, or another worker claimed it meanwhile."""
    from db.repo import RunNotFound, get_run

    try:
        run = retrying(lambda: get_run(engine, run_id), "read the run")
    except RunNotFound:
        _abandon(f"run {run_id} was deleted")
    if run.worker_id != worker_id:
        _abandon(f"run {run_id} is owned by {run.worker_id}")
    return run


def _train(run, engine, store, sink, control: RunControl, out) -> dict:
    """Train the run here, resumed when its last.pt is in `out`; core's summary. With a store that is not this
    host's folder, another host may have run the earlier attempts: their checkpoints are fetched from the store
    first, and an uploaded dataset whose folder is not on this host is read from the store."""
    from core.config import RunSpec
    from core.train import run_training
    from worker.artifacts import fetch_checkpoints, localize_dataset

    spec = RunSpec.model_validate(run.spec)
    if sink.uploader is not None:
        for path in fetch_checkpoints(store, run.id, out):
            sink.uploader.mark_present(path)
            sink.event(
                "lifecycle",
                "info",
                f"fetched {path.name} from {store.url} to resume",
                {"code": "checkpoint_fetched"},
            )
    spec = localize_dataset(spec, store, engine) if store is not None else spec
    resume = (out / "checkpoints" / CHECKPOINT_FILES["last"]).is_file()
    return run_training(spec, out, sink, control, resume=resume)


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
