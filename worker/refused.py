"""Writing a batch of which the store may refuse some items: each refused item is dropped alone and
reported, the rest of its batch is written. One bad point never holds back the others, and never makes
the sink put the whole batch back forever."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TypeVar

from sqlalchemy.exc import DataError, IntegrityError

# What the store refuses because of the data itself (not because it is away): dropped, never retried.
REFUSED = (ValueError, DataError, IntegrityError)
T = TypeVar("T")


def store_each(
    items: Sequence[T],
    write: Callable[[Sequence[T]], None],
    problem: Callable[[T], str | None],
    refused: Callable[[T, str], None],
) -> None:
    """write(items); when the store refuses the batch, the items `problem` names (the cheap checks, which say
    why) are refused, and what the database itself refuses is found by halving the rest."""
    try:
        write(items)
        return
    except REFUSED:
        pass
    good = []
    for item in items:
        why = problem(item)
        if why:
            refused(item, why)
        else:
            good.append(item)
    _halves(good, write, refused)


def _halves(items: Sequence[T], write: Callable[[Sequence[T]], None], refused: Callable[[T, str], None]) -> None:
    if not items:
        return
    try:
        write(items)
    except REFUSED as e:
        if len(items) == 1:
            refused(items[0], f"{e.__class__.__name__}: {str(e).splitlines()[0][:300]}")
            return
        mid = len(items) // 2
        _halves(items[:mid], write, refused)
        _halves(items[mid:], write, refused)
