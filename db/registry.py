"""The model registry's queries: named models, their numbered versions, aliases and the audit of alias moves.

Who may register or move is decided by the caller (app/services/registry.py), inside the writing transaction:
`add_version` and `move_alias` hand the model's row, read under the model's lock (BEGIN IMMEDIATE on SQLite, FOR
UPDATE on Postgres), to a `check` that raises to refuse. So the owner that was checked is the owner at the moment of
the write, and two registrations of one model never take the same number (the number is max + 1 under that lock).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from sqlalchemy import Connection, Engine, func, insert, select, update
from sqlalchemy.dialects import postgresql, sqlite

from db.engine import connection_scope
from db.errors import RunNotFound
from db.models import Run
from db.registry_tables import ModelAlias, ModelAliasMove, ModelVersion, RegisteredModel
from db.types import ALIAS_LEN, DEFAULT_PROJECT, NAME_LEN, OWNER_LEN, json_safe, utcnow

MAX_MOVES_SHOWN = 1000


class ModelNotFound(LookupError):
    """No registered model has this name."""


class VersionNotFound(LookupError):
    """The model has no such version, or no such alias."""


@dataclass(frozen=True)
class ModelRecord:
    name: str
    owner: str
    created_at: datetime
    latest_version: int | None = None  # filled by list_models
    aliases: Mapping[str, int] | None = None  # filled by list_models: alias -> version
    project: str = DEFAULT_PROJECT


@dataclass(frozen=True)
class VersionRecord:
    model_name: str
    version: int
    run_id: str
    artifacts: tuple[Mapping[str, Any], ...]  # {kind, artifact_id, filename, sha256, size}
    lineage: Mapping[str, Any]
    created_by: str
    created_at: datetime


@dataclass(frozen=True)
class AliasMove:
    model_name: str
    alias: str
    from_version: int | None
    to_version: int
    moved_by: str
    moved_at: datetime


def _check_lengths(name: str, who: str, alias: str | None = None) -> None:
    if not 0 < len(name) <= NAME_LEN:
        raise ValueError(f"model name: 1 to {NAME_LEN} characters")
    if not 0 < len(who) <= OWNER_LEN:
        raise ValueError(f"user: 1 to {OWNER_LEN} characters")
    if alias is not None and not 0 < len(alias) <= ALIAS_LEN:
        raise ValueError(f"alias: 1 to {ALIAS_LEN} characters")


def _model(row: Any) -> ModelRecord:
    return ModelRecord(name=row.name, owner=row.owner, created_at=row.created_at, project=row.project)


def _locked_model(conn: Connection, name: str) -> ModelRecord | None:
    """The model's row, locked until the transaction ends (SQLite's writer already holds the whole database)."""
    row = conn.execute(select(RegisteredModel.__table__).where(RegisteredModel.name == name).with_for_update()).first()
    return None if row is None else _model(row)


def add_version(
    engine: Engine,
    name: str,
    *,
    run_id: str,
    artifacts: Sequence[Mapping[str, Any]],
    lineage: Mapping[str, Any],
    by: str,
    check: Callable[[ModelRecord | None], None],
) -> VersionRecord:
    """Register the next version of `name` (the model is created, owned by `by`, when it is new); `check` sees the
    locked model (None when new) and raises to refuse, before anything is written. RunNotFound when the run is gone
    (deleted before this transaction, or by one that held it first)."""
    _check_lengths(name, by)
    now = utcnow()
    with connection_scope(engine, write=True) as conn:
        # The run's row held against a delete until this version is written (db.runs.delete_run locks it FOR UPDATE
        # and refuses a run holding a version): a run deleted meanwhile is RunNotFound, never a version of nothing.
        # (SQLite: the writers' BEGIN IMMEDIATE takes turns already.)
        project = conn.execute(select(Run.project).where(Run.id == run_id).with_for_update(read=True)).scalar()
        if project is None:
            raise RunNotFound(run_id)
        model = _locked_model(conn, name)
        if model is None:
            # Two first registrations at once (Postgres; SQLite's writers take turns): the second waits on the
            # primary key, inserts nothing, and is then judged as a registration to the other's model.
            add = {"sqlite": sqlite.insert, "postgresql": postgresql.insert}[engine.dialect.name]
            new = {"name": name, "owner": by, "created_at": now, "project": project}
            conn.execute(add(RegisteredModel).values(**new).on_conflict_do_nothing())
            model = _locked_model(conn, name)
            model = None if model is not None and (model.owner, model.created_at) == (by, now) else model
        if model is not None and model.project != project:
            raise ValueError(
                f"model {name!r} is in project {model.project}, and run {run_id} in project {project}: a model's "
                "versions come from runs of its own project"
            )
        check(model)
        last = conn.execute(select(func.max(ModelVersion.version)).where(ModelVersion.model_name == name)).scalar()
        values = {
            "model_name": name,
            "version": (last or 0) + 1,
            "run_id": run_id,
            "artifacts": json_safe(list(artifacts)),
            "lineage": json_safe(dict(lineage)),
            "created_by": by,
            "created_at": now,
        }
        conn.execute(insert(ModelVersion).values(**values))
    return _version(values)


def move_alias(
    engine: Engine, name: str, alias: str, version: int, *, by: str, check: Callable[[ModelRecord], None]
) -> AliasMove:
    """Point `alias` of `name` at `version` and record the move; `check` sees the locked model and raises to refuse.
    ModelNotFound, VersionNotFound. Moving an alias to where it already points is recorded too (someone meant it)."""
    _check_lengths(name, by, alias)
    now = utcnow()
    with connection_scope(engine, write=True) as conn:
        model = _locked_model(conn, name)
        if model is None:
            raise ModelNotFound(name)
        check(model)
        known = select(ModelVersion.version).where(ModelVersion.model_name == name, ModelVersion.version == version)
        if conn.execute(known).first() is None:
            raise VersionNotFound(f"model {name!r} has no version {version}")
        where = (ModelAlias.model_name == name, ModelAlias.alias == alias)
        before = conn.execute(select(ModelAlias.version).where(*where)).scalar()
        if before is None:
            row = {"model_name": name, "alias": alias, "version": version, "updated_by": by, "updated_at": now}
            conn.execute(insert(ModelAlias).values(**row))
        else:
            conn.execute(update(ModelAlias).where(*where).values(version=version, updated_by=by, updated_at=now))
        move = {"model_name": name, "alias": alias, "from_version": before, "to_version": version}
        conn.execute(insert(ModelAliasMove).values(**move, moved_by=by, moved_at=now))
    return AliasMove(**move, moved_by=by, moved_at=now)


def get_model(engine: Engine, name: str) -> ModelRecord:
    with connection_scope(engine) as conn:
        row = conn.execute(select(RegisteredModel.__table__).where(RegisteredModel.name == name)).first()
    if row is None:
        raise ModelNotFound(name)
    return _model(row)


def list_models(engine: Engine, project: str | None = None) -> list[ModelRecord]:
    """Every model (of one project, or of all) by name, with its latest version number and its aliases (three
    queries, whatever the count)."""
    latest = select(ModelVersion.model_name, func.max(ModelVersion.version)).group_by(ModelVersion.model_name)
    models = select(RegisteredModel.__table__).order_by(RegisteredModel.name)
    if project is not None:
        models = models.where(RegisteredModel.project == project)
    with connection_scope(engine) as conn:
        rows = conn.execute(models).all()
        newest = {m: v for m, v in conn.execute(latest)}
        aliases: dict[str, dict[str, int]] = {}
        for m, a, v in conn.execute(select(ModelAlias.model_name, ModelAlias.alias, ModelAlias.version)):
            aliases.setdefault(m, {})[a] = v
    return [
        ModelRecord(
            r.name, r.owner, r.created_at, newest.get(r.name), dict(sorted(aliases.get(r.name, {}).items())), r.project
        )
        for r in rows
    ]


def _version(row: Any) -> VersionRecord:
    get = row.get if isinstance(row, Mapping) else row._mapping.get
    return VersionRecord(
        model_name=get("model_name"),
        version=get("version"),
        run_id=get("run_id"),
        artifacts=tuple(get("artifacts") or ()),
        lineage=dict(get("lineage") or {}),
        created_by=get("created_by"),
        created_at=get("created_at"),
    )


def list_versions(engine: Engine, name: str) -> list[VersionRecord]:
    """The model's versions, oldest first; ModelNotFound."""
    get_model(engine, name)
    query = select(ModelVersion.__table__).where(ModelVersion.model_name == name).order_by(ModelVersion.version)
    with connection_scope(engine) as conn:
        return [_version(r) for r in conn.execute(query)]


