"""The API tokens page (app/app_pages/tokens.py): what a token is for, the form that makes one, the new token's
secret shown once, and the person's tokens with a revoke button (and its confirmation) per live one. Local mode
has no tokens: the page says so and shows the two variables a script on this machine sets. The rules are
app/services/tokens.py's; here, what they would refuse is not offered.

The secret of a new token lives in session state only while it is on screen: until the person dismisses it, or
leaves the page (another page's run does not draw its Dismiss button, so Streamlit drops that button's state, and
the page, drawn again without it, forgets the secret). It is never stored anywhere else: the database keeps its
SHA-256 only."""

from __future__ import annotations

import os
from datetime import datetime
from urllib.parse import urlsplit

import streamlit as st

from app import auth
from app.present import text as f
from app.services import tokens
from app.tracking import PATH as TRACKING_PATH  # where the dashboard answers the MLflow client
from app.ui import frame, project_context, queries

K = frame.page_state("tokens")
SHOWN = K("shown")  # session state: (id, label, secret) of the token just made, while it is on screen
FRESH = K("fresh")  # session state: the token was made in the run before this one (its Dismiss is not drawn yet)
DISMISS = K("dismiss")  # the Dismiss button's key: its state is gone after a run that did not draw it
CONFIRM = K("confirm")  # session state: (id, label) of the token whose revocation awaits confirmation
FLASH = K("flash")  # session state: (kind, message) to show after the rerun that follows an action
CALLBACK = "/oauth2callback"  # the sign-in's redirect URI ends with it: what comes before is the dashboard's URL
PURPOSE = (
    "An API token lets your own training script log its runs into torchdeck through the MLflow client, as you: "
    "its params, metrics and status appear on the pages like any run's. Set `MLFLOW_TRACKING_URI` to this "
    f"dashboard's URL followed by `{TRACKING_PATH}` and `MLFLOW_TRACKING_TOKEN` to the token, then use "
    "`mlflow.start_run()` and `mlflow.log_metric()` as usual."
)


def when(t: datetime | None, never: str = "never") -> str:
    return f"{t:%Y-%m-%d %H:%M} UTC" if t is not None else never


def tracking_uri() -> str:
    """The endpoint's address: local mode, this machine's; team mode, the dashboard's URL as its sign-in redirect
    URI says (else as the browser reached it)."""
    if not auth.team_mode():
        return f"http://127.0.0.1:{st.get_option('server.port') or 8501}{TRACKING_PATH}"
    redirect = os.environ.get(auth.OIDC_ENV["redirect_uri"], "").strip().rstrip("/")
    if redirect.endswith(CALLBACK):
        return redirect.removesuffix(CALLBACK) + TRACKING_PATH
    seen = urlsplit(st.context.url or "")
    base = f"{seen.scheme}://{seen.netloc}" if seen.scheme and seen.netloc else "https://<this dashboard>"
    return base + TRACKING_PATH


def environment(token: str) -> str:
    lines = [f"export MLFLOW_TRACKING_URI={tracking_uri()}"]
    if token:
        lines.append(f"export MLFLOW_TRACKING_TOKEN={token}")
    return "\n".join(lines)


def flash(message: str, kind: str = "success") -> None:
    st.session_state.setdefault(FLASH, []).append((kind, message))


def show_flash() -> None:
    for kind, message in st.session_state.pop(FLASH, []):
        getattr(st, kind)(message)


def local_section() -> None:
    """Local mode: no token, the endpoint answers this machine only."""
    st.info(
        "This dashboard runs in local mode, without sign-in: its MLflow endpoint answers this machine only, so a "
        "script here needs no token. Set this before running it:",
        icon=":material/info:",
    )
    st.code(environment(""), language="bash")


