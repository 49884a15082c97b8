"""Projects and who belongs to them: the rows behind app/auth.py's rules (which say what a role may do).

A project's name is part of every page's URL, so it is a slug: lower-case letters, digits and dashes."""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import datetime

from sqlalchemy import CheckConstraint, Engine, ForeignKey, String, Text, delete, func, select, update
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Mapped, mapped_column

from db.engine import connection_scope, session_scope
from db.models import Base, Dataset, Run, Sweep, UTCDateTime, _in
from db.types import OWNER_LEN, PROJECT_LEN, PROJECT_ROLES, utcnow

NAME_RE = re.compile(r"[a-z0-9](?:[a-z0-9-]*[a-z0-9])?")
DESCRIPTION_LEN = 2_000


class Project(Base):
    """A line of work: its runs, sweeps, datasets and models, and who may see and act on them (project_member).
    `open_role` is the role every member of the dashboard has in it without being listed (NULL: only who is
    listed, and admins); the default project is open to every member as `member`, as the dashboard was before."""

    __tablename__ = "project"
    __table_args__ = (CheckConstraint(f"open_role IS NULL OR open_role IN ({_in(PROJECT_ROLES)})", name="open_role"),)

    name: Mapped[str] = mapped_column(String(PROJECT_LEN), primary_key=True)
    description: Mapped[str] = mapped_column(Text, default="", server_default="")
    open_role: Mapped[str | None] = mapped_column(String(16))
    created_at: Mapped[datetime] = mapped_column(UTCDateTime)
    created_by: Mapped[str] = mapped_column(String(OWNER_LEN))


class ProjectMember(Base):
    """A person's role in a project: viewer (sees), member (runs, acts on their own), maintainer (acts on
    anyone's, manages membership). Deleting the project deletes its members."""

    __tablename__ = "project_member"
    __table_args__ = (CheckConstraint(f"role IN ({_in(PROJECT_ROLES)})", name="role"),)

    project: Mapped[str] = mapped_column(
        String(PROJECT_LEN), ForeignKey("project.name", ondelete="CASCADE"), primary_key=True
    )
    person: Mapped[str] = mapped_column(String(OWNER_LEN), primary_key=True, index=True)
    role: Mapped[str] = mapped_column(String(16))
    added_at: Mapped[datetime] = mapped_column(UTCDateTime)
    added_by: Mapped[str] = mapped_column(String(OWNER_LEN))


class ProjectNotFound(LookupError):
    def __init__(self, name: str) -> None:
        super().__init__(f"project {name!r} not found")
        self.name = name


@dataclass(frozen=True)
class ProjectRecord:
    name: str
    description: str
    open_role: str | None  # the role every member of the dashboard has in it unlisted; None: listed people only
    created_at: datetime
    created_by: str


@dataclass(frozen=True)
class MemberRecord:
    project: str
    person: str
    role: str
    added_at: datetime
    added_by: str


def check_name(name: str) -> str:
    """The name as stored, or ValueError saying what a project's name may be."""
    if not isinstance(name, str) or not 1 <= len(name) <= PROJECT_LEN or not NAME_RE.fullmatch(name):
        raise ValueError(
            f"project name {name!r}: 1 to {PROJECT_LEN} lower-case letters, digits and dashes, starting and ending "
            "with a letter or digit (it is part of the pages' addresses)"
        )
    return name


def check_role(role: str | None, *, field: str = "role", none_ok: bool = False) -> str | None:
    if role is None and none_ok:
        return None
    if role not in PROJECT_ROLES:
        raise ValueError(f"{field} {role!r}: use one of {', '.join(PROJECT_ROLES)}{' or none' if none_ok else ''}")
    return role


def _check_description(description: str) -> str:
    if len(description) > DESCRIPTION_LEN:
        raise ValueError(f"project description: at most {DESCRIPTION_LEN} characters, got {len(description)}")
    return description


def _record(row) -> ProjectRecord:
    return ProjectRecord(row.name, row.description or "", row.open_role, row.created_at, row.created_by)


def create_project(
    engine: Engine, name: str, *, by: str, description: str = "", open_role: str | None = None, maintainer: bool = True
) -> ProjectRecord:
    """A new project; `by` becomes its maintainer (unless `maintainer` is False: an admin making it for others).
    ValueError when the name is taken or not a project name."""
    check_name(name)
    _check_description(description)
    check_role(open_role, field="open_role", none_ok=True)
    now = utcnow()
    try:
        with session_scope(engine) as session:
            if session.get(Project, name) is not None:
                raise ValueError(f"a project named {name!r} already exists")
            session.add(Project(name=name, description=description, open_role=open_role, created_at=now, created_by=by))
            session.flush()
            if maintainer:
                session.add(ProjectMember(project=name, person=by, role="maintainer", added_at=now, added_by=by))
    except IntegrityError:  # made at the same moment by someone else
        raise ValueError(f"a project named {name!r} already exists") from None
    return get_project(engine, name)


def get_project(engine: Engine, name: str) -> ProjectRecord:
    with connection_scope(engine) as conn:
        row = conn.execute(select(Project.__table__).where(Project.name == name)).first()
    if row is None:
        raise ProjectNotFound(name)
    return _record(row)


