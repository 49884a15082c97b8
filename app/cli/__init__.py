"""The `torchdeck` command line (the console script `torchdeck = app.cli:main`, and `python -m app.cli`): the
typer app, with `train`, `validate` and `export` here and the other commands in this package: runs.py (submit,
status, watch, cancel, runs), start.py (worker, up, ui), sweep.py, db.py, cache.py (the image cache), models.py
(the model registry), projects.py (projects and their members) and doctor.py (its worker checks in
doctor_workers.py). console.py is `train`'s progress bar; processes.py builds the command lines of the workers, the
private Redis and the dashboard. Commands that train, export or touch the image cache import `core` lazily, so
`torchdeck --help` and the database/queue commands start without torch."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import typer

from app.cli.alerts import alerts_app
from app.cli.cache import cache_app
from app.cli.db import db_app
from app.cli.doctor import doctor
from app.cli.models import models_app
from app.cli.projects import projects_app
from app.cli.runs import load_spec_or_exit as _load
from app.cli.runs import register as register_run_commands
from app.cli.start import register as register_start_commands
from app.cli.sweep import sweep as sweep_command
from core.names import CHECKPOINT_FILES, EXPORT_FORMATS, SUCCESS_STATUSES
from core.redact import redact_logs

app = typer.Typer(
    no_args_is_help=True, add_completion=False, help="torchdeck: train, watch, compare and export image classifiers."
)


@app.command()
def train(
    spec: Annotated[Path, typer.Argument(help="A run spec in YAML (see configs/).")],
    out: Annotated[Path, typer.Option("--out", help="Run folder: spec, metrics, checkpoints, exports.")] = Path(
        "runs/latest"
    ),
    overrides: Annotated[
        list[str], typer.Option("--set", help="Override a field: --set train.epochs=5 (repeatable).")
    ] = [],  # noqa: B006
    resume: Annotated[bool, typer.Option("--resume", help="Continue from OUT/checkpoints/last.pt.")] = False,
) -> None:
    """Train locally from a YAML spec, with a progress bar; no database, broker or UI needed."""
    run_spec = _load(spec, overrides)
    from app.cli.console import ConsoleSink
    from core.events import JsonlSink, MultiSink
    from core.train import run_training

    jsonl, console = JsonlSink(out), ConsoleSink()
    try:
        summary = run_training(run_spec, out, MultiSink(jsonl, console), resume=resume)
    except KeyboardInterrupt:
        console.close()
        typer.secho(f"\ninterrupted; resume with: torchdeck train {spec} --out {out} --resume", fg="yellow", err=True)
        raise typer.Exit(130) from None
    finally:
        jsonl.close()
        console.close()
    best = summary.get("best") or {}
    typer.echo(
        f"status: {summary['status']}  best {best.get('metric', '-')}: {best.get('value', float('nan')):.4f} "
        f"(epoch {best.get('epoch', '-')})  epochs: {summary['epochs_run']}  time: {summary['wall_time_s']:.1f}s"
    )
    typer.echo(f"outputs: {out}")
    if summary["status"] not in SUCCESS_STATUSES:
        raise typer.Exit(1)


@app.command()
def validate(
    spec: Annotated[Path, typer.Argument(help="A run spec in YAML.")],
    overrides: Annotated[list[str], typer.Option("--set", help="Override a field (repeatable).")] = [],  # noqa: B006
) -> None:
    """Check a spec without training; print the fully resolved spec."""
    typer.echo(_load(spec, overrides).to_yaml())


@app.command("export")
def export_cmd(
    run_dir: Annotated[Path, typer.Argument(help="A run folder written by `torchdeck train`.")],
    checkpoint: Annotated[str, typer.Option(help="best or last.")] = "best",
    formats: Annotated[str, typer.Option(help="Comma-separated: torchscript,onnx,pt2.")] = "torchscript,onnx,pt2",
) -> None:
    """Export a trained run and verify each format against the eager model."""
    fmts = [f.strip() for f in formats.split(",") if f.strip()]
    unknown = [f for f in fmts if f not in EXPORT_FORMATS]
    if unknown or checkpoint not in CHECKPOINT_FILES:
        typer.secho(
            f"unknown format(s) {unknown} (allowed: {', '.join(EXPORT_FORMATS)}) or checkpoint {checkpoint!r} "
            "(allowed: best, last)",
            fg="red",
            err=True,
        )
        raise typer.Exit(2)
    from core.train import export_run

    try:
        ok = export_run(run_dir, checkpoint, fmts)
    except FileNotFoundError as e:
        typer.secho(str(e), fg="red", err=True)
        raise typer.Exit(2) from None
    report = json.loads((run_dir / "export" / "export.json").read_text())
    for fmt in fmts:
        r = report["formats"].get(fmt, {})
        mark = "ok  " if ok.get(fmt) else "FAIL"
        typer.echo(
            f"{mark} {fmt:12s} max|Δ| {r.get('parity', {}).get('max_abs_diff', float('nan')):.2e}  "
            f"top-1 agreement {r.get('parity', {}).get('top1_agreement', float('nan')):.1f}%  "
            + (f"error: {r.get('error')}" if r.get("error") else "")
        )
    typer.echo(f"written: {run_dir / 'export'}")
    if not all(ok.values()):
        raise typer.Exit(1)


app.add_typer(db_app, name="db", help="Database schema: upgrade, current revision.")
app.add_typer(cache_app, name="cache", help="The image cache on this machine: list, remove, clear.")
app.add_typer(models_app, name="models", help="The model registry: list, show, register, alias, download.")
app.add_typer(alerts_app, name="alerts", help="Alert rules the workers evaluate: list, add, remove.")
app.add_typer(
    projects_app,
    name="projects",
    help="Projects and who is in them: list, create, show, member, remove-member, describe.",
)
register_run_commands(app)
register_start_commands(app)
app.command()(sweep_command)
app.command("doctor")(doctor)


def main() -> None:
    redact_logs()
    app(prog_name="torchdeck")
