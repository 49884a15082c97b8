"""`torchdeck alerts list|add|remove`: alert rules from a shell, through the same service as the Workers page
(app/services/alerts.py). A shell with the database's credentials is the operator's: the CLI acts as an admin, as
`torchdeck models` does. The workers evaluate the rules and post what fires to TORCHDECK_WEBHOOK_URL."""

from __future__ import annotations

from typing import Annotated

import typer
from rich.console import Console
from rich.table import Table

KINDS_HELP = "metric, stalled, diverged, data_wait, worker_silent, queued or sweep_finished."
alerts_app = typer.Typer(no_args_is_help=True, help="Alert rules: list, add, remove.")


def _operator():
    from app import auth
    from app.cli.runs import cli_owner

    if not auth.team_mode():
        return auth.local_user()
    owner = cli_owner()
    return auth.User(id=owner, name=owner, is_admin=True)


def _engine():
    from app.cli.runs import _engine as checked_engine

    return checked_engine()


@alerts_app.command("list")
def list_cmd(
    run: Annotated[str | None, typer.Option(help="Only the global rules, its project's and this run's.")] = None,
    project: Annotated[str | None, typer.Option(help="Only the global rules and this project's.")] = None,
) -> None:
    """Every alert rule: its id, kind, what it watches and who made it."""
    from app.services import alerts

    table = Table("id", "kind", "rule", "by", "created")
    for r in alerts.list_rules(run, _engine(), project=project):
        table.add_row(r.id, r.kind, alerts.describe(r), r.created_by, f"{r.created_at:%Y-%m-%d %H:%M}")
    Console().print(table)


@alerts_app.command()
def add(
    kind: Annotated[str, typer.Argument(help=KINDS_HELP)],
    run: Annotated[str | None, typer.Option(help="Watch this run only (default: global).")] = None,
    project: Annotated[str | None, typer.Option(help="Watch this project's runs and sweeps (default: global).")] = None,
    key: Annotated[str | None, typer.Option(help="metric: the metric key, e.g. val/loss.")] = None,
    above: Annotated[float | None, typer.Option(help="metric: fire when the latest value is above this.")] = None,
    below: Annotated[float | None, typer.Option(help="metric: fire when the latest value is below this.")] = None,
    fraction: Annotated[float | None, typer.Option(help="data_wait: the fraction of step time, 0-1.")] = None,
    epochs: Annotated[int | None, typer.Option(help="stalled: epochs without improvement.")] = None,
    minutes: Annotated[float | None, typer.Option(help="stalled, data_wait, worker_silent, queued: minutes.")] = None,
    cooldown: Annotated[float, typer.Option(help="Minutes after a condition cleared before it may fire again.")] = 60.0,
) -> None:
    """Add a rule; prints its id."""
    from app.auth import PermissionDenied
    from app.services import alerts
    from db.errors import RunNotFound
    from db.projects import ProjectNotFound

    if above is not None and below is not None:
        raise typer.BadParameter("give --above or --below, not both")
    op = "above" if above is not None else "below" if below is not None else None
    threshold = above if above is not None else below if below is not None else fraction
    rule = alerts.RuleInput(kind, run, key, op, threshold, epochs, minutes, cooldown, project)
    try:
        made = alerts.add_rule(_operator(), rule, _engine())
    except (ValueError, PermissionDenied, RunNotFound, ProjectNotFound) as e:
        typer.secho(str(e) if not isinstance(e, RunNotFound) else f"no run {run}", fg="red", err=True)
        raise typer.Exit(2) from None
    typer.echo(f"{made.id}  {alerts.describe(made)}")


@alerts_app.command()
def remove(rule_id: Annotated[str, typer.Argument(help="The rule's id (see `torchdeck alerts list`).")]) -> None:
    """Remove a rule and its firings."""
    from app.services import alerts

    if not alerts.remove_rule(_operator(), rule_id, _engine()):
        typer.secho(f"no alert rule {rule_id}", fg="red", err=True)
        raise typer.Exit(1)
    typer.echo(f"removed {rule_id}")
