"""Personal API tokens (team mode): the rows behind app/services/tokens.py's rules.

A person's own script sends one as its bearer token (MLFLOW_TRACKING_TOKEN) to log runs into torchdeck as them. A
token reads `tdk_<id>_<secret part>`: `<id>` is its row's id (so that a leaked token's row is found at a glance), the
secret part 32 random bytes. The whole string is shown once, when it is made; only its SHA-256 is stored, so that a
copy of the database lets nobody act as anyone. Whose it is (key, name, verified e-mail, groups) is kept as it was
when it was made, so that membership of the dashboard can be checked again at every use. A revoked token stays
listed (with when it was revoked) and is never accepted again.

Its last use is written at most once a minute: a script logs many requests a second, and each would otherwise take
the database's write lock."""

from __future__ import annotations

import hashlib
import hmac
import secrets
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime, timedelta

from sqlalchemy import Engine, func, or_, select, update

from db.engine import connection_scope, session_scope
from db.models import ApiToken
from db.types import EMAIL_LEN, NAME_LEN, OWNER_LEN, check_text, utcnow

PREFIX = "tdk_"
LABEL_LEN = 100  # characters of a token's label, after stripping
MAX_LIVE = 20  # live (unrevoked) tokens one person may hold at once
TOUCH_EVERY = timedelta(minutes=1)  # last_used_at is written at most this often per token
_ID_BYTES = 8  # the id part: 16 hex characters
_SECRET_BYTES = 32  # the secret part: 43 URL-safe characters
MAX_SECRET_LEN = 200  # anything longer is no token of ours, refused before it is hashed


class TooManyTokens(ValueError):
    """The person already holds MAX_LIVE live tokens."""

    def __init__(self, live: int):
        super().__init__(
            f"you already have {live} live API tokens, the most one person may hold ({MAX_LIVE}): revoke one you no "
            "longer use, then make the new one"
        )
        self.live = live


@dataclass(frozen=True)
class TokenRecord:
    """A token as the pages list it: never its secret, nor its digest."""

    id: str
    person: str  # the identity key (User.id) it acts as
    person_name: str
    email: str | None  # the person's verified e-mail when it was made
    groups: tuple[str, ...]  # the person's groups when it was made, sorted
    label: str
    created_at: datetime
    last_used_at: datetime | None
    revoked_at: datetime | None

    @property
    def live(self) -> bool:
        return self.revoked_at is None


def digest(secret: str) -> str:
    """What is stored of a token: the SHA-256 of the whole string, in hex."""
    return hashlib.sha256(secret.encode("utf-8")).hexdigest()


def check_label(label: str) -> str:
    """The label as stored (stripped), or ValueError saying what a label may be."""
    if not isinstance(label, str):
        raise ValueError(f"token label: give a text, got {type(label).__name__}")
    text = label.strip()
    if not text:
        raise ValueError("token label: give a name that says where the token is used (e.g. `laptop training script`)")
    if len(text) > LABEL_LEN:
        raise ValueError(f"token label: at most {LABEL_LEN} characters, got {len(text)}")
    if not text.isprintable():
        raise ValueError("token label: printable characters only (no line breaks, tabs or control characters)")
    return text


def _record(row) -> TokenRecord:
    return TokenRecord(
        id=row.id,
        person=row.person,
        person_name=row.person_name,
        email=row.email,
        groups=tuple(row.groups or ()),
        label=row.label,
        created_at=row.created_at,
        last_used_at=row.last_used_at,
        revoked_at=row.revoked_at,
    )


def _check_owner(person: str, person_name: str, email: str | None, groups: Iterable[str]) -> list[str]:
    check_text("person", person, OWNER_LEN)
    check_text("person_name", person_name, NAME_LEN)
    if email is not None:
        check_text("email", email, EMAIL_LEN)
    listed = list(groups)
    if not all(isinstance(g, str) for g in listed):
        raise ValueError(f"groups: texts only, got {listed!r}")
    return sorted(set(listed))


