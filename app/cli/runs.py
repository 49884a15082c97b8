"""CLI commands over the queue and the database: submit, status, watch, cancel, runs, evaluate (the commands that
start the stack's processes, worker, up and ui, are in start.py)."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console
from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from core.names import FINISHED_STATUSES, SUCCESS_STATUSES
from db.types import DEFAULT_PROJECT


def load_spec_or_exit(spec_path: Path, overrides: list[str]):
    """The validated spec of a YAML file with --set overrides; exit 2 with each field's error otherwise."""
    from core.config import SpecError, load_spec

    try:
        return load_spec(spec_path, overrides)
    except SpecError as e:
        typer.secho(str(e), fg="red", err=True)
        raise typer.Exit(2) from None


def _engine():
    from app.services.broker import get_engine
    from db.migrate import check_schema
    from db.repo import SchemaOutOfDate

    try:
        check_schema()
    except SchemaOutOfDate as e:
        typer.secho(str(e), fg="red", err=True)
        raise typer.Exit(3) from None
    return get_engine()


def _get(run_id: str):
    from db.repo import RunNotFound, get_run

    try:
        return get_run(_engine(), run_id)
    except RunNotFound:
        typer.secho(f"no run {run_id!r}", fg="red", err=True)
        raise typer.Exit(2) from None


def _best(run) -> str:
    best = (run.summary or {}).get("best") or {}
    return f"{best['metric']}={best['value']:.4f} (epoch {best['epoch']})" if best.get("metric") else "-"


def submit(
    spec: Annotated[Path, typer.Argument(help="A run spec in YAML.")],
    name: Annotated[str | None, typer.Option("--name", help="Run name (default: the spec's name).")] = None,
    overrides: Annotated[list[str], typer.Option("--set", help="Override a field (repeatable).")] = [],  # noqa: B006
    tags: Annotated[list[str], typer.Option("--tag", help="Tag the run (repeatable).")] = [],  # noqa: B006
    owner: Annotated[
        str | None,
        typer.Option(
            "--owner",
            help="Who the run belongs to (default: 'local' in local mode, 'cli:<OS user>' in team mode, "
            "which only an admin may cancel or delete in the dashboard).",
        ),
    ] = None,
    priority: Annotated[
        str, typer.Option("--priority", help="low, normal or high: its place in its queue (`torchdeck priority`).")
    ] = "normal",
    project: Annotated[
        str, typer.Option("--project", help="The project it goes to; in team mode its owner must be a member of it.")
    ] = DEFAULT_PROJECT,
) -> None:
    """Validate, store and enqueue a run; prints the run id as the last line. The CLI acts with the database's
    and the broker's credentials, as an operator: it is not signed in (the run's owner must still be a member of
    its project in team mode: `torchdeck projects member`)."""
    from app.auth import local_user
    from app.cli.projects import refused
    from app.services.broker import run_queue
    from app.services.runs import submit as do_submit

    run_spec = load_spec_or_exit(spec, overrides)
    # (the operator's shell may give any priority: it acts as an admin); RuntimeError: the broker is unreachable
    with refused(RuntimeError):
        run = do_submit(
            run_spec,
            name=name,
            tags=tags,
            owner=owner or cli_owner(),
            engine=_engine(),
            priority=priority,
            by=local_user(),
            project=project,
        )
    typer.echo(f"queued on '{run_queue(run_spec)}' in project {run.project}: {run.name or '(unnamed)'}")
    _say_who_serves(run_queue(run_spec))
    typer.echo(run.id)


def cli_owner() -> str:
    """The owner of a run submitted from a shell: the OS user, marked as such in team mode."""
    from app.auth import team_mode

    if not team_mode():
        return "local"
    import getpass

    return f"cli:{getpass.getuser()}"


def _say_who_serves(queue: str) -> None:
    """Which live workers serve the run's queue, or a warning that none does. Right after `make up` (`torchdeck
    up`), whose workers register a few seconds after it starts, it waits for them a moment first, and says so."""
    from app.services.broker import queue_status_after_start

    def say_waiting(seconds: float) -> None:
        typer.echo(
            f"no live worker serves '{queue}' yet: waiting up to {seconds:.0f} s for the workers of the "
            "stack just started to register…",
            err=True,
        )

    try:
        waiting = queue_status_after_start(queue, _engine(), waiting=say_waiting)
    except Exception as e:  # noqa: BLE001 - the run is queued; this is advice only
        typer.secho(f"could not list the workers: {e}", fg="yellow", err=True)
        return
    if waiting.served:
        typer.echo(waiting.message())
    else:
        typer.secho("warning: " + waiting.message(), fg="yellow", err=True)


def status(
    run_id: str, as_json: Annotated[bool, typer.Option("--json", help="Machine-readable output.")] = False
) -> None:
    """Status, progress and best metric of a run."""
    run = _get(run_id)
    if as_json:
        typer.echo(
            json.dumps(
                {
                    "id": run.id,
                    "name": run.name,
                    "status": run.status,
                    "progress": run.progress,
                    "attempt": run.attempt,
                    "worker": run.worker_id,
                    "summary": run.summary,
                    "error": run.error,
                },
                default=str,
            )
        )
        return
    progress = f"progress {100 * (run.progress or 0):.0f}%"
    typer.echo(f"{run.id}  {run.status}  {progress}  best {_best(run)}  worker {run.worker_id or '-'}")
    if run.error:
        typer.secho(f"error: {run.error}", fg="red")


