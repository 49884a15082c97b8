"""Who is acting, and what they may do to a run.

Two modes (TORCHDECK_MODE):
- `local` (default): one person on their own machine. The dashboard is open, served on 127.0.0.1
  only, and whoever reaches it may do anything.
- `team`: several people share one dashboard. Everyone signs in through Streamlit's native
  `st.login` (OpenID Connect: Keycloak, Google, Entra ID, …), configured by the TORCHDECK_OIDC_*
  variables below; a run belongs to the signed-in user who submitted it, and only its owner or an
  admin (TORCHDECK_ADMINS) may cancel or delete it. Every member may view and clone.

Who someone is, in team mode: the provider's issuer and subject, `<iss>#<sub>` (User.id, what an
owner column holds), never a name or an address people can choose at the provider. An e-mail counts
only when the provider says it verified it (`email_verified` true; absent is not verified): then it
may match TORCHDECK_ADMINS, the allow-list, and owners stored as e-mails before identities were keyed.
Members: everyone signed in, unless an allow-list is set (TORCHDECK_ALLOWED_USERS, _DOMAINS, _GROUPS).

Streamlit reads its OIDC settings from the `[auth]` section of a secrets file, so the process starter
(app/cli/processes.py) writes one (mode 0600) under the data folder from the environment and passes it with
`--secrets.files`: configuration stays environment-only, as a compose deployment wants.

The rules (`can_modify`, `check_can_modify`) are plain functions used by app/services/, which
enforces them; the pages only hide what would be refused. The gate every page passes first is
app/ui/gate.py. Streamlit is imported lazily here, so the CLI and the services import this module
cheaply.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from db.types import DEFAULT_PROJECT

MODE_ENV = "TORCHDECK_MODE"
ADMINS_ENV = "TORCHDECK_ADMINS"  # comma-separated identity keys (<iss>#<sub>) or verified e-mails
# The allow-list (any set: only who matches one, or an admin, is a member; none set: everyone signed in).
ALLOWED_USERS_ENV = "TORCHDECK_ALLOWED_USERS"  # comma-separated identity keys or verified e-mails
ALLOWED_DOMAINS_ENV = "TORCHDECK_ALLOWED_DOMAINS"  # comma-separated domains of verified e-mails
ALLOWED_GROUPS_ENV = "TORCHDECK_ALLOWED_GROUPS"  # comma-separated values of the groups claim
GROUPS_CLAIM_ENV = "TORCHDECK_GROUPS_CLAIM"  # the ID token claim listing the user's groups (default `groups`)
ALLOW_ENVS = (ALLOWED_USERS_ENV, ALLOWED_DOMAINS_ENV, ALLOWED_GROUPS_ENV)
# Headers a reverse proxy adds: local mode has no sign-in, so a proxied request is refused there.
PROXY_HEADERS = ("Forwarded", "X-Forwarded-For", "X-Forwarded-Host", "X-Forwarded-Proto", "X-Real-IP")
ADDRESS_ENV = "TORCHDECK_UI_ADDRESS"  # team mode only: where the UI listens (default all interfaces)
# [auth] key in Streamlit's secrets → the variable that sets it. All are required in team mode.
OIDC_ENV = {
    "server_metadata_url": "TORCHDECK_OIDC_SERVER_METADATA_URL",  # …/.well-known/openid-configuration
    "client_id": "TORCHDECK_OIDC_CLIENT_ID",
    "client_secret": "TORCHDECK_OIDC_CLIENT_SECRET",
    "redirect_uri": "TORCHDECK_OIDC_REDIRECT_URI",  # https://<dashboard>/oauth2callback
    "cookie_secret": "TORCHDECK_OIDC_COOKIE_SECRET",  # signs the session cookie: the same on every app replica
}
# Instead of the metadata URL: the issuer (e.g. https://keycloak.example.com/realms/lab), whose metadata
# lives at <issuer>/.well-known/openid-configuration (OpenID Connect Discovery).
ISSUER_ENV = "TORCHDECK_OIDC_ISSUER"
WELL_KNOWN = "/.well-known/openid-configuration"
MODES = ("local", "team")
LOOPBACK = ("127.0.0.1", "localhost", "::1")
SESSION_MAX_AGE_ENV = "TORCHDECK_SESSION_MAX_AGE_H"  # team mode: hours a sign-in counts (default 12; 0: no limit)


class AuthNotConfigured(RuntimeError):
    """Team mode without the sign-in configuration: the dashboard refuses to start."""


class PermissionDenied(PermissionError):
    """The acting user may not do this to this run (or dataset)."""


@dataclass(frozen=True)
class User:
    """The acting person. `id` is what an owner column holds: `<iss>#<sub>` in team mode, the login name in
    local mode. `name` is for display only; `email` is set only when the provider verified it."""

    id: str
    name: str
    is_admin: bool = False
    email: str | None = None
    groups: frozenset[str] = frozenset()
    # (project, role) for every project they have a role in (app/services/projects.with_roles); None: not looked up.
    roles: tuple[tuple[str, str], ...] | None = None

    def role_in(self, project: str) -> str | None:
        """Their role in `project`: "admin" for an admin (everywhere), else viewer, member, maintainer or None."""
        if self.is_admin:
            return "admin"
        if self.roles is None:
            raise RuntimeError(f"the projects of {self.id} were not looked up (app.services.projects.with_roles)")
        return dict(self.roles).get(project)

    def describe(self) -> str:
        """For messages: the name and what identifies it (the verified e-mail, else the key)."""
        ident = self.email or self.id
        return ident if self.name.lower() == ident.lower() else f"{self.name} ({ident})"


def mode() -> str:
    value = (os.environ.get(MODE_ENV) or "local").strip().lower()
    if value not in MODES:
        raise AuthNotConfigured(f"{MODE_ENV}={value!r} is not a mode: use one of {', '.join(MODES)}")
    return value


def team_mode() -> bool:
    return mode() == "team"


def _entries(env: str) -> tuple[str, ...]:
    return tuple(e.strip() for e in os.environ.get(env, "").split(",") if e.strip())


def admins() -> frozenset[str]:
    return frozenset(_entries(ADMINS_ENV))


def _listed(entries, key: str, email: str | None) -> bool:
    """An entry names this user: their key exactly, or their verified e-mail (case-insensitive)."""
    mail = email.lower() if email else None
    return any(e == key or (mail is not None and e.lower() == mail) for e in entries)


def local_user() -> User:
    """Local mode: the person at this machine, who may do anything. Also the operator at a shell
    with database credentials (the CLI), who could change the database directly anyway."""
    name = os.environ.get("USER") or "local"
    return User(id=name, name=name, is_admin=True)


def configured_issuer() -> str:
    """The issuer of the sign-in settings: TORCHDECK_OIDC_ISSUER, else the metadata URL's (its address less
    /.well-known/openid-configuration), else ''."""
    issuer = os.environ.get(ISSUER_ENV, "").strip()
    if issuer:
        return issuer.rstrip("/")
    url = os.environ.get(OIDC_ENV["server_metadata_url"], "").strip()
    return url.removesuffix(WELL_KNOWN).rstrip("/") if url.endswith(WELL_KNOWN) else ""


def _text(claims: Mapping[str, Any], name: str) -> str:
    value = claims.get(name)
    return str(value).strip() if value is not None else ""


def _groups(claims: Mapping[str, Any]) -> frozenset[str]:
    value = claims.get(os.environ.get(GROUPS_CLAIM_ENV, "").strip() or "groups")
    if isinstance(value, str):
        value = [value]
    if not isinstance(value, (list, tuple, set, frozenset)):
        return frozenset()
    return frozenset(str(v).strip() for v in value if str(v).strip())


def user_from_claims(claims: Mapping[str, Any]) -> User | None:
    """The signed-in user from the ID token's claims, or None when nobody is signed in (or the token names
    no subject). Keyed on issuer and subject: `preferred_username` and an unverified `email` are whatever
    the person typed at the provider, so they name (for display) but never identify."""
    if not claims.get("is_logged_in"):
        return None
    sub, iss = _text(claims, "sub"), _text(claims, "iss") or configured_issuer()
    if not sub or not iss:
        return None
    key = f"{iss}#{sub}"
    email = _text(claims, "email") if claims.get("email_verified") is True else ""
    name = _text(claims, "name") or email or _text(claims, "preferred_username") or sub
    return User(
        id=key, name=name, is_admin=_listed(admins(), key, email or None), email=email or None, groups=_groups(claims)
    )


def allow_list() -> dict[str, tuple[str, ...]]:
    """The allow-list variables that are set, with their entries."""
    return {env: entries for env in ALLOW_ENVS if (entries := _entries(env))}


def is_member(user: User) -> bool:
    """May this signed-in user use the dashboard? With no allow-list set, everyone signed in is a member;
    with one, an admin, or a user whose key or verified e-mail is in TORCHDECK_ALLOWED_USERS, whose verified
    e-mail's domain is in TORCHDECK_ALLOWED_DOMAINS, or who has a group of TORCHDECK_ALLOWED_GROUPS."""
    rules = allow_list()
    if not rules or user.is_admin:
        return True
    domains = {d.lower().lstrip("@") for d in rules.get(ALLOWED_DOMAINS_ENV, ())}
    domain = user.email.rsplit("@", 1)[-1].lower() if user.email and "@" in user.email else None
    return (
        _listed(rules.get(ALLOWED_USERS_ENV, ()), user.id, user.email)
        or (domain is not None and domain in domains)
        or bool(user.groups & set(rules.get(ALLOWED_GROUPS_ENV, ())))
    )


