"""Which project's things a request admitted to the routes outside the pages may reach (the artifact downloads, the
model registry's stable links, the live charts' feed).

A person sees only their projects' runs, artifacts, models and live feeds, on these routes as on the pages: in team
mode the project of what a request names must be one the signed-in person may read (app.auth.can_read: a viewer of
it or better, by their listing or the project's open role, or an admin). Their roles are looked up at each request,
so that a removal from a project applies at the next one. A route refuses a person who may not read it exactly as
it answers for something that does not exist, so that ids and names cannot be probed. Local mode has one person,
who may read everything.

Nothing of the dashboard is imported before the first request (see app/server.py)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from app import auth

if TYPE_CHECKING:
    from sqlalchemy import Engine


def may_read(user: auth.User | None, kind: str, key: str, engine: Engine | None = None) -> bool:
    """Whether `user` (the request's admitted person) may see the project of the run or model `key` (`kind`: "run"
    or "model"; db.projects.project_of). Always in local mode. Something that does not exist is not refused here:
    the route's own "not found" answers for it, in the same words as for what `user` may not see."""
    if not auth.team_mode():
        return True
    from app.services.broker import get_engine
    from app.services.projects import with_roles
    from db.projects import project_of

    engine = engine or get_engine()
    project = project_of(engine, kind, key)
    if project is None:
        return True
    return auth.can_read(with_roles(user, engine), project)
