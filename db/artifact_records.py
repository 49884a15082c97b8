"""A run's files as the database knows them (artifacts): registered by URI with their size and SHA-256 under an
opaque random id, listed per run, read back by id."""

from __future__ import annotations

import secrets
from collections.abc import Mapping
from typing import Any

from sqlalchemy import Engine, select

from db.engine import session_scope
from db.errors import ArtifactNotFound, RunNotFound
from db.models import Artifact, Run
from db.records import get_row
from db.types import ArtifactRecord, json_safe, utcnow


def add_artifact(
    engine: Engine,
    run_id: str,
    kind: str,
    uri: str,
    *,
    size: int | None = None,
    sha256: str | None = None,
    meta: Mapping[str, Any] | None = None,
) -> ArtifactRecord:
    """Register a file of a run (checkpoint, export...) by URI; returns it with its opaque id."""
    artifact = artifact_row(run_id, kind, uri, size=size, sha256=sha256, meta=meta)
    with session_scope(engine) as session:
        if session.get(Run, run_id) is None:
            raise RunNotFound(run_id)
        session.add(artifact)
    return artifact_record(artifact)


def artifact_row(
    run_id: str,
    kind: str,
    uri: str,
    *,
    size: int | None = None,
    sha256: str | None = None,
    meta: Mapping[str, Any] | None = None,
) -> Artifact:
    """A new artifact's row, checked, not yet added (ValueError for a bad kind, URI or hash)."""
    if not kind or len(kind) > 32:
        raise ValueError(f"artifact kind {kind!r}: 1 to 32 characters")
    if not uri:
        raise ValueError("artifact uri must not be empty")
    if sha256 is not None and len(sha256) != 64:
        raise ValueError(f"sha256 must be 64 hex characters, got {sha256!r}")
    # Random, so that an artifact URL reveals nothing and cannot be guessed.
    return Artifact(
        id=secrets.token_hex(16),
        run_id=run_id,
        kind=kind,
        uri=uri,
        size=size,
        sha256=sha256,
        meta=json_safe(meta or {}),
        created_at=utcnow(),
    )


def get_artifact(engine: Engine, artifact_id: str) -> ArtifactRecord:
    return get_row(engine, Artifact, artifact_id, ArtifactNotFound, artifact_record)


def list_artifacts(engine: Engine, run_id: str, kind: str | None = None) -> list[ArtifactRecord]:
    query = select(Artifact).where(Artifact.run_id == run_id)
    if kind is not None:
        query = query.where(Artifact.kind == kind)
    with session_scope(engine, write=False) as session:
        if session.get(Run, run_id) is None:
            raise RunNotFound(run_id)
        found = session.execute(query.order_by(Artifact.created_at, Artifact.id)).scalars()
        return [artifact_record(a) for a in found]


def artifact_record(a: Artifact) -> ArtifactRecord:
    """The record of an artifact's row."""
    return ArtifactRecord(
        id=a.id,
        run_id=a.run_id,
        kind=a.kind,
        uri=a.uri,
        size=a.size,
        sha256=a.sha256,
        meta=a.meta or {},
        created_at=a.created_at,
    )
