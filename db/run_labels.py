"""What people write on a run: its tags and its notes, each checked before anything is written, and both
replaced together in one transaction when edited together."""

from __future__ import annotations

from collections.abc import Iterable

from sqlalchemy import Engine, delete, update
from sqlalchemy.orm import Session

from db.engine import session_scope
from db.errors import RunNotFound
from db.models import Run, RunTag
from db.run_records import get_run, require_run
from db.types import NOTES_LEN, TAG_LEN, RunRecord, check_text


def check_tags(tags: Iterable[str]) -> list[str]:
    """Tags stripped and de-duplicated, in order; each non-empty and short enough."""
    out: list[str] = []
    for tag in tags:
        check_text("tag", tag, TAG_LEN)
        if tag.strip() not in out:
            out.append(tag.strip())
    return out


def set_tags(engine: Engine, run_id: str, tags: Iterable[str]) -> RunRecord:
    """Replace the run's tags."""
    tag_list = check_tags(tags)
    with session_scope(engine) as session:
        _write_tags(session, run_id, tag_list)
    return get_run(engine, run_id)


def _write_tags(session: Session, run_id: str, tag_list: list[str]) -> None:
    require_run(session, run_id)
    session.execute(delete(RunTag).where(RunTag.run_id == run_id))
    session.add_all(RunTag(run_id=run_id, tag=tag) for tag in tag_list)


def check_notes(notes: str | None) -> str | None:
    """Notes as stored: None for none (empty or blank), else the text as written, at most NOTES_LEN characters."""
    if len(notes or "") > NOTES_LEN:
        raise ValueError(f"notes are {len(notes):,} characters long; the limit is {NOTES_LEN:,}: shorten them")
    if "\0" in (notes or ""):
        raise ValueError("notes contain a NUL character (\\0), which the database cannot store: remove it")
    return notes if notes and notes.strip() else None


def set_notes(engine: Engine, run_id: str, notes: str | None) -> RunRecord:
    """Replace the run's notes (plain text; empty clears them)."""
    stored = check_notes(notes)
    with session_scope(engine) as session:
        _write_notes(session, run_id, stored)
    return get_run(engine, run_id)


def _write_notes(session: Session, run_id: str, stored: str | None) -> None:
    stmt = update(Run).where(Run.id == run_id).values(notes=stored).execution_options(synchronize_session=False)
    if session.execute(stmt).rowcount != 1:
        raise RunNotFound(run_id)


def set_tags_and_notes(engine: Engine, run_id: str, tags: Iterable[str], notes: str | None) -> RunRecord:
    """Replace the run's tags and its notes together: both checked before either is written, and written in one
    transaction (a refused or failed edit changes neither). ValueError for a bad tag or notes, RunNotFound."""
    tag_list, stored = check_tags(tags), check_notes(notes)
    with session_scope(engine) as session:
        _write_tags(session, run_id, tag_list)
        _write_notes(session, run_id, stored)
    return get_run(engine, run_id)
