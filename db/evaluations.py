"""Evaluations: a finished run's export scored on a registered dataset, one row each, never updated. Written by the
jobs worker that scored it (worker/evaluate_job.py), listed on the Run page and side by side on the Compare page."""

from __future__ import annotations

import secrets
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from sqlalchemy import JSON, Engine, ForeignKey, String, Text, select
from sqlalchemy.orm import Mapped, mapped_column

from db.engine import session_scope
from db.errors import RunNotFound
from db.models import Base, Run, UTCDateTime
from db.types import ID_LEN, NAME_LEN, OWNER_LEN, check_text, json_safe, utcnow

MAX_LISTED = 500  # evaluations listed per request: a page shows the newest, never an unbounded list


class Evaluation(Base):
    """A finished run's export scored on a registered dataset (the Run page's Evaluate): which file, on which data
    (its name, path and fingerprint at the time), the scores and the per-class details, when and by whom. Deleting
    the run deletes its evaluations."""

    __tablename__ = "evaluation"

    id: Mapped[str] = mapped_column(String(ID_LEN), primary_key=True)
    run_id: Mapped[str] = mapped_column(String(ID_LEN), ForeignKey("run.id", ondelete="CASCADE"), index=True)
    artifact_id: Mapped[str] = mapped_column(String(ID_LEN))
    dataset: Mapped[str] = mapped_column(String(NAME_LEN))
    dataset_path: Mapped[str | None] = mapped_column(Text)
    fingerprint: Mapped[str] = mapped_column(String(64))
    metrics: Mapped[dict[str, Any]] = mapped_column(JSON)
    # class_names, per class precision/recall/f1/support, confusion (or top_confusions), images, skipped
    details: Mapped[dict[str, Any]] = mapped_column(JSON)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime)
    created_by: Mapped[str] = mapped_column(String(OWNER_LEN))


@dataclass(frozen=True)
class EvaluationRecord:
    id: str
    run_id: str
    artifact_id: str
    dataset: str
    dataset_path: str | None
    fingerprint: str
    metrics: Mapping[str, Any]
    details: Mapping[str, Any]
    created_at: datetime
    created_by: str


def _record(row: Evaluation) -> EvaluationRecord:
    return EvaluationRecord(
        row.id,
        row.run_id,
        row.artifact_id,
        row.dataset,
        row.dataset_path,
        row.fingerprint,
        dict(row.metrics or {}),
        dict(row.details or {}),
        row.created_at,
        row.created_by,
    )


def add_evaluation(
    engine: Engine,
    run_id: str,
    artifact_id: str,
    *,
    dataset: str,
    dataset_path: str | None,
    fingerprint: str,
    metrics: Mapping[str, Any],
    details: Mapping[str, Any],
    created_by: str,
) -> EvaluationRecord:
    """Store one evaluation of the run (RunNotFound when it was deleted meanwhile); its id is random."""
    check_text("dataset", dataset, NAME_LEN)
    check_text("created_by", created_by, OWNER_LEN)
    row = Evaluation(
        id=secrets.token_hex(16),
        run_id=run_id,
        artifact_id=artifact_id,
        dataset=dataset,
        dataset_path=dataset_path,
        fingerprint=fingerprint[:64],
        metrics=json_safe(dict(metrics)),
        details=json_safe(dict(details)),
        created_at=utcnow(),
        created_by=created_by,
    )
    with session_scope(engine) as session:
        if session.get(Run, run_id) is None:
            raise RunNotFound(run_id)
        session.add(row)
        session.flush()
        return _record(row)


def list_evaluations(engine: Engine, run_ids: Sequence[str], limit: int = MAX_LISTED) -> list[EvaluationRecord]:
    """The evaluations of these runs, newest first (at most `limit`)."""
    if not run_ids:
        return []
    query = (
        select(Evaluation)
        .where(Evaluation.run_id.in_(list(run_ids)))
        .order_by(Evaluation.created_at.desc(), Evaluation.id)
        .limit(limit)
    )
    with session_scope(engine, write=False) as session:
        return [_record(r) for r in session.scalars(query)]


def get_evaluation(engine: Engine, evaluation_id: str) -> EvaluationRecord | None:
    with session_scope(engine, write=False) as session:
        row = session.get(Evaluation, evaluation_id)
        return _record(row) if row is not None else None
