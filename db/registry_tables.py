"""The model registry's tables (db/registry.py holds their queries): named models, their numbered versions, their
aliases and every move of an alias."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from sqlalchemy import JSON, BigInteger, ForeignKey, ForeignKeyConstraint, Index, Integer, String
from sqlalchemy.orm import Mapped, mapped_column

from db.models import Base, UTCDateTime, _project_column
from db.types import ALIAS_LEN, ID_LEN, NAME_LEN, OWNER_LEN


class RegisteredModel(Base):
    """A named model of the registry: numbered versions (model_version) and movable aliases (model_alias). Its
    owner (who created it) or an admin registers versions and moves aliases (app/services/registry.py)."""

    __tablename__ = "registered_model"

    name: Mapped[str] = mapped_column(String(NAME_LEN), primary_key=True)
    owner: Mapped[str] = mapped_column(String(OWNER_LEN), index=True)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime)
    project: Mapped[str] = _project_column()


class ModelVersion(Base):
    """A version of a registered model: a finished run's verified export set, copied here at registration with
    what it came from. No foreign key to the run: the lineage is a record of the moment of registration, and a
    version still says where it came from if its run's rows go some other way than a delete of the run (which is
    refused while a version holds its files: db.runs.delete_run)."""

    __tablename__ = "model_version"

    model_name: Mapped[str] = mapped_column(
        String(NAME_LEN), ForeignKey("registered_model.name", ondelete="CASCADE"), primary_key=True
    )
    version: Mapped[int] = mapped_column(Integer, primary_key=True)
    run_id: Mapped[str] = mapped_column(String(ID_LEN), index=True)
    # [{kind, artifact_id, filename, sha256, size}]: the verified exports (and their report and bundle).
    artifacts: Mapped[list[dict[str, Any]]] = mapped_column(JSON)
    # spec, dataset, dataset_fingerprint, torchdeck_version, git_commit, scores: see db/registry.py.
    lineage: Mapped[dict[str, Any]] = mapped_column(JSON)
    created_by: Mapped[str] = mapped_column(String(OWNER_LEN))
    created_at: Mapped[datetime] = mapped_column(UTCDateTime)


class ModelAlias(Base):
    """Where an alias of a model points now (`production` → 3); its moves are in model_alias_move."""

    __tablename__ = "model_alias"
    __table_args__ = (
        ForeignKeyConstraint(
            ["model_name", "version"], ["model_version.model_name", "model_version.version"], ondelete="CASCADE"
        ),
    )

    model_name: Mapped[str] = mapped_column(String(NAME_LEN), primary_key=True)
    alias: Mapped[str] = mapped_column(String(ALIAS_LEN), primary_key=True)
    version: Mapped[int] = mapped_column(Integer)
    updated_by: Mapped[str] = mapped_column(String(OWNER_LEN))
    updated_at: Mapped[datetime] = mapped_column(UTCDateTime)


class ModelAliasMove(Base):
    """The audit of alias moves, one row per move, never updated: who, when, which alias, from which version (NULL
    when the alias was new) to which."""

    __tablename__ = "model_alias_move"
    __table_args__ = (Index("ix_model_alias_move_model_name_id", "model_name", "id"),)

    id: Mapped[int] = mapped_column(BigInteger().with_variant(Integer, "sqlite"), primary_key=True, autoincrement=True)
    model_name: Mapped[str] = mapped_column(String(NAME_LEN), ForeignKey("registered_model.name", ondelete="CASCADE"))
    alias: Mapped[str] = mapped_column(String(ALIAS_LEN))
    from_version: Mapped[int | None] = mapped_column(Integer)
    to_version: Mapped[int] = mapped_column(Integer)
    moved_by: Mapped[str] = mapped_column(String(OWNER_LEN))
    moved_at: Mapped[datetime] = mapped_column(UTCDateTime)