def get_version(engine: Engine, name: str, version: int) -> VersionRecord:
    query = select(ModelVersion.__table__).where(ModelVersion.model_name == name, ModelVersion.version == version)
    with connection_scope(engine) as conn:
        row = conn.execute(query).first()
    if row is None:
        get_model(engine, name)  # ModelNotFound first: the clearer message
        raise VersionNotFound(f"model {name!r} has no version {version}")
    return _version(row)


def aliases(engine: Engine, name: str) -> dict[str, int]:
    """alias -> version, by alias."""
    query = select(ModelAlias.alias, ModelAlias.version).where(ModelAlias.model_name == name).order_by(ModelAlias.alias)
    with connection_scope(engine) as conn:
        return {a: v for a, v in conn.execute(query)}


def resolve_alias(engine: Engine, name: str, alias: str) -> VersionRecord:
    """The version `alias` points at now (read in one query, so a concurrent move gives one or the other)."""
    query = (
        select(ModelVersion.__table__)
        .join(
            ModelAlias,
            (ModelAlias.model_name == ModelVersion.model_name) & (ModelAlias.version == ModelVersion.version),
        )
        .where(ModelAlias.model_name == name, ModelAlias.alias == alias)
    )
    with connection_scope(engine) as conn:
        row = conn.execute(query).first()
    if row is None:
        get_model(engine, name)
        raise VersionNotFound(f"model {name!r} has no alias {alias!r}")
    return _version(row)


def alias_moves(engine: Engine, name: str, limit: int = MAX_MOVES_SHOWN) -> list[AliasMove]:
    """The model's alias moves, newest first."""
    query = (
        select(ModelAliasMove.__table__)
        .where(ModelAliasMove.model_name == name)
        .order_by(ModelAliasMove.id.desc())
        .limit(limit)
    )
    with connection_scope(engine) as conn:
        return [
            AliasMove(r.model_name, r.alias, r.from_version, r.to_version, r.moved_by, r.moved_at)
            for r in conn.execute(query)
        ]
