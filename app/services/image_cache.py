"""The image cache on this machine (core/image_cache.py): the decoded image folders that the runs of this machine's
workers keep under `$TORCHDECK_IMAGE_CACHE` (default `image-cache/` in `$TORCHDECK_HOME`), as the Datasets page and
`torchdeck cache` show and remove them.

In local mode the dashboard, the CLI and the local workers share one machine and one `$TORCHDECK_HOME`, so this is
the workers' cache; in team mode a worker on another machine keeps its own, which this does not see. Anyone may
list the entries; removing one (or all) is an admin's (`TORCHDECK_ADMINS`) in team mode, enforced here: an entry is
shared by every member's runs, and its removal makes the next run on that data decode it all again.
"""

from __future__ import annotations

from pathlib import Path

from app.auth import ADMINS_ENV, PermissionDenied, User, team_mode
from core import image_cache
from core.image_cache import CacheEntry

ENV = image_cache.CACHE_ENV  # `off` turns the cache off; else its folder


def root() -> Path | None:
    """The cache's folder on this machine; None when it is off (`TORCHDECK_IMAGE_CACHE=off`)."""
    return image_cache.cache_root()


def entries() -> list[CacheEntry]:
    """The finished entries, the most recently used first (none when the cache is off or not made yet)."""
    return image_cache.list_entries()


def total_bytes(found: list[CacheEntry]) -> int:
    return sum(e.bytes for e in found)


def can_remove(user: User | None) -> bool:
    """Local mode: the person at this machine. Team mode: an admin only."""
    return user is not None and (user.is_admin or not team_mode())


def check_can_remove(user: User | None) -> None:
    if not can_remove(user):
        who = user.describe() if user else "an anonymous user"
        raise PermissionDenied(
            f"{who} may not remove image cache entries: every member's runs share them, so only an admin "
            f"({ADMINS_ENV}) may remove them"
        )


def remove(key: str, *, by: User | None) -> int:
    """Remove one entry; the bytes freed. PermissionDenied unless `by` may; KeyError when no entry has that key
    (already removed, or replaced by a run on changed data)."""
    check_can_remove(by)
    return image_cache.remove_entry(key)


def clear(*, by: User | None) -> int:
    """Remove every entry; the bytes freed. PermissionDenied unless `by` may."""
    check_can_remove(by)
    return image_cache.clear()
