"""`torchdeck db ...`: create or upgrade the database schema, show its revision."""

from __future__ import annotations

from typing import Annotated

import typer

from db.engine import database_url, normalize_url
from db.migrate import current_revision, head_revision, upgrade

db_app = typer.Typer(help="Manage the torchdeck database schema.", no_args_is_help=True)

UrlOption = Annotated[
    str | None,
    typer.Option("--url", help="Database URL (default: $TORCHDECK_DATABASE_URL or the SQLite file)."),
]


def _shown(url: str) -> str:
    from sqlalchemy.engine import make_url

    return make_url(normalize_url(url)).render_as_string(hide_password=True)


@db_app.command("upgrade")
def upgrade_command(url: UrlOption = None) -> None:
    """Create the tables or migrate them to this version's schema."""
    target = url or database_url()
    before = current_revision(target)
    reached = upgrade(target)
    if before == reached:
        typer.echo(f"{_shown(target)}: already at revision {reached}")
    else:
        typer.echo(f"{_shown(target)}: upgraded from {before or 'empty'} to revision {reached}")


@db_app.command("current")
def current_command(url: UrlOption = None) -> None:
    """Show the database's schema revision; exit 1 when it needs an upgrade."""
    target = url or database_url()
    current, head = current_revision(target), head_revision()
    typer.echo(f"{_shown(target)}: revision {current or 'empty'} (this version needs {head})")
    if current != head:
        typer.echo("out of date: run `torchdeck db upgrade`", err=True)
        raise typer.Exit(code=1)
