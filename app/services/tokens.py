"""Personal API tokens: who may make, see and revoke them, and who a script that sends one is.

A person's own script logs runs into torchdeck through the MLflow client (the tracking endpoint of app/tracking/),
sending a token as its bearer token (MLFLOW_TRACKING_TOKEN); it acts as the person who made the token. Only team mode
has tokens: local mode has no sign-in, and its endpoint answers this machine only, as its pages do, so it needs none.
A member of the dashboard makes, lists and revokes their own tokens; an admin may revoke anyone's.

A token is checked again at every use (`authenticate`): it must be known and live, and its person must still be a
member of the dashboard (the allow-list may have changed since it was made), with their admin right as
TORCHDECK_ADMINS says now. The rows are db/tokens.py's; the page is app/ui/tokens_view.py."""

from __future__ import annotations

import logging

from sqlalchemy import Engine
from sqlalchemy.exc import SQLAlchemyError

from app.auth import MODE_ENV, PermissionDenied, User, admins, is_member, team_mode
from app.services.broker import get_engine
from app.services.projects import with_roles
from db import tokens as store
from db.tokens import LABEL_LEN, MAX_LIVE, TokenRecord, TooManyTokens
from db.types import NAME_LEN

__all__ = ["LABEL_LEN", "MAX_LIVE", "TokenRecord", "TokensNotNeeded", "TooManyTokens"]

LOCAL_MODE_WORDS = (
    "This dashboard runs in local mode: its MLflow tracking endpoint answers this machine only, without sign-in, so "
    "a script needs no token here (leave MLFLOW_TRACKING_TOKEN unset). Tokens are for a dashboard shared in team mode "
    f"({MODE_ENV}=team)."
)


class TokensNotNeeded(RuntimeError):
    """Local mode: there is no sign-in, so there are no tokens to make."""

    def __init__(self) -> None:
        super().__init__(LOCAL_MODE_WORDS)


def _check_member(user: User | None, action: str) -> User:
    if user is None:
        raise PermissionDenied(f"sign in to {action}")
    if not is_member(user):
        raise PermissionDenied(f"{user.describe()} is not a member of this dashboard and may not {action}")
    return user


def make(user: User, label: str, engine: Engine | None = None) -> tuple[TokenRecord, str]:
    """A new token of the signed-in member `user`, and its secret (shown once: only its digest is kept).
    TokensNotNeeded in local mode; PermissionDenied for someone who is not a member; ValueError for a label that
    is none (db.tokens.check_label), TooManyTokens (a ValueError) past MAX_LIVE live tokens."""
    if not team_mode():
        raise TokensNotNeeded()
    user = _check_member(user, "make an API token")
    return store.create_token(
        engine or get_engine(),
        person=user.id,
        person_name=user.name[:NAME_LEN],
        email=user.email,
        groups=sorted(user.groups),
        label=label,
    )


def mine(user: User | None, engine: Engine | None = None) -> list[TokenRecord]:
    """The person's tokens, newest first, revoked ones included (nobody signed in: none)."""
    if user is None:
        return []
    return store.list_tokens(engine or get_engine(), user.id)


def revoke(user: User | None, token_id: str, engine: Engine | None = None) -> bool:
    """Revoke a live token: one's own, or anyone's for an admin. True when this revoked it; False when there is no
    live token of theirs with that id (unknown, already revoked, or someone else's: answered alike, so that nobody
    learns of others' tokens by guessing ids)."""
    if user is None:
        raise PermissionDenied("sign in to revoke an API token")
    return store.revoke(engine or get_engine(), token_id, None if user.is_admin else user.id)


def _is_admin(person: str, email: str | None) -> bool:
    """TORCHDECK_ADMINS as it is now names this person: by key exactly, or by verified e-mail in any case."""
    listed = admins()
    return person in listed or (email is not None and email.lower() in {a.lower() for a in listed})


def as_user(record: TokenRecord) -> User:
    """The token's person as app/auth.py's User: their key, name, verified e-mail and groups as stored when it was
    made; admin when TORCHDECK_ADMINS names them now."""
    return User(
        id=record.person,
        name=record.person_name,
        is_admin=_is_admin(record.person, record.email),
        email=record.email,
        groups=frozenset(record.groups),
    )


def authenticate(secret: str, engine: Engine | None = None) -> User | None:
    """Who a script that sends `secret` (its bearer token) acts as: the token's person, with their projects' roles
    looked up (as app/ui/gate.py hands a signed-in member to the pages), when the token is known, live, and its
    person still a member of the dashboard; else None. Records the use (at most once a minute per token)."""
    engine = engine or get_engine()
    record = store.find_by_secret(engine, secret)
    if record is None:
        return None
    user = as_user(record)
    if not is_member(user):
        return None
    if store.needs_touch(record):
        try:
            store.touch(engine, record.id)
        except SQLAlchemyError as e:  # the request goes on: its last use is written at the next one
            logging.getLogger(__name__).warning("could not record the use of API token %s: %s", record.id, e)
    return with_roles(user, engine)
