"""`torchdeck sweep`: launch a sweep from a run spec and a search space, and follow it.

torchdeck sweep SPEC.yaml --space SPACE.yaml [--set k=v ...]   # prints the sweep id last
torchdeck sweep status SWEEP_ID [--json]
torchdeck sweep cancel SWEEP_ID
torchdeck sweep best SWEEP_ID [--launch [--seeds K]]
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import typer

from db.types import DEFAULT_PROJECT

ACTIONS = ("status", "cancel", "best")


def sweep(
    target: Annotated[
        str, typer.Argument(help="A run spec in YAML (the base of every trial), or status | cancel | best.")
    ],
    sweep_id: Annotated[str | None, typer.Argument(help="The sweep, for status, cancel and best.")] = None,
    space: Annotated[
        Path | None,
        typer.Option(
            "--space", help="The sweep in YAML: space, method, objective, budget, pruner, seeds (see docs/sweeps.md)."
        ),
    ] = None,
    overrides: Annotated[list[str], typer.Option("--set", help="Override a field of the base spec (repeatable).")] = [],  # noqa: B006
    name: Annotated[str | None, typer.Option("--name", help="The sweep's name (its runs are named after it).")] = None,
    owner: Annotated[str | None, typer.Option("--owner", help="Who the sweep and its runs belong to.")] = None,
    as_json: Annotated[bool, typer.Option("--json", help="status: machine-readable.")] = False,
    launch: Annotated[bool, typer.Option("--launch", help="best: launch the best configuration as a new run.")] = False,
    seeds: Annotated[int, typer.Option("--seeds", help="best --launch: as a group of this many seeds.")] = 1,
    priority: Annotated[
        str, typer.Option("--priority", help="low, normal or high: its trials' place in their queue.")
    ] = "normal",
    project: Annotated[
        str, typer.Option("--project", help="The project of the sweep and its trials (team mode: the owner's).")
    ] = DEFAULT_PROJECT,
) -> None:
    """Launch a sweep (many runs as one experiment, bad trials stopped early), or show, cancel or relaunch one."""
    if target in ACTIONS:
        if sweep_id is None:
            _fail(f"torchdeck sweep {target} needs a sweep id", 2)
        {"status": _status, "cancel": _cancel, "best": _best}[target](
            sweep_id, as_json=as_json, launch=launch, seeds=seeds, owner=owner
        )
        return
    _launch(Path(target), space, overrides, name, owner, priority, project)


def _fail(message: str, code: int = 1) -> None:
    typer.secho(message, fg="red", err=True)
    raise typer.Exit(code)


def load_sweep_or_exit(spec_path: Path, space_path: Path | None, overrides: list[str]):
    """The validated sweep of a run spec and a space file (or one sweep file with `base:` inside)."""
    from app.cli.runs import load_spec_or_exit
    from sweep.spec import SweepSpec, SweepSpecError

    try:
        if space_path is None:
            return SweepSpec.from_yaml(_read(spec_path), overrides=overrides)
        base = load_spec_or_exit(spec_path, overrides)
        return SweepSpec.from_yaml(_read(space_path), base=base)
    except SweepSpecError as e:
        _fail(str(e), 2)


def _read(path: Path) -> str:
    if not path.is_file():
        _fail(f"{path}: file not found", 2)
    return path.read_text()


def _launch(
    spec_path: Path,
    space_path: Path | None,
    overrides: list[str],
    name: str | None,
    owner: str | None,
    priority: str,
    project: str,
) -> None:
    from app.auth import local_user
    from app.cli.projects import refused
    from app.cli.runs import _engine, _say_who_serves, cli_owner
    from app.services.broker import run_queue
    from app.services.sweeps import estimate, submit_sweep

    spec = load_sweep_or_exit(spec_path, space_path, overrides)
    engine = _engine()
    typer.echo(estimate(spec, engine).describe(spec.pruner.kind))
    with refused(RuntimeError):  # RuntimeError: the broker is unreachable
        sweep = submit_sweep(
            spec,
            owner=owner or cli_owner(),
            name=name,
            engine=engine,
            priority=priority,
            by=local_user(),
            project=project,
        )
    typer.echo(
        f"sweep '{sweep.name}' in project {sweep.project}: {spec.method}, {spec.trials} trials, "
        f"{spec.budget.parallel} at once, pruner {spec.pruner.kind}, objective {spec.metric} ({spec.mode})"
    )
    _say_who_serves(run_queue(spec.base))
    typer.echo(sweep.id)


def _view(sweep_id: str):
    from app.cli.runs import _engine
    from app.services.sweeps import view
    from db.repo import SweepNotFound

    try:
        return view(sweep_id, _engine())
    except SweepNotFound:
        _fail(f"no sweep {sweep_id!r}", 2)


def _status(sweep_id: str, *, as_json: bool, **_: object) -> None:
    v = _view(sweep_id)
    best = v.best
    data = {
        "id": v.sweep.id,
        "name": v.sweep.name,
        "status": v.sweep.status,
        "method": v.spec.method,
        "objective": {"metric": v.spec.metric, "mode": v.spec.mode},
        "trials": {"budget": v.spec.trials, **v.counts()},
        "epochs_used": v.epochs_used,
        "epochs_max": v.spec.max_epochs(),
        "best": None
        if best is None
        else {
            "trial": best.number,
            "value": best.value,
            "std": best.std,
            "n": best.n,
            "params": best.params,
            "runs": best.run_ids,
        },
    }
    if as_json:
        typer.echo(json.dumps(data, indent=2))
        return
    counts = ", ".join(f"{n} {s}" for s, n in sorted(v.counts().items())) or "no trial yet"
    typer.echo(
        f"{v.sweep.id}  {v.sweep.status}  {v.spec.method}  {len(v.outcomes)}/{v.spec.trials} trials ({counts})  "
        f"epochs {v.epochs_used}/{v.spec.max_epochs()}"
    )
    typer.echo(f"best: {_describe_best(v)}")


def _describe_best(v) -> str:
    b = v.best
    if b is None:
        return "none yet"
    spread = f" ± {b.std:.4f} (n={b.n})" if b.std is not None else ""
    params = ", ".join(f"{k}={val}" for k, val in b.params.items())
    return f"trial {b.number}: {v.spec.metric} {b.value:.4f}{spread} with {params}"


def _cancel(sweep_id: str, **_: object) -> None:
    from app.auth import local_user
    from app.cli.runs import _engine
    from app.services.sweeps import cancel_sweep
    from db.repo import SweepNotFound

    try:
        sweep = cancel_sweep(sweep_id, by=local_user(), engine=_engine())  # the operator's shell
    except SweepNotFound:
        _fail(f"no sweep {sweep_id!r}", 2)
    typer.echo(f"{sweep.id} {sweep.status}: its queued runs are cancelled, its running ones stop between steps")


def _best(sweep_id: str, *, launch: bool, seeds: int, owner: str | None, **_: object) -> None:
    v = _view(sweep_id)
    typer.echo(f"best: {_describe_best(v)}")
    if not launch:
        return
    if v.best is None:
        _fail("nothing to launch: no trial has completed yet")
    from app.cli.runs import _engine, cli_owner
    from app.services.sweeps import launch_best

    try:  # refused like any new run: a path it may not read, the owner's queued-runs limit
        runs = launch_best(sweep_id, owner=owner or cli_owner(), seeds=seeds, engine=_engine())
    except (RuntimeError, ValueError) as e:
        _fail(str(e))
    for run in runs:
        typer.echo(run.id)
