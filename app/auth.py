"""Who is acting, and what they may do to a run.

Two modes (TORCHDECK_MODE):
- `local` (default): one person on their own machine. The dashboard is open, served on 127.0.0.1
  only, and whoever reaches it may do anything.
- `team`: several people share one dashboard. Everyone signs in through Streamlit's native
  `st.login` (OpenID Connect: Keycloak, Google, Entra ID, …), configured by the TORCHDECK_OIDC_*
  variables below; a run belongs to the signed-in user who submitted it, and only its owner or an
  admin (TORCHDECK_ADMINS) may cancel or delete it. Everyone signed in may view and clone.

Streamlit reads its OIDC settings from the `[auth]` section of a secrets file, so the launcher
writes one (mode 0600) under the data folder from the environment and passes it with
`--secrets.files`: configuration stays environment-only, as a compose deployment wants.

The rules (`can_modify`, `check_can_modify`) are plain functions used by app/services.py, which
enforces them; the pages only hide what would be refused. Streamlit is imported lazily, so the CLI
and the services import this module cheaply.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

MODE_ENV = "TORCHDECK_MODE"
ADMINS_ENV = "TORCHDECK_ADMINS"  # comma-separated e-mail addresses (case-insensitive)
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
MODES = ("local", "team")
LOOPBACK = ("127.0.0.1", "localhost", "::1")


class AuthNotConfigured(RuntimeError):
    """Team mode without the sign-in configuration: the dashboard refuses to start."""


class PermissionDenied(PermissionError):
    """The acting user may not do this to this run."""


@dataclass(frozen=True)
class User:
    """The acting person. `id` is what a run's owner column holds: the e-mail in team mode."""

    id: str
    name: str
    is_admin: bool = False


def mode() -> str:
    value = (os.environ.get(MODE_ENV) or "local").strip().lower()
    if value not in MODES:
        raise AuthNotConfigured(f"{MODE_ENV}={value!r} is not a mode: use one of {', '.join(MODES)}")
    return value


def team_mode() -> bool:
    return mode() == "team"


def admins() -> frozenset[str]:
    return frozenset(a.strip().lower() for a in os.environ.get(ADMINS_ENV, "").split(",") if a.strip())


def local_user() -> User:
    """Local mode: the person at this machine, who may do anything. Also the operator at a shell
    with database credentials (the CLI), who could change the database directly anyway."""
    name = os.environ.get("USER") or "local"
    return User(id=name, name=name, is_admin=True)


def user_from_claims(claims: Mapping[str, Any]) -> User | None:
    """The signed-in user from the ID token's claims, or None when nobody is signed in. Some
    providers (Entra ID) may omit `email`: `preferred_username`, then `sub`, stand in."""
    if not claims.get("is_logged_in"):
        return None
    # An address the provider says it has not verified could be anyone's (an admin's): not used.
    keys = ("preferred_username", "sub") if claims.get("email_verified") is False else ("email", "preferred_username", "sub")
    ident = next((str(claims[k]) for k in keys if claims.get(k)), None)
    if ident is None:
        return None
    ident = ident.strip().lower()
    return User(id=ident, name=str(claims.get("name") or ident), is_admin=ident in admins())


def can_modify(user: User | None, run: Any) -> bool:
    """Cancel and delete: the run's owner or an admin. Viewing and cloning are open to everyone signed in."""
    if user is None:
        return False
    return user.is_admin or str(run.owner).strip().lower() == user.id


def check_can_modify(user: User | None, run: Any, action: str) -> None:
    if not can_modify(user, run):
        who = user.id if user else "an anonymous user"
        raise PermissionDenied(f"{who} may not {action} run {run.id}: it belongs to {run.owner}, and only its "
                               f"owner or an admin ({ADMINS_ENV}) may {action} it")


# --- starting the UI ------------------------------------------------------------------------------


