"""Projects: who may see and do what where (the rules are app/auth.py's has_role, can_read, can_contribute,
can_modify), and managing a project and its members.

Every run, sweep, dataset and registered model belongs to one project. Local mode has the default project and
never asks (its one person is an admin). Team mode: a person's role in a project is the one they are listed with
(project_member, by their key or verified e-mail), or the project's open role (the default project is open to
every member of the dashboard as `member`), the higher of the two; admins have every right everywhere.

Reading is refused as "not found" (ProjectHidden is a LookupError saying so), so that a person outside a project
cannot learn what it holds by guessing ids; acting without the right is PermissionDenied, saying which role it
takes."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping

from sqlalchemy import Engine

from app.auth import ADMINS_ENV, PermissionDenied, User, admins, can_contribute, can_read, has_role, team_mode
from app.services.broker import get_engine
from db import projects as store
from db.projects import MemberRecord, ProjectNotFound, ProjectRecord
from db.types import DEFAULT_PROJECT

__all__ = ["DEFAULT_PROJECT", "MemberRecord", "ProjectHidden", "ProjectNotFound", "ProjectRecord"]


class ProjectHidden(LookupError):
    """What the person asked for is in a project they have no role in: answered like something that does not
    exist."""

    def __init__(self, what: str) -> None:
        super().__init__(f"{what} not found")


def with_roles(user: User | None, engine: Engine | None = None) -> User | None:
    """The user with their role in every project looked up (one query; an admin needs none)."""
    if user is None or user.is_admin:
        return user
    roles = store.listed_roles(engine or get_engine(), [user.id] + ([user.email] if user.email else []))
    return dataclasses.replace(user, roles=tuple(sorted(roles.items())))


def owner_as_user(owner: str, engine: Engine | None = None) -> User:
    """The person an owner key names, with their rights: an admin when the key (or the verified e-mail their
    account was last seen with) is in TORCHDECK_ADMINS; their projects' roles otherwise."""
    from db.repo import accounts

    engine = engine or get_engine()
    account = accounts(engine, [owner]).get(owner)
    email = account.email if account is not None else (owner if "#" not in owner and "@" in owner else None)
    listed = admins()
    is_admin = owner in listed or (email is not None and email.lower() in {a.lower() for a in listed})
    user = User(id=owner, name=account.name if account else owner, is_admin=is_admin, email=email)
    return with_roles(user, engine)  # type: ignore[return-value]


def check_read(user: User | None, project: str, what: str) -> None:
    """ProjectHidden (as "`what` not found") unless `user` may see `project`."""
    if not team_mode():
        return
    if not can_read(user, project):
        raise ProjectHidden(what)


def check_contribute(owner: str, project: str, engine: Engine | None = None) -> None:
    """New runs, sweeps, datasets and models are their owner's: in team mode the owner must be a member (or
    maintainer) of the project, or an admin. ProjectNotFound for a project that does not exist."""
    engine = engine or get_engine()
    store.get_project(engine, project)
    if not team_mode():
        return
    user = owner_as_user(owner, engine)
    if not can_contribute(user, project):
        role = user.role_in(project)
        raise PermissionDenied(
            f"{user.describe()} may not launch runs, sweeps or uploads in project {project}: "
            + (f"they are a {role} there; " if role else "they are not in it; ")
            + "a maintainer of the project (or an admin) can make them a member"
        )


def readable(user: User | None, engine: Engine | None = None) -> list[ProjectRecord]:
    """The projects `user` may see, by name (local mode: every project)."""
    engine = engine or get_engine()
    if not team_mode() or (user is not None and user.is_admin):
        return store.list_projects(engine)
    user = with_roles(user, engine)
    if user is None or not user.roles:
        return []
    return store.list_projects(engine, [name for name, _ in user.roles])


def role(user: User | None, project: str) -> str | None:
    """The user's role in the project ("admin", "maintainer", "member", "viewer" or None); local mode: admin."""
    if not team_mode():
        return "admin"
    return user.role_in(project) if user is not None else None


def _check_maintain(by: User | None, project: str, action: str) -> None:
    if team_mode() and not has_role(by, project, "maintainer"):
        who = by.describe() if by else "an anonymous user"
        raise PermissionDenied(
            f"{who} may not {action} of project {project}: only its maintainers or an admin ({ADMINS_ENV}) may"
        )


def create(
    name: str, *, by: User, description: str = "", open_role: str | None = None, engine: Engine | None = None
) -> ProjectRecord:
    """A new project, its maker its maintainer (every member of the dashboard may make one; ValueError for a
    name taken or not a project name). Only an admin may open it to every member (`open_role`)."""
    if open_role is not None and team_mode() and not by.is_admin:
        raise PermissionDenied(
            f"{by.describe()} may not open a project to every member of the dashboard: only an admin ({ADMINS_ENV}) "
            "may; list its members instead"
        )
    return store.create_project(
        engine or get_engine(), name, by=by.id, description=description, open_role=open_role, maintainer=True
    )


def update(
    name: str,
    *,
    by: User,
    description: str | None = None,
    open_role: str | None | bool = False,
    engine: Engine | None = None,
) -> ProjectRecord:
    """Change a project's description (its maintainers or an admin) or its open role (an admin)."""
    engine = engine or get_engine()
    store.get_project(engine, name)
    by = with_roles(by, engine)  # type: ignore[assignment]
    _check_maintain(by, name, "describe the project")
    if open_role is not False and team_mode() and not by.is_admin:
        raise PermissionDenied(f"{by.describe()} may not change who sees project {name} unlisted: only an admin may")
    return store.update_project(engine, name, description=description, open_role=open_role)


def set_member(project: str, person: str, member_role: str, *, by: User, engine: Engine | None = None) -> MemberRecord:
    """List `person` (an identity key or a verified e-mail) in the project with a role, or change it: the
    project's maintainers or an admin. ValueError for a role that is none of viewer, member, maintainer."""
    engine = engine or get_engine()
    store.get_project(engine, project)
    store.check_role(member_role)
    person = person.strip()
    if not person:
        raise ValueError("member: give a person's account key (<issuer>#<subject>) or verified e-mail")
    _check_maintain(with_roles(by, engine), project, "manage the members")
    return store.set_member(engine, project, person, member_role, by=by.id)


def remove_member(project: str, person: str, *, by: User, engine: Engine | None = None) -> bool:
    """Take `person` off the project's list: the project's maintainers or an admin. What they own stays in the
    project; only a maintainer or an admin may act on it from then on."""
    engine = engine or get_engine()
    store.get_project(engine, project)
    _check_maintain(with_roles(by, engine), project, "manage the members")
    return store.remove_member(engine, project, person)


def members(project: str, *, by: User | None, engine: Engine | None = None) -> list[MemberRecord]:
    engine = engine or get_engine()
    check_read(with_roles(by, engine), project, f"project {project!r}")
    return store.members(engine, project)


def get(project: str, *, by: User | None, engine: Engine | None = None) -> ProjectRecord:
    """The project, or ProjectHidden/ProjectNotFound (the same words) for one `by` may not see."""
    engine = engine or get_engine()
    check_read(with_roles(by, engine), project, f"project {project!r}")
    return store.get_project(engine, project)


def counts(names: list[str], engine: Engine | None = None) -> Mapping[str, Mapping[str, int]]:
    return store.counts(engine or get_engine(), names)
