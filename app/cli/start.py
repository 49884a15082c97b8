"""CLI commands that start the stack's processes and stay in the foreground until stopped: `worker` (Celery
workers of this host), `up` (embedded mode: a private Redis, the local workers and the dashboard) and `ui` (the
dashboard alone). processes.py builds their command lines; Ctrl-C, `kill` or a closed terminal stop them all."""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path
from typing import Annotated

import typer

from app.cli.runs import _engine
from core.names import CLAIMABLE_STATUSES, JOBS_QUEUE

WORKERS_HELP = (
    "CPU workers side by side on this machine, each running one run, the torch threads split between them "
    "(an OMP_NUM_THREADS you set is each one's instead). At most one per CPU core. With GPUs one worker per GPU "
    "is the rule: on a GPU host give --queues cpu for CPU workers."
)


MULTI_GPU_HELP = (
    "ONE worker owning all of --gpus (e.g. --gpus 0,1,2,3 --multi-gpu) for runs of resources.gpus 2 to "
    "N (queues gpu-x2 .. gpu-xN); single-GPU runs stay with one worker per GPU, started separately."
)


def worker(
    gpus: Annotated[str | None, typer.Option(help="GPU indices, e.g. 0,1: one worker process per GPU.")] = None,
    queues: Annotated[
        str | None, typer.Option(help="Queues to consume: gpu, cpu (default gpu with GPUs, else cpu).")
    ] = None,
    jobs: Annotated[
        bool,
        typer.Option(
            "--jobs/--no-jobs",
            help="Also start this host's CPU-only worker for the "
            "dashboard's pre-flight and export jobs (the `jobs` queue).",
        ),
    ] = True,
    workers: Annotated[int | None, typer.Option("--workers", help=WORKERS_HELP + " [default: 1]")] = None,
    multi_gpu: Annotated[bool, typer.Option("--multi-gpu", help=MULTI_GPU_HELP)] = False,
) -> None:
    """Start Celery workers: one solo-pool process per GPU (CUDA_VISIBLE_DEVICES pinned), or one owning all of
    --gpus for multi-GPU runs (--multi-gpu), or --workers CPU workers, plus one small worker for the dashboard's
    jobs (pre-flight, export now)."""
    from app.cli.processes import ProcessGroup, jobs_worker_command

    qs = [q.strip() for q in queues.split(",")] if queues else None
    commands = _worker_commands(gpus, qs, workers, multi_gpu)  # refuses before anything starts
    _engine()  # refuses an out-of-date schema before anything starts
    group = ProcessGroup()
    names = []
    for cmd, env in commands:
        names.append(cmd[cmd.index("-n") + 1].split("@")[0])
        threads = f", {env['OMP_NUM_THREADS']} torch thread(s)" if "OMP_NUM_THREADS" in env else ""
        typer.echo(
            f"starting {cmd[cmd.index('-n') + 1]} (CUDA_VISIBLE_DEVICES={env['CUDA_VISIBLE_DEVICES']!r}{threads})"
        )
        group.start("worker", cmd, env)
    if jobs and JOBS_QUEUE not in (qs or []):
        cmd, env = jobs_worker_command(f"jobs-{names[0]}")  # unique per `torchdeck worker` of a host
        what = f"queue {JOBS_QUEUE}: pre-flight and export for the dashboard, CPU only"
        typer.echo(f"starting {cmd[cmd.index('-n') + 1]} ({what})")
        group.start("jobs", cmd, env)
    _wait(group)


def _worker_commands(gpus: str | None, qs: list[str] | None, workers: int | None, multi_gpu: bool = False):
    """The worker processes of `torchdeck worker`; exit 2 with the reason when --workers or --multi-gpu does not
    fit. `--queues cpu --workers N` without --gpus asks for CPU workers, even on a GPU host."""
    from app.cli.processes import gpu_count, worker_commands

    if gpus:
        gpu_list = [int(g) for g in gpus.split(",")]
    elif qs == ["cpu"] and workers is not None:
        gpu_list = []
    else:
        gpu_list = list(range(gpu_count()))
    try:
        return worker_commands(gpu_list, qs, cpu_workers=1 if workers is None else workers, multi_gpu=multi_gpu)
    except ValueError as e:
        typer.secho(str(e), fg="red", err=True)
        raise typer.Exit(2) from None


def _wait(group) -> None:
    import signal

    def _terminate(signum, frame):  # `kill` or a closed terminal stop everything, as Ctrl-C does
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, _terminate)
    signal.signal(signal.SIGHUP, _terminate)
    try:
        while not group.dead():
            time.sleep(0.5)
        typer.secho(f"stopped: {group.dead()}", fg="red", err=True)
        group.stop()
        raise typer.Exit(1)
    except KeyboardInterrupt:
        typer.echo("\nstopping…")
        group.stop()


