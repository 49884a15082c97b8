"""`torchdeck projects list|create|show|member|remove-member|describe`: projects and their members from a shell, through
the same service as the dashboard (app/services/projects.py). A shell with the database's credentials is the
operator's: the CLI acts as an admin (local mode: the local user; team mode: `cli:<OS user>`), as `torchdeck models`
does. An admin needs no place in a project, so a project the CLI creates has no maintainer unless --maintainer names
one."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Annotated

import typer
from rich.console import Console
from rich.table import Table

from app.cli.models import _operator

projects_app = typer.Typer(no_args_is_help=True, help="Projects: who sees and launches which runs.")
ROLES_HELP = "viewer (sees), member (also launches runs) or maintainer (also acts on anyone's, manages members)."


def _engine():
    from app.cli.runs import _engine as checked_engine

    return checked_engine()


def refusal_text(e: Exception) -> str:
    """What to print for a refusal of the services: its message, and for an unknown project where to find them."""
    from db.projects import ProjectNotFound

    if isinstance(e, ProjectNotFound):
        return f"{e}: `torchdeck projects list` shows the projects, `torchdeck projects create` makes one"
    return str(e)


@contextmanager
def refused(*also: type[Exception]) -> Iterator[None]:
    """An unknown project, a right the acting user lacks, a value that is not one (a role, a name), or one of `also`:
    the message in red, exit 1. (`torchdeck submit` and `torchdeck sweep` refuse through it too.)"""
    from app.auth import PermissionDenied
    from db.projects import ProjectNotFound

    try:
        yield
    except (ProjectNotFound, PermissionDenied, ValueError, *also) as e:
        typer.secho(refusal_text(e), fg="red", err=True)
        raise typer.Exit(1) from None


@projects_app.command("list")
def list_cmd() -> None:
    """Every project: who sees it unlisted, its description, its runs (and of them queued and running)."""
    from app.services import projects

    engine = _engine()
    found = projects.readable(_operator(), engine)
    counts = projects.counts([p.name for p in found], engine)
    table = Table("name", "open to all as", "description", "runs", "queued", "running")
    for p in found:
        n = counts[p.name]
        numbers = (str(n[k]) for k in ("runs", "queued", "running"))
        table.add_row(p.name, p.open_role or "- (listed people only)", p.description, *numbers)
    Console().print(table)
    typer.echo(f"{len(found)} project(s)")


@projects_app.command()
def create(
    name: Annotated[str, typer.Argument(help="Lower-case letters, digits and dashes (part of the pages' addresses).")],
    description: Annotated[str, typer.Option("--description", help="What the project is for.")] = "",
    open_role: Annotated[
        str | None,
        typer.Option(
            "--open-role",
            help="viewer, member or maintainer: the role every member of the dashboard has in it unlisted (default: "
            "none, its listed people only).",
        ),
    ] = None,
    maintainer: Annotated[
        str | None, typer.Option("--maintainer", help="A person's account key (<issuer>#<subject>) or verified e-mail.")
    ] = None,
) -> None:
    """Make a project; its maintainer (--maintainer) manages its members from the dashboard or from here."""
    from app.services import projects
    from db.projects import check_role, create_project

    operator, engine = _operator(), _engine()
    open_role = None if open_role is None or open_role.strip().lower() == "none" else open_role
    with refused():
        check_role(open_role, field="--open-role", none_ok=True)
        if maintainer is not None and not maintainer.strip():
            raise ValueError("--maintainer: give a person's account key (<issuer>#<subject>) or verified e-mail")
        made = create_project(
            engine, name, by=operator.id, description=description, open_role=open_role, maintainer=False
        )
        if maintainer is not None:
            projects.set_member(name, maintainer, "maintainer", by=operator, engine=engine)
    seen_by = f"every member as {made.open_role}" if made.open_role else "its listed people only"
    typer.echo(f"project {made.name}: seen by {seen_by} (and admins)")
    if maintainer is not None:
        typer.echo(f"{maintainer.strip()}: maintainer")
    else:
        typer.echo(f"add its people with `torchdeck projects member {made.name} PERSON ROLE`")


@projects_app.command()
def show(name: Annotated[str, typer.Argument(help="The project.")]) -> None:
    """A project: its description, who sees it unlisted, its counts, and its members with their roles."""
    from app.auth import ROLE_RANK
    from app.services import projects

    operator, engine = _operator(), _engine()
    with refused():
        project = projects.get(name, by=operator, engine=engine)
        listed = projects.members(name, by=operator, engine=engine)
    n = projects.counts([name], engine)[name]
    typer.echo(f"{project.name}: {project.description or '(no description)'}")
    open_to = f"every member of the dashboard as {project.open_role}" if project.open_role else "listed people only"
    typer.echo(f"open to: {open_to}")
    typer.echo(f"created {project.created_at:%Y-%m-%d %H:%M} by {project.created_by}")
    typer.echo(
        f"{n['runs']} run(s) ({n['queued']} queued, {n['running']} running), {n['sweeps']} sweep(s), "
        f"{n['datasets']} dataset(s)"
    )
    table = Table("person", "role", "added by", "added")
    for m in sorted(listed, key=lambda m: (-ROLE_RANK[m.role], m.person)):  # maintainers first
        table.add_row(m.person, m.role, m.added_by, f"{m.added_at:%Y-%m-%d %H:%M}")
    Console().print(table)
    typer.echo(f"{len(listed)} member(s)")


@projects_app.command()
def member(
    name: Annotated[str, typer.Argument(help="The project.")],
    person: Annotated[str, typer.Argument(help="An account key (<issuer>#<subject>) or a verified e-mail.")],
    role: Annotated[str, typer.Argument(help=ROLES_HELP)],
) -> None:
    """List a person in a project with a role, or change their role."""
    from app.services import projects

    with refused():
        listed = projects.set_member(name, person, role, by=_operator(), engine=_engine())
    typer.echo(f"{listed.person}: {listed.role} of project {listed.project}")


@projects_app.command("remove-member")
def remove_member(
    name: Annotated[str, typer.Argument(help="The project.")],
    person: Annotated[str, typer.Argument(help="The account key or e-mail they are listed by.")],
) -> None:
    """Take a person off a project's list. What they own stays in the project; from then on only its maintainers
    and admins act on it."""
    from app.services import projects

    with refused():
        removed = projects.remove_member(name, person, by=_operator(), engine=_engine())
    if not removed:
        typer.secho(
            f"{person} is not listed in project {name}: `torchdeck projects show {name}` lists its members "
            "as they are listed (an account key or an e-mail)",
            fg="red",
            err=True,
        )
        raise typer.Exit(1)
    typer.echo(f"{person}: no longer listed in project {name}")


@projects_app.command()
def describe(
    name: Annotated[str, typer.Argument(help="The project.")],
    description: Annotated[str, typer.Argument(help="What the project is for (replaces the one it has).")],
) -> None:
    """Change a project's description."""
    from app.services import projects

    with refused():
        project = projects.update(name, by=_operator(), description=description, engine=_engine())
    typer.echo(f"{project.name}: {project.description}")