# Project roles in increasing rights: a viewer sees; a member also launches runs and acts on their own; a
# maintainer acts on anyone's in the project and manages its members; an admin is everything everywhere.
ROLE_RANK = {"viewer": 1, "member": 2, "maintainer": 3, "admin": 4}


def has_role(user: User | None, project: str, least: str) -> bool:
    """Has `user` at least the role `least` in `project`?"""
    if user is None:
        return False
    role = user.role_in(project)
    return role is not None and ROLE_RANK[role] >= ROLE_RANK[least]


def can_read(user: User | None, project: str) -> bool:
    """Sees the project's runs, sweeps, datasets, models, their metrics, files and live feeds."""
    return has_role(user, project, "viewer")


def can_contribute(user: User | None, project: str) -> bool:
    """Launches runs and sweeps, uploads datasets, registers models in the project."""
    return has_role(user, project, "member")


def can_modify(user: User | None, thing: Any) -> bool:
    """Cancel and delete a run, delete a dataset: its owner while a member of its project, a maintainer of its
    project, or an admin (viewing is open to the project's viewers, cloning to its members). `thing.owner` is
    an identity key; one stored before identities were keyed holds an e-mail (no '#'), which the user's
    verified e-mail matches; no owner (a dataset from before datasets had one): maintainers and admins."""
    if user is None:
        return False
    project = getattr(thing, "project", DEFAULT_PROJECT)
    if has_role(user, project, "maintainer"):
        return True
    if not has_role(user, project, "member"):
        return False
    owner = getattr(thing, "owner", None)
    if not owner:
        return False
    if owner == user.id:
        return True
    return "#" not in owner and user.email is not None and owner.strip().lower() == user.email.lower()