def list_projects(engine: Engine, names: Iterable[str] | None = None) -> list[ProjectRecord]:
    """Every project by name (or those of `names`)."""
    query = select(Project.__table__).order_by(Project.name)
    if names is not None:
        query = query.where(Project.name.in_(list(names)))
    with connection_scope(engine) as conn:
        return [_record(r) for r in conn.execute(query)]


def update_project(
    engine: Engine, name: str, *, description: str | None = None, open_role: str | None | bool = False
) -> ProjectRecord:
    """Change the description and/or the open role (`open_role=False`: leave it; None: listed people only)."""
    values: dict[str, object] = {}
    if description is not None:
        values["description"] = _check_description(description)
    if open_role is not False:
        values["open_role"] = check_role(open_role, field="open_role", none_ok=True)  # type: ignore[arg-type]
    with session_scope(engine) as session:
        if session.get(Project, name) is None:
            raise ProjectNotFound(name)
        if values:
            session.execute(update(Project).where(Project.name == name).values(**values))
    return get_project(engine, name)


def set_member(engine: Engine, project: str, person: str, role: str, *, by: str) -> MemberRecord:
    """Add `person` to the project with `role`, or change their role."""
    check_role(role)
    if not 0 < len(person) <= OWNER_LEN:
        raise ValueError(f"member: 1 to {OWNER_LEN} characters")
    now = utcnow()
    with session_scope(engine) as session:
        if session.get(Project, project) is None:
            raise ProjectNotFound(project)
        row = session.get(ProjectMember, (project, person))
        if row is None:
            session.add(ProjectMember(project=project, person=person, role=role, added_at=now, added_by=by))
        else:
            row.role, row.added_at, row.added_by = role, now, by
    return MemberRecord(project, person, role, now, by)


def remove_member(engine: Engine, project: str, person: str) -> bool:
    """Whether `person` was listed in the project (they keep what they own; their rights there go)."""
    with session_scope(engine) as session:
        return (
            session.execute(
                delete(ProjectMember).where(ProjectMember.project == project, ProjectMember.person == person)
            ).rowcount
            > 0
        )


def members(engine: Engine, project: str) -> list[MemberRecord]:
    """The project's listed people, maintainers first, then members, then viewers, each by key."""
    query = select(ProjectMember.__table__).where(ProjectMember.project == project)
    with connection_scope(engine) as conn:
        rows = conn.execute(query).all()
    rank = {r: i for i, r in enumerate(PROJECT_ROLES)}
    rows.sort(key=lambda r: (-rank[r.role], r.person))
    return [MemberRecord(r.project, r.person, r.role, r.added_at, r.added_by) for r in rows]


def listed_roles(engine: Engine, people: Iterable[str]) -> dict[str, str]:
    """Project → role for every project one of `people` (a person's key, their verified e-mail) is listed in
    (the highest role where several are), and every open project with its open role where that is higher."""
    wanted = [p for p in people if p]
    rank = {r: i for i, r in enumerate(PROJECT_ROLES)}
    roles: dict[str, str] = {}
    with connection_scope(engine) as conn:
        for name, role in conn.execute(select(Project.name, Project.open_role).where(Project.open_role.is_not(None))):
            roles[name] = role
        if wanted:
            query = select(ProjectMember.project, ProjectMember.role).where(ProjectMember.person.in_(wanted))
            for name, role in conn.execute(query):
                if name not in roles or rank[role] > rank[roles[name]]:
                    roles[name] = role
    return roles


def project_of(engine: Engine, kind: str, key: str) -> str | None:
    """The project of a run, sweep, dataset (by id) or registered model (by name); None when there is none."""
    from db.registry_tables import RegisteredModel  # (imported by db.models after this module)

    table = {"run": (Run, Run.id), "sweep": (Sweep, Sweep.id), "dataset": (Dataset, Dataset.id)}
    table["model"] = (RegisteredModel, RegisteredModel.name)
    model, column = table[kind]
    with connection_scope(engine) as conn:
        return conn.execute(select(model.project).where(column == key)).scalar()


def counts(engine: Engine, names: Iterable[str]) -> Mapping[str, Mapping[str, int]]:
    """Per project: how many runs (and of them queued and running), sweeps and datasets it has."""
    wanted = list(names)
    out: dict[str, dict[str, int]] = {
        n: {"runs": 0, "queued": 0, "running": 0, "sweeps": 0, "datasets": 0} for n in wanted
    }
    with connection_scope(engine) as conn:
        for name, status, n in conn.execute(
            select(Run.project, Run.status, func.count())
            .where(Run.project.in_(wanted))
            .group_by(Run.project, Run.status)
        ):
            out[name]["runs"] += n
            if status in ("queued", "running"):
                out[name][status] += n
        for model, key in ((Sweep, "sweeps"), (Dataset, "datasets")):
            query = select(model.project, func.count()).where(model.project.in_(wanted)).group_by(model.project)
            for name, n in conn.execute(query):
                out[name][key] = n
    return out