def _oidc_settings() -> dict[str, str]:
    values = {key: os.environ.get(env, "").strip() for key, env in OIDC_ENV.items()}
    issuer = os.environ.get(ISSUER_ENV, "").strip().rstrip("/")
    if not values["server_metadata_url"] and issuer:
        values["server_metadata_url"] = f"{issuer}/.well-known/openid-configuration"
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
    saying what to set. Local mode: 127.0.0.1 only. Team mode: sign-in required."""
    address = os.environ.get(ADDRESS_ENV, "").strip()
    if not team_mode():
        if address and address not in LOOPBACK:
            raise AuthNotConfigured(
                f"{ADDRESS_ENV}={address}: in local mode the dashboard has no sign-in, so it is served on "
                f"127.0.0.1 only. To share it, set {MODE_ENV}=team and configure sign-in "
                f"({', '.join(OIDC_ENV.values())}).")
        return ["--server.address", "127.0.0.1"]
    missing = missing_config()
    if missing:
        raise AuthNotConfigured(
            f"{MODE_ENV}=team requires sign-in, but {', '.join(missing)} "
            f"{'is' if len(missing) == 1 else 'are'} not set. Register torchdeck as an OpenID Connect client "
            "with your provider (Keycloak, Google, Entra ID, …) with the redirect URI "
            "https://<dashboard address>/oauth2callback, then set the TORCHDECK_OIDC_* variables "
            "(see .env.example); a cookie secret can be made with "
            "`python -c 'import secrets; print(secrets.token_urlsafe(32))'`.")
    return ["--server.address", address or "0.0.0.0", "--secrets.files", str(write_secrets(home))]


# --- in the dashboard (Streamlit) -----------------------------------------------------------------


def current_user() -> User | None:
    """Local mode: the local user. Team mode: the signed-in user, or None."""
    if not team_mode():
        return local_user()
    import streamlit as st

    return user_from_claims(st.user.to_dict())


def _is_loopback(ip: str | None) -> bool:
    return ip is None or ip in LOOPBACK or ip.startswith("127.") or ip == "::ffff:127.0.0.1"


def gate() -> User:
    """Called by app/main.py before any page: returns who is acting, or shows why not and stops the
    script (no page, no data). Team mode: a sign-in screen. Local mode: refused to a remote client,
    should someone serve it on another interface by hand."""
    import streamlit as st

    try:
        team = team_mode()
    except AuthNotConfigured as e:
        st.error(str(e), icon=":material/lock:")
        st.stop()
    if not team:
        if not _is_loopback(st.context.ip_address):
            st.error("This torchdeck dashboard runs in local mode, without sign-in: it only answers on this "
                     f"machine. Ask its owner to run it with {MODE_ENV}=team.", icon=":material/lock:")
            st.stop()
        return local_user()
    if not _sign_in_configured():  # started with `streamlit run` instead of `torchdeck ui` / `torchdeck up`
        st.error(f"{MODE_ENV}=team requires sign-in, and this dashboard was started without it. Start it with "
                 "`torchdeck ui` (or `torchdeck up`), with the TORCHDECK_OIDC_* variables set.", icon=":material/lock:")
        st.stop()
    user = current_user()
    if user is None:
        sign_in_screen()
        st.stop()
    return user


def _sign_in_configured() -> bool:
    import streamlit as st

    try:
        return "auth" in st.secrets
    except FileNotFoundError:  # no secrets file at all (StreamlitSecretNotFoundError)
        return False


def sign_in_screen() -> None:
    import streamlit as st

    st.title(":material/local_fire_department: torchdeck")
    st.markdown("This dashboard is shared by a team: sign in to see and launch runs.")
    st.button("Sign in", type="primary", icon=":material/login:", key="auth.sign_in", on_click=st.login)


def sidebar(user: User) -> None:
    """Who is signed in, and the sign-out control (team mode)."""
    import streamlit as st

    if not team_mode():
        return
    with st.sidebar:
        role = " · admin" if user.is_admin else ""
        st.caption(f"signed in as **{user.name}** ({user.id}){role}")
        st.button("Sign out", icon=":material/logout:", key="auth.sign_out", on_click=st.logout)