def check_can_modify(user: User | None, run: Any, action: str, owner: str | None = None) -> None:
    """PermissionDenied unless `user` may `action` this run; `owner` is how to name its owner (default the key)."""
    if not can_modify(user, run):
        who = user.describe() if user else "an anonymous user"
        project = getattr(run, "project", DEFAULT_PROJECT)
        raise PermissionDenied(
            f"{who} may not {action} run {run.id}: it belongs to {owner or run.owner}, and only its owner (a "
            f"member of project {project}), a maintainer of project {project} or an admin ({ADMINS_ENV}) may "
            f"{action} it"
        )


# --- starting the UI ------------------------------------------------------------------------------


def _oidc_settings() -> dict[str, str]:
    values = {key: os.environ.get(env, "").strip() for key, env in OIDC_ENV.items()}
    issuer = os.environ.get(ISSUER_ENV, "").strip().rstrip("/")
    if not values["server_metadata_url"] and issuer:
        values["server_metadata_url"] = f"{issuer}{WELL_KNOWN}"
    return values


def missing_config() -> list[str]:
    names = {"server_metadata_url": f"{OIDC_ENV['server_metadata_url']} (or {ISSUER_ENV})"}
    return [names.get(key, OIDC_ENV[key]) for key, value in _oidc_settings().items() if not value]


def secrets_toml() -> str:
    # JSON string literals are valid TOML basic strings (quotes, backslashes and controls escaped).
    lines = ["[auth]"] + [f"{key} = {json.dumps(value)}" for key, value in _oidc_settings().items()]
    return "\n".join(lines) + "\n"


def write_secrets(home: Path) -> Path:
    """$TORCHDECK_HOME/auth/secrets.toml, readable by this user only, rewritten at every start."""
    folder = home / "auth"
    folder.mkdir(parents=True, exist_ok=True)
    folder.chmod(0o700)
    path = folder / "secrets.toml"
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(secrets_toml())
    path.chmod(0o600)
    return path