def create_token(
    engine: Engine, *, person: str, person_name: str, email: str | None, groups: Iterable[str], label: str
) -> tuple[TokenRecord, str]:
    """A new live token of `person`, and its secret: shown once, never stored (only its digest is). ValueError for
    a label that is no label (check_label); TooManyTokens when they already hold MAX_LIVE live ones (counted in the
    transaction that stores the new one: SQLite serialises writers, Postgres takes a per-person lock first)."""
    text = check_label(label)
    sorted_groups = _check_owner(person, person_name, email, groups)
    token_id = secrets.token_hex(_ID_BYTES)
    secret = f"{PREFIX}{token_id}_{secrets.token_urlsafe(_SECRET_BYTES)}"
    row = ApiToken(
        id=token_id,
        digest=digest(secret),
        person=person,
        person_name=person_name,
        email=email,
        groups=sorted_groups,
        label=text,
        created_at=utcnow(),
        last_used_at=None,
        revoked_at=None,
    )
    with session_scope(engine) as session:
        if session.get_bind().dialect.name == "postgresql":
            session.execute(select(func.pg_advisory_xact_lock(func.hashtext(f"api_token:{person}"))))
        live = session.execute(
            select(func.count()).select_from(ApiToken).where(ApiToken.person == person, ApiToken.revoked_at.is_(None))
        ).scalar_one()
        if live >= MAX_LIVE:
            raise TooManyTokens(live)
        session.add(row)
        session.flush()
        record = _record(row)
    return record, secret


def token_id_of(secret: str) -> str | None:
    """The id part of a string shaped like a token (`tdk_<id>_<secret part>`), else None."""
    if not isinstance(secret, str) or len(secret) > MAX_SECRET_LEN or not secret.startswith(PREFIX):
        return None
    token_id, sep, rest = secret[len(PREFIX) :].partition("_")
    if not sep or not rest or len(token_id) != 2 * _ID_BYTES:
        return None
    return token_id


def find_by_secret(engine: Engine, secret: str) -> TokenRecord | None:
    """The live token whose secret this is; None for a string that is no token, an unknown one or a revoked one."""
    token_id = token_id_of(secret)
    if token_id is None:
        return None
    wanted = digest(secret)
    with connection_scope(engine) as conn:
        row = conn.execute(select(ApiToken.__table__).where(ApiToken.digest == wanted)).first()
    if row is None or not hmac.compare_digest(row.digest, wanted) or row.id != token_id:
        return None
    return _record(row) if row.revoked_at is None else None


def needs_touch(record: TokenRecord, now: datetime | None = None) -> bool:
    """Whether its last use is older than TOUCH_EVERY (or it was never used): only then is touch() worth a write."""
    return record.last_used_at is None or record.last_used_at <= (now or utcnow()) - TOUCH_EVERY


def touch(engine: Engine, token_id: str, *, now: datetime | None = None) -> bool:
    """Record a use of the token: last_used_at = now, unless it was written less than TOUCH_EVERY ago (one
    conditional UPDATE, so that concurrent requests write it once). Whether it wrote."""
    now = now or utcnow()
    stmt = (
        update(ApiToken)
        .where(
            ApiToken.id == token_id,
            or_(ApiToken.last_used_at.is_(None), ApiToken.last_used_at <= now - TOUCH_EVERY),
        )
        .values(last_used_at=now)
    )
    with connection_scope(engine, write=True) as conn:
        return conn.execute(stmt).rowcount > 0


def get_token(engine: Engine, token_id: str) -> TokenRecord | None:
    """The token with this id (live or revoked), or None."""
    with connection_scope(engine) as conn:
        row = conn.execute(select(ApiToken.__table__).where(ApiToken.id == token_id)).first()
    return _record(row) if row is not None else None


def list_tokens(engine: Engine, person: str) -> list[TokenRecord]:
    """The person's tokens, newest first, revoked ones included."""
    query = (
        select(ApiToken.__table__)
        .where(ApiToken.person == person)
        .order_by(ApiToken.created_at.desc(), ApiToken.id.desc())
    )
    with connection_scope(engine) as conn:
        return [_record(r) for r in conn.execute(query)]


def revoke(engine: Engine, token_id: str, person: str | None) -> bool:
    """Revoke a live token of `person` (None: of anyone, for an admin). Whether this call revoked it: False for an
    unknown id, someone else's token, or one already revoked (which keeps its first revocation time)."""
    stmt = update(ApiToken).where(ApiToken.id == token_id, ApiToken.revoked_at.is_(None))
    if person is not None:
        stmt = stmt.where(ApiToken.person == person)
    with connection_scope(engine, write=True) as conn:
        return conn.execute(stmt.values(revoked_at=utcnow())).rowcount > 0