def up(
    port: Annotated[int, typer.Option(help="UI port.")] = 8501,
    no_ui: Annotated[bool, typer.Option("--no-ui", help="Start the broker and the worker only.")] = False,
    workers: Annotated[
        int,
        typer.Option(
            "--workers",
            help="CPU workers side by side, each running one run, the torch "
            "threads split between them (an OMP_NUM_THREADS you set is each one's instead); "
            "at most one per CPU core. A GPU machine runs one local worker.",
        ),
    ] = 1,
) -> None:
    """Embedded mode: a private Redis, one local worker (or --workers CPU workers) and the UI, with SQLite
    under TORCHDECK_HOME."""
    from app.cli.processes import (
        ProcessGroup,
        jobs_worker_command,
        start_private_redis,
        ui_command,
    )
    from app.services.runs import spec_of
    from db.engine import data_home
    from db.migrate import upgrade
    from db.repo import list_runs

    home = data_home().resolve()
    (home / "logs").mkdir(exist_ok=True)
    os.environ.setdefault("TORCHDECK_HOME", str(home))
    ui = None if no_ui else _ui_command(ui_command, home, port)  # refuses before anything starts
    commands, banner = _up_workers(workers)  # so does a --workers that does not fit
    rev = upgrade()
    group = ProcessGroup()
    try:
        if not os.environ.get("TORCHDECK_BROKER_URL"):
            os.environ["TORCHDECK_BROKER_URL"] = start_private_redis(home, group)
            # Other terminals (`torchdeck submit`) find the private broker through this file.
            (home / "broker.url").write_text(os.environ["TORCHDECK_BROKER_URL"])
        for i, (cmd, env) in enumerate(commands, start=1):
            env.pop("CUDA_VISIBLE_DEVICES")  # the local worker sees every GPU the machine has
            group.start("worker", cmd, env, log=home / "logs" / ("worker.log" if i == 1 else f"worker{i}.log"))
        cmd, env = jobs_worker_command()  # pre-flight and export now, beside the runs
        group.start("jobs", cmd, env, log=home / "logs" / "jobs.log")
        _requeue_queued(list_runs, spec_of)
        if ui is not None:
            group.start("ui", ui, log=home / "logs" / "ui.log")
            typer.echo(f"torchdeck is up: http://{ui[ui.index('--server.address') + 1]}:{port}")
        else:
            typer.echo("torchdeck worker is up (no UI); submit runs with `torchdeck submit SPEC.yaml`")
        typer.echo(banner)
        typer.echo(f"data: {home}  (schema {rev}); logs: {home / 'logs'}; Ctrl-C stops everything")
    except Exception:
        group.stop()
        raise
    try:
        _wait(group)
    finally:
        (home / "broker.url").unlink(missing_ok=True)


def _up_workers(workers: int) -> tuple[list, str]:
    """The local workers of `torchdeck up` (queues gpu and cpu) and the line that describes them; exit 2 with
    the reason when --workers does not fit. A GPU machine runs one local worker, which sees every GPU."""
    from app.cli.processes import gpu_count, worker_commands
    from core.names import multi_gpu_queues

    gpus = gpu_count()
    try:
        if workers > 1 and gpus:
            raise ValueError(
                f"--workers {workers}: this machine has {gpus} GPU(s), and `torchdeck up` runs one local "
                "worker that owns them (one worker per GPU is the rule); --workers is for CPU-only machines"
            )
        # The one local worker sees every GPU of the machine: it takes the runs of 2..N GPUs too.
        commands = worker_commands(None, ["gpu", "cpu", *multi_gpu_queues(gpus)], cpu_workers=workers)
    except ValueError as e:
        typer.secho(str(e), fg="red", err=True)
        raise typer.Exit(2) from None
    threads = commands[0][1]["OMP_NUM_THREADS"]
    if gpus:
        return commands, f"workers: 1, with this machine's {gpus} GPU(s) and {threads} torch thread(s)"
    return commands, f"workers: {len(commands)} CPU worker(s) side by side, {threads} torch thread(s) each"


def _ui_command(ui_command, home: Path, port: int) -> list[str]:
    from app.auth import AuthNotConfigured

    try:
        return ui_command(home, port)
    except AuthNotConfigured as e:
        typer.secho(str(e), fg="red", err=True)
        raise typer.Exit(2) from None


def ui(port: Annotated[int, typer.Option(help="UI port.")] = 8501) -> None:
    """The dashboard alone (the `app` service of a team deployment): local mode serves 127.0.0.1 only;
    TORCHDECK_MODE=team requires sign-in (TORCHDECK_OIDC_*) and listens on TORCHDECK_UI_ADDRESS (default 0.0.0.0)."""
    from app.cli.processes import ui_command
    from db.engine import data_home

    home = data_home().resolve()
    cmd = _ui_command(ui_command, home, port)
    sys.stdout.flush()
    os.execv(cmd[0], cmd)  # Streamlit replaces this process: signals reach it directly (a container's PID 1)


def _requeue_queued(list_runs, spec_of) -> None:
    """The private broker starts empty: queued runs (the database is the truth) are enqueued again.
    A run delivered twice still runs once (atomic claim)."""
    from app.services.broker import enqueue, get_engine

    page = list_runs(get_engine(), status=list(CLAIMABLE_STATUSES), source="torchdeck", limit=1000)
    for r in page.runs:
        enqueue(r.id, spec_of(r))


def register(app: typer.Typer) -> None:
    for fn in (worker, up, ui):
        app.command(fn.__name__)(fn)
