"""`torchdeck models list|show|register|alias|download`: the model registry from a shell, through the same service
as the Models page (app/services/registry.py). A shell with the database's credentials is the operator's: the CLI
acts as an admin (local mode: the local user; team mode: `cli:<OS user>`, which owns the models it creates)."""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console
from rich.table import Table

models_app = typer.Typer(no_args_is_help=True, help="The model registry: named models, versions, aliases.")


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


def _fail(message: str, code: int = 2) -> typer.Exit:
    typer.secho(message, fg="red", err=True)
    return typer.Exit(code)


def _score(version, key: str = "val_acc_best") -> str:
    value = (version.lineage.get("scores") or {}).get(key)
    return f"{value:.4f}" if isinstance(value, (int, float)) else "-"


@models_app.command("list")
def list_cmd() -> None:
    """Every registered model: its latest version and its aliases."""
    from app.services import registry

    table = Table("name", "latest", "aliases", "owner", "created")
    for m in registry.list_models(_engine()):
        aliases = ", ".join(f"{a}→{v}" for a, v in (m.aliases or {}).items()) or "-"
        table.add_row(m.name, str(m.latest_version or "-"), aliases, m.owner, f"{m.created_at:%Y-%m-%d %H:%M}")
    Console().print(table)


@models_app.command()
def show(
    name: Annotated[str, typer.Argument(help="The model's name.")],
    as_json: Annotated[bool, typer.Option("--json", help="Everything, lineage included, as JSON.")] = False,
) -> None:
    """A model's versions (scores, run, files), aliases and alias moves."""
    from app.services import registry

    try:
        shown = registry.show(name, _engine())
    except (registry.ModelNotFound, registry.RegistryRefused) as e:
        raise _fail(f"no registered model {name!r}" if isinstance(e, registry.ModelNotFound) else str(e)) from None
    if as_json:
        typer.echo(json.dumps(_as_dict(shown), indent=2, default=str))
        return
    table = Table("version", "run", "best val acc", "test acc", "files", "registered by", "at")
    for v in shown["versions"]:
        test = (v.lineage.get("scores") or {}).get("test") or {}
        acc = test.get("test/acc")
        files = ", ".join(e["filename"] for e in v.artifacts)
        at = f"{v.created_at:%Y-%m-%d %H:%M}"
        table.add_row(
            str(v.version), v.run_id, _score(v), f"{acc:.4f}" if acc is not None else "-", files, v.created_by, at
        )
    Console().print(table)
    for alias, version in shown["aliases"].items():
        typer.echo(f"{alias} → {version}")
    for m in shown["moves"]:
        typer.echo(
            f"{m.moved_at:%Y-%m-%d %H:%M:%S} {m.moved_by}: {m.alias} {m.from_version or '(new)'} → {m.to_version}"
        )


def _as_dict(shown: dict) -> dict:
    from dataclasses import asdict

    return {
        "model": asdict(shown["model"]),
        "versions": [asdict(v) for v in shown["versions"]],
        "aliases": shown["aliases"],
        "moves": [asdict(m) for m in shown["moves"]],
    }


@models_app.command()
def register(
    run_id: Annotated[str, typer.Argument(help="A run that finished successfully, with a verified export.")],
    name: Annotated[str, typer.Argument(help="The model's name (created when new).")],
) -> None:
    """Register a finished run's verified exports as the next version of a model; prints the version."""
    from app import auth
    from app.services import registry

    try:
        v = registry.register(run_id, name, _operator(), _engine())
    except registry.RunNotFound:
        raise _fail(f"no run {run_id!r}") from None
    except (registry.RegistryRefused, auth.PermissionDenied) as e:
        raise _fail(str(e)) from None
    typer.echo(f"{v.model_name} version {v.version}: {', '.join(e['filename'] for e in v.artifacts)}")


@models_app.command()
def alias(
    name: Annotated[str, typer.Argument(help="The model's name.")],
    alias_name: Annotated[str, typer.Argument(metavar="ALIAS", help="production, staging, …")],
    version: Annotated[int, typer.Argument(help="The version it points at from now on.")],
) -> None:
    """Point an alias at a version (recorded in the model's alias moves)."""
    from app import auth
    from app.services import registry

    try:
        move = registry.set_alias(name, alias_name, version, _operator(), _engine())
    except (registry.ModelNotFound, registry.VersionNotFound) as e:
        raise _fail(f"no registered model {name!r}" if isinstance(e, registry.ModelNotFound) else str(e)) from None
    except (registry.RegistryRefused, auth.PermissionDenied) as e:
        raise _fail(str(e)) from None
    typer.echo(f"{name}@{move.alias}: {move.from_version or '(new)'} → {move.to_version}")


@models_app.command()
def download(
    ref: Annotated[str, typer.Argument(help="<name>@<alias> or <name>/<version>.")],
    filename: Annotated[str, typer.Argument(help="The version's file: model.onnx, model.ts, …")] = "model.onnx",
    out: Annotated[
        Path | None, typer.Option("--out", help="Where to write it (default: the file's name here).")
    ] = None,
) -> None:
    """Write one file of a version (the alias resolved now), checked against the SHA-256 the version recorded."""
    from app.services import registry

    name, at, alias_name = ref.partition("@")
    if not at:
        name, slash, alias_name = ref.partition("/")
        if not slash or not alias_name.isdigit():
            raise _fail(f"{ref!r}: name a version as <name>/<version> or an alias as <name>@<alias>")
    engine = _engine()
    try:
        version = registry.resolve(name, alias_name, engine)
        entry = registry.version_file(version, filename)
    except (registry.ModelNotFound, registry.VersionNotFound, registry.RegistryRefused) as e:
        raise _fail(f"no registered model {name!r}" if isinstance(e, registry.ModelNotFound) else str(e)) from None
    target = out or Path(entry["filename"])
    digest = _write_checked(entry, target, engine)
    typer.echo(f"{target}: {name} version {version.version}, sha256 {digest}")


def _write_checked(entry: dict, target: Path, engine) -> str:
    """The file streamed into `target` (through a temporary file beside it, renamed only once its SHA-256 is the one
    the version recorded); exit 1 otherwise, nothing left behind."""
    from app.services import artifacts
    from db.errors import ArtifactNotFound

    partial = target.with_name(f".{target.name}.part")
    h = hashlib.sha256()
    try:
        _, pieces = artifacts.artifact_pieces(entry["artifact_id"], engine)
        with open(partial, "wb") as f:
            for piece in pieces:
                h.update(piece)
                f.write(piece)
    except (ArtifactNotFound, artifacts.ArtifactUnavailable, OSError) as e:
        partial.unlink(missing_ok=True)
        raise _fail(f"{entry['filename']}: {e or 'its run was deleted'}", 1) from None
    if h.hexdigest() != entry.get("sha256"):
        partial.unlink(missing_ok=True)
        raise _fail(f"{entry['filename']}: sha256 {h.hexdigest()} ≠ {entry.get('sha256')} registered: not written", 1)
    os.replace(partial, target)
    return h.hexdigest()
