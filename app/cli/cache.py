"""`torchdeck cache ...`: the image cache on this machine (core/image_cache.py, through app/services/image_cache.py):
list its entries, remove one, clear it. The CLI acts as the operator at this machine (app.auth.local_user), who may
remove entries; a removed entry is decoded again by the next run that needs it."""

from __future__ import annotations

from datetime import datetime
from typing import Annotated

import typer

cache_app = typer.Typer(help="The image cache on this machine: list, remove, clear.", no_args_is_help=True)


def _mb(n: int) -> str:
    return f"{n / 2**20:,.2f} MB"


def _service():
    """app/services/image_cache.py, imported when a command runs (as `train` imports core): `--help` stays quick."""
    from app.services import image_cache

    return image_cache


def _root_or_exit(cache, code: int = 0):
    """The cache's folder; when the cache is off, says so and exits with `code`."""
    root = cache.root()
    if root is None:
        typer.secho(
            f"the image cache is off on this machine ({cache.ENV}=off)", fg="red" if code else None, err=bool(code)
        )
        raise typer.Exit(code)
    return root


@cache_app.command("list")
def list_command() -> None:
    """The entries, the most recently used first (one line each, with its key), and their total size."""
    cache = _service()
    root = _root_or_exit(cache)
    entries = cache.entries()
    if not entries:
        typer.echo(f"the image cache at {root} is empty")
        return
    typer.echo(f"{'key':24}  {'size':>11}  {'part':5}  {'image':11}  {'images':>7}  {'last used':16}  dataset")
    for e in entries:  # one line each, the path last: nothing is cut, however narrow the terminal
        used = datetime.fromtimestamp(e.last_used).strftime("%Y-%m-%d %H:%M")
        image = f"{e.mode} {e.side} px"
        typer.echo(f"{e.key:24}  {_mb(e.bytes):>11}  {e.part:5}  {image:11}  {e.images:>7,}  {used:16}  {e.source}")
    typer.echo(f"{len(entries)} entr{'y' if len(entries) == 1 else 'ies'}, {_mb(cache.total_bytes(entries))} at {root}")


@cache_app.command("remove")
def remove_command(
    key: Annotated[str, typer.Argument(help="The entry's key, as `torchdeck cache list` shows it.")],
) -> None:
    """Remove one entry; a run reading it keeps its open file until it ends."""
    from app.auth import local_user

    cache = _service()
    root = _root_or_exit(cache, code=1)
    try:
        freed = cache.remove(key, by=local_user())
    except KeyError:
        typer.secho(
            f"no image cache entry {key!r} at {root} (`torchdeck cache list` shows the keys)", fg="red", err=True
        )
        raise typer.Exit(1) from None
    typer.echo(f"removed {key}: freed {_mb(freed)}")


@cache_app.command("clear")
def clear_command() -> None:
    """Remove every entry; the next run on each dataset decodes its images again."""
    from app.auth import local_user

    cache = _service()
    root = _root_or_exit(cache)
    count = len(cache.entries())
    freed = cache.clear(by=local_user())
    typer.echo(f"removed {count} entr{'y' if count == 1 else 'ies'}: freed {_mb(freed)} at {root}")
