"""The gate every page passes first (app/main.py): who is acting, or a screen saying why not, and the
sidebar's signed-in line. The rules themselves are app/auth.py's plain functions."""

from __future__ import annotations

import logging

import streamlit as st

from app.auth import (
    ALLOWED_DOMAINS_ENV,
    ALLOWED_GROUPS_ENV,
    ALLOWED_USERS_ENV,
    MODE_ENV,
    SESSION_USER,
    AuthNotConfigured,
    User,
    current_user,
    is_member,
    local_refusal,
    local_user,
    sign_in_too_old,
    team_mode,
)
from app.present.text import code_span, md_text

ACCOUNT_FLAG = "auth.account_recorded"  # session state: the key of the account recorded in this session


def gate() -> User:
    """Called by app/main.py before any page: returns who is acting, or shows why not and stops the
    script (no page, no data). Team mode: a sign-in screen, or a refusal for someone signed in who is
    not a member. Local mode: refused to a remote client (served on another interface by hand) and to
    any request through a reverse proxy."""
    try:
        team = team_mode()
    except AuthNotConfigured as e:
        st.error(str(e), icon=":material/lock:")
        st.stop()
    if not team:
        refusal = local_refusal(st.context.ip_address, st.context.headers)
        if refusal:
            st.error(refusal, icon=":material/lock:")
            st.stop()
        return local_user()
    if not _sign_in_configured():  # started with `streamlit run` instead of `torchdeck ui` / `torchdeck up`
        st.error(
            f"{MODE_ENV}=team requires sign-in, and this dashboard was started without it. Start it with "
            "`torchdeck ui` (or `torchdeck up`), with the TORCHDECK_OIDC_* variables set.",
            icon=":material/lock:",
        )
        st.stop()
    user = current_user()
    if user is None:
        sign_in_screen()
        st.stop()
    too_old = sign_in_too_old(st.user.to_dict())
    if too_old:
        st.title(":material/local_fire_department: torchdeck")
        st.warning(too_old, icon=":material/schedule:")
        st.button("Sign in again", type="primary", icon=":material/login:", key="auth.renew", on_click=st.logout)
        st.stop()
    if not is_member(user):
        not_a_member_screen(user)
        st.stop()
    _record_account(user)
    return _with_roles(user)


def _with_roles(user: User) -> User:
    """The member with their projects' roles, looked up at every script run (a change of membership applies at
    the next interaction); an unreachable database stops the page with the error, as the frame does."""
    from app.services.broker import get_engine
    from app.services.projects import with_roles

    try:
        user = with_roles(user, get_engine())  # type: ignore[assignment]
        st.session_state[SESSION_USER] = user  # auth.current_user's, for the rest of this script run
        return user
    except Exception as e:  # noqa: BLE001 - shown, not raised: the page cannot tell who may see what
        st.error(f"Cannot read your projects from the database: {e}", icon=":material/error:")
        st.stop()
        raise


def _record_account(user: User) -> None:
    """Once per session: the account's name and verified e-mail, which the pages show instead of its key."""
    from sqlalchemy.exc import SQLAlchemyError

    from app.services.broker import get_engine
    from db.repo import upsert_account

    if st.session_state.get(ACCOUNT_FLAG) == user.id:
        return
    try:
        upsert_account(get_engine(), user.id, user.name, user.email)
    except SQLAlchemyError as e:  # the pages say what is wrong with the database; the next run tries again
        logging.getLogger(__name__).warning("could not record the account %s: %s", user.id, e)
        return
    st.session_state[ACCOUNT_FLAG] = user.id


def _sign_in_configured() -> bool:
    try:
        return "auth" in st.secrets
    except FileNotFoundError:  # no secrets file at all (StreamlitSecretNotFoundError)
        return False


def sign_in_screen() -> None:
    st.title(":material/local_fire_department: torchdeck")
    st.markdown("This dashboard is shared by a team: sign in to see and launch runs.")
    st.button("Sign in", type="primary", icon=":material/login:", key="auth.sign_in", on_click=st.login)


def not_a_member_screen(user: User) -> None:
    """Signed in, but matching no allow-list entry: who they are (the key an admin adds), and Sign out."""
    st.title(":material/local_fire_department: torchdeck")
    st.error(
        f"{md_text(user.name)} is signed in but not a member of this dashboard; ask an admin to add you to "
        f"{ALLOWED_USERS_ENV} (or your e-mail's domain to {ALLOWED_DOMAINS_ENV}, or you to a group of "
        f"{ALLOWED_GROUPS_ENV}).",
        icon=":material/block:",
    )
    mail = f"verified e-mail {md_text(user.email)}" if user.email else "no verified e-mail"
    st.caption(f"Your account: {code_span(user.id)}, {mail}.")
    st.button("Sign out", type="primary", icon=":material/logout:", key="auth.sign_out", on_click=st.logout)


def sidebar(user: User) -> None:
    """Who is signed in (name and verified e-mail), and the sign-out control (team mode)."""
    if not team_mode():
        return
    with st.sidebar:
        role = " · admin" if user.is_admin else ""
        mail = f" ({md_text(user.email)})" if user.email and user.email.lower() != user.name.lower() else ""
        st.caption(f"signed in as **{md_text(user.name)}**{mail}{role}")
        st.button("Sign out", icon=":material/logout:", key="auth.sign_out", on_click=st.logout)