def serve_options(home: Path) -> list[str]:
    """The `streamlit run` options that make serving the UI safe in this mode, or AuthNotConfigured
    saying what to set. Local mode: 127.0.0.1 only. Team mode: sign-in required, no error details shown."""
    address = os.environ.get(ADDRESS_ENV, "").strip()
    if not team_mode():
        if address and address not in LOOPBACK:
            raise AuthNotConfigured(
                f"{ADDRESS_ENV}={address}: in local mode the dashboard has no sign-in, so it is served on "
                f"127.0.0.1 only. To share it, set {MODE_ENV}=team and configure sign-in "
                f"({', '.join(OIDC_ENV.values())})."
            )
        return ["--server.address", "127.0.0.1"]
    missing = missing_config()
    if missing:
        raise AuthNotConfigured(
            f"{MODE_ENV}=team requires sign-in, but {', '.join(missing)} "
            f"{'is' if len(missing) == 1 else 'are'} not set. Register torchdeck as an OpenID Connect client "
            "with your provider (Keycloak, Google, Entra ID, …) with the redirect URI "
            "https://<dashboard address>/oauth2callback, then set the TORCHDECK_OIDC_* variables "
            "(see .env.example); a cookie secret can be made with "
            "`python -c 'import secrets; print(secrets.token_urlsafe(32))'`."
        )
    # An uncaught error shows the visitor a generic message, never its traceback (the server's files) nor its
    # text (which may quote data of another person); the whole error goes to the server's log.
    return [
        "--server.address",
        address or "0.0.0.0",
        "--secrets.files",
        str(write_secrets(home)),
        "--client.showErrorDetails",
        "none",
    ]


# --- in the dashboard (Streamlit) -----------------------------------------------------------------


SESSION_USER = "auth.user"  # session state: the gate's user of this script run, with their projects' roles


def current_user() -> User | None:
    """Local mode: the local user. Team mode: the signed-in user, or None; with their projects' roles as the gate
    looked them up at the start of this script run (app/ui/gate.py), else looked up now."""
    if not team_mode():
        return local_user()
    import streamlit as st

    user = user_from_claims(st.user.to_dict())
    if user is None or user.is_admin:
        return user
    known = st.session_state.get(SESSION_USER)
    if isinstance(known, User) and known.id == user.id and known.roles is not None:
        return known
    from app.services.projects import with_roles

    return with_roles(user)


def _is_loopback(ip: str | None) -> bool:
    return ip is None or ip in LOOPBACK or ip.startswith("127.") or ip == "::ffff:127.0.0.1"


def local_refusal(ip: str | None, headers: Mapping[str, str]) -> str | None:
    """Local mode has no sign-in, so it answers this machine only: why this request is refused, or None.
    A request through a reverse proxy comes from 127.0.0.1 too, so the proxy's headers refuse it."""
    if not _is_loopback(ip):
        return (
            "This torchdeck dashboard runs in local mode, without sign-in: it only answers on this machine. "
            f"Ask its owner to run it with {MODE_ENV}=team."
        )
    sent = {str(h).lower() for h in headers}
    proxied = [h for h in PROXY_HEADERS if h.lower() in sent]
    if proxied:
        return (
            f"This torchdeck dashboard runs in local mode, without sign-in, and this request came through a "
            f"proxy ({', '.join(proxied)}): through a proxy anyone could reach it, so it answers this machine "
            f"only. To serve it through a proxy, run it with {MODE_ENV}=team (sign-in, see .env.example)."
        )
    return None


def sign_in_too_old(claims: Mapping[str, Any], now: float | None = None) -> str | None:
    """Why a sign-in must be renewed, or None. Streamlit's sign-in cookie lasts 30 days and keeps the claims of
    the moment of sign-in (groups, e-mail): a sign-in older than TORCHDECK_SESSION_MAX_AGE_H (its ID token's
    `iat`) is renewed, so that a change at the provider (a removed group, a disabled account) applies."""
    import time

    raw = os.environ.get(SESSION_MAX_AGE_ENV, "").strip()
    try:
        limit_h = float(raw) if raw else 12.0
    except ValueError:
        raise AuthNotConfigured(f"{SESSION_MAX_AGE_ENV}={raw!r} is not a number of hours") from None
    issued = claims.get("iat")
    if limit_h <= 0 or not isinstance(issued, (int, float)):
        return None
    age_h = ((now if now is not None else time.time()) - issued) / 3600
    if age_h <= limit_h:
        return None
    return (
        f"Your sign-in is {age_h:.0f} hours old; this dashboard asks for a fresh one every {limit_h:g} hours "
        f"({SESSION_MAX_AGE_ENV}), so that changes at the identity provider apply. Sign in again."
    )