def watch(run_id: str, interval: Annotated[float, typer.Option(help="Seconds between polls.")] = 1.0) -> None:
    """A live progress bar until the run ends; exits non-zero unless it completed or stopped early."""
    from db.repo import get_run

    engine = _engine()
    run = _get(run_id)
    with Progress(
        TextColumn(f"[bold]{run.name or run.id}"),
        BarColumn(),
        TextColumn("{task.percentage:>3.0f}%"),
        TextColumn("{task.fields[status]}"),
        TimeElapsedColumn(),
        console=Console(stderr=True),
    ) as bar:
        task = bar.add_task("run", total=1.0, status=run.status)
        while run.status not in FINISHED_STATUSES:
            bar.update(task, completed=run.progress or 0.0, status=run.status)
            time.sleep(interval)
            run = get_run(engine, run_id)
        bar.update(task, completed=run.progress or 0.0, status=run.status)
    typer.echo(f"{run.status}  best {_best(run)}" + (f"  error: {run.error}" if run.error else ""))
    if run.status not in SUCCESS_STATUSES:
        raise typer.Exit(1)


def cancel(run_id: str) -> None:
    """Cancel a run: a queued one never starts; a running one stops between steps, checkpoint kept."""
    from app.auth import local_user
    from app.services.runs import LoggedByScript
    from app.services.runs import cancel as do_cancel

    _get(run_id)
    try:
        # A shell with the database's credentials is the operator's: the CLI acts as an admin.
        run = do_cancel(run_id, engine=_engine(), by=local_user())
    except LoggedByScript as e:  # a run a script logs is the script's to end
        typer.secho(str(e), fg="red", err=True)
        raise typer.Exit(2) from None
    typer.echo(f"{run.id}: {'cancelled' if run.status == 'cancelled' else 'cancel requested (' + run.status + ')'}")


def priority(
    run_id: Annotated[str, typer.Argument(help="A queued run, or a sweep (its queued trials and those to come).")],
    level: Annotated[str, typer.Argument(help="low, normal or high (high: an admin's; this shell is one).")],
) -> None:
    """Move a queued run within its queue: a worker takes the highest priority first, then the person with the
    least recent GPU time, then the oldest run."""
    from app.auth import local_user
    from app.services.runs import set_priority
    from app.services.sweeps import set_sweep_priority
    from db.repo import RunNotFound, SweepNotFound, get_run

    try:
        get_run(_engine(), run_id)
    except RunNotFound:
        try:
            moved = set_sweep_priority(run_id, level, engine=_engine(), by=local_user())
        except SweepNotFound:
            typer.secho(f"no run or sweep {run_id!r}", fg="red", err=True)
            raise typer.Exit(2) from None
        except ValueError as e:
            typer.secho(str(e), fg="red", err=True)
            raise typer.Exit(2) from None
        typer.echo(f"sweep {run_id}: priority {level} ({moved} queued run(s) moved, and its trials to come)")
        return
    try:
        # A shell with the database's credentials is the operator's: the CLI acts as an admin.
        run = set_priority(run_id, level, engine=_engine(), by=local_user())
    except ValueError as e:
        typer.secho(str(e), fg="red", err=True)
        raise typer.Exit(2) from None
    typer.echo(f"{run.id}: priority {level}")


def runs(
    status_filter: Annotated[str | None, typer.Option("--status", help="Only runs with this status.")] = None,
    limit: Annotated[int, typer.Option(help="How many (newest first).")] = 20,
    project: Annotated[str | None, typer.Option("--project", help="Only the runs of this project.")] = None,
) -> None:
    """A table of runs (of every project, or of one)."""
    from app.cli.projects import refused
    from db.projects import get_project
    from db.repo import list_runs

    engine = _engine()
    if project is not None:
        with refused():
            get_project(engine, project)
    page = list_runs(engine, status=status_filter, limit=limit, project=project)
    table = Table("name", "project", "status", "progress", "best", "worker", "created")
    table.add_column("id", no_wrap=True, min_width=12)  # copied into other commands: never truncated
    for r in page.runs:
        table.add_row(
            r.name or "",
            r.project,
            r.status,
            f"{100 * (r.progress or 0):.0f}%",
            _best(r),
            r.worker_id or "",
            r.created_at.strftime("%Y-%m-%d %H:%M"),
            r.id,
        )
    Console().print(table)
    typer.echo(f"{page.total} run(s)")


def evaluate(
    run_id: str,
    data: Annotated[str, typer.Option("--data", help="A built-in or uploaded dataset's name (--path: a name for it).")],
    path: Annotated[
        str | None, typer.Option(help="An image folder to read instead (within the readable roots).")
    ] = None,
) -> None:
    """Score a finished run's verified ONNX export on another dataset, on a jobs worker; the evaluation is stored
    and listed on the Run page."""
    from app.auth import User
    from app.services.evaluations import evaluate as do_evaluate

    _get(run_id)
    owner = cli_owner()
    record, message = do_evaluate(run_id, data, path, by=User(id=owner, name=owner), engine=_engine())
    if record is None:
        typer.secho(message, fg="red", err=True)
        raise typer.Exit(1)
    typer.echo(f"{record.id}: {message}")


def register(app: typer.Typer) -> None:
    for fn in (submit, status, watch, cancel, priority, runs, evaluate):
        app.command(fn.__name__)(fn)