def new_token_panel() -> None:
    """The secret of the token just made, once, with a warning; gone once dismissed or after the page was left."""
    shown = st.session_state.get(SHOWN)
    if shown is None:
        return
    if not st.session_state.pop(FRESH, False) and DISMISS not in st.session_state:
        st.session_state.pop(SHOWN, None)  # the page was left since (another page's run dropped the button)
        return
    token_id, label, secret = shown
    with st.container(border=True):
        st.success(f"Token **{f.md_text(label)}** made.", icon=":material/key:")
        st.warning(
            "Copy it now: it will not be shown again (torchdeck keeps only a fingerprint of it). Keep it secret, "
            "like a password; revoke it below if it leaks.",
            icon=":material/warning:",
        )
        st.code(environment(secret), language="bash")
        if st.button("I have copied it: hide it", key=DISMISS, icon=":material/visibility_off:"):
            st.session_state.pop(SHOWN, None)
            st.rerun()


def make_form(user: auth.User | None) -> None:
    with st.form(K("make"), border=True, clear_on_submit=True):
        st.markdown("**Make a token**")
        a, b = st.columns([4, 1], vertical_alignment="bottom")
        label = a.text_input(
            "Label",
            max_chars=tokens.LABEL_LEN,
            key=K("label"),
            placeholder="e.g. laptop training script",
            help="Where the token is used, so that you know which one to revoke later.",
        )
        made = b.form_submit_button("Make token", type="primary", icon=":material/add:", width="stretch")
    if not made:
        return
    try:
        record, secret = tokens.make(user, label, engine=queries.engine())  # type: ignore[arg-type]
    except (ValueError, auth.PermissionDenied, tokens.TokensNotNeeded) as e:
        st.error(f"No token made: {f.md_text(e)}", icon=":material/error:")
        return
    st.session_state[SHOWN] = (record.id, record.label, secret)
    st.session_state[FRESH] = True
    st.session_state.pop(CONFIRM, None)
    st.rerun()


def confirm_revoke(user: auth.User | None) -> None:
    """The confirmation of a revocation asked for in the table: Revoke permanently, or Keep."""
    asked = st.session_state.get(CONFIRM)
    if not asked:
        return
    token_id, label = asked
    with st.container(border=True):
        st.warning(
            f"Revoke token **{f.md_text(label)}**? Every script that uses it is refused from then on. This cannot be "
            "undone: make a new token for them instead.",
            icon=":material/warning:",
        )
        a, b, _ = st.columns([1, 1, 4])
        if a.button("Revoke permanently", type="primary", key=K("confirm_yes")):
            st.session_state.pop(CONFIRM, None)
            try:
                done = tokens.revoke(user, token_id, engine=queries.engine())
            except auth.PermissionDenied as e:
                flash(f.md_text(e), "error")
            else:
                flash(f"Token {f.md_text(label)} revoked." if done else f"Token {f.md_text(label)} was not live.")
            st.rerun()
        if b.button("Keep", key=K("confirm_no")):
            st.session_state.pop(CONFIRM, None)
            st.rerun()


def _ask_revoke(token_id: str, label: str) -> None:
    st.session_state[CONFIRM] = (token_id, label)


def tokens_table(user: auth.User | None) -> None:
    """The person's tokens, newest first: label, made, last used, live or revoked, and Revoke for a live one."""
    mine = tokens.mine(user, engine=queries.engine())
    live = sum(t.live for t in mine)
    st.subheader("Your tokens")
    if not mine:
        st.caption("You have no tokens yet.")
        return
    st.caption(f"{live} live of at most {tokens.MAX_LIVE} · {len(mine) - live} revoked")
    widths = [3, 2, 2, 2, 1.3]
    head = st.columns(widths)
    for col, name in zip(head, ("Label", "Made", "Last used", "State", "")):
        col.markdown(f"**{name}**" if name else "")
    for t in mine:
        a, b, c, d, e = st.columns(widths, vertical_alignment="center")
        a.markdown(f.md_text(t.label))
        b.markdown(when(t.created_at))
        c.markdown(when(t.last_used_at))
        d.markdown(":green[live]" if t.live else f":gray[revoked {when(t.revoked_at)}]")
        if t.live:
            e.button(
                "Revoke", key=K(f"revoke.{t.id}"), icon=":material/key_off:", on_click=_ask_revoke, args=(t.id, t.label)
            )


def main() -> None:
    st.title("API tokens")
    st.markdown(PURPOSE)
    if not auth.team_mode():
        local_section()
        return
    user = project_context.acting()
    show_flash()
    new_token_panel()
    make_form(user)
    confirm_revoke(user)
    tokens_table(user)
