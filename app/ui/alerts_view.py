"""Alerts in the dashboard: the Run page's section (when and why each rule fired for the run, the rules on it, and a
rule added by its owner), the Project page's rules of the project (its maintainers manage them), the Workers page's
global rules (admins manage them), and the sidebar's notices. Rules and
who may manage them: app/services/alerts.py; the workers evaluate them (worker/alerts.py)."""

from __future__ import annotations

from datetime import datetime

import pandas as pd
import streamlit as st

from app import auth
from app.present import text as f
from app.services import alerts
from app.ui import project_context, queries
from db.alerts import ALERT_KINDS
from db.types import RunRecord

RUN_KINDS = tuple(k for k in ALERT_KINDS if k not in alerts.NO_SINGLE_RUN)
PROJECT_KINDS = tuple(k for k in ALERT_KINDS if k not in alerts.GLOBAL_ONLY)
NOTICES_LISTED = 3  # alert notices linked in the sidebar; the toasts tell each new one once
NOTICES_SEEN = "alerts.seen"  # session state: the ids of the firings already toasted


def firings_frame(rows) -> pd.DataFrame:
    return pd.DataFrame(
        [
            {
                "fired": r.fired_at.strftime("%Y-%m-%d %H:%M:%S"),
                "kind": r.kind.replace("_", " "),
                "why": r.reason,
                "cleared": r.cleared_at.strftime("%Y-%m-%d %H:%M:%S") if r.cleared_at else "",
            }
            for r in rows
        ],
        columns=["fired", "kind", "why", "cleared"],
    )


def run_section(r: RunRecord) -> None:
    """The run's firings and rules; its owner (or an admin) adds and removes rules on it."""
    fired = alerts.run_firings(r.id, queries.engine())
    with st.expander(f"Alerts ({len(fired)})" if fired else "Alerts", icon=":material/notifications_active:"):
        if fired:
            st.dataframe(firings_frame(fired), hide_index=True, width="stretch")
        else:
            st.caption("No alert fired for this run.")
        user = project_context.acting()
        rules = alerts.list_rules(r.id, queries.engine())
        may = auth.can_modify(user, r)
        _rules_list([x for x in rules if x.run_id == r.id], user, "run", may)
        if may:
            _add_form(user, r.id, RUN_KINDS, "run")


def global_section() -> None:
    """The global rules, for the Workers page: listed for everyone, managed by admins."""
    st.subheader("Alerts")
    user = project_context.acting()
    admin = user is not None and user.is_admin
    rules = [x for x in alerts.list_rules(None, queries.engine()) if x.scope == "global"]
    st.caption(
        "Rules every worker checks every few seconds; what fires is posted to TORCHDECK_WEBHOOK_URL and shown "
        "here, on the run's page and in the sidebar." + ("" if admin else " Only an admin manages global rules.")
    )
    _rules_list(rules, user, "global", admin)
    if admin:
        _add_form(user, None, ALERT_KINDS, "global")


def project_section(name: str) -> None:
    """The project's rules (on its runs and sweeps), for the Project page: listed for whoever sees the project,
    managed by its maintainers and admins."""
    user = project_context.acting()
    may = project_context.role(name) in ("maintainer", "admin")
    rules = [x for x in alerts.list_rules(None, queries.engine(), project=name) if x.project == name]
    st.caption(
        "Rules on this project's runs and sweeps, checked by every worker; what fires is posted to "
        "TORCHDECK_WEBHOOK_URL and told to whoever made the rule."
        + ("" if may else " Only the project's maintainers manage its rules.")
    )
    if not rules:
        st.caption("No rule on this project yet.")
    _rules_list(rules, user, "project", may)
    if may:
        _add_form(user, None, PROJECT_KINDS, "project", name)


def _rules_list(rules, user, where: str, may: bool) -> None:
    for rule in rules:
        left, right = st.columns([5, 1])
        left.markdown(f"`{rule.id}` {f.md_text(alerts.describe(rule))}")
        if may and right.button("Remove", key=f"alerts.{where}.remove.{rule.id}"):
            alerts.remove_rule(user, rule.id, queries.engine())
            st.rerun()


def _add_form(user, run_id: str | None, kinds: tuple[str, ...], where: str, project: str | None = None) -> None:
    with st.form(f"alerts.{where}.add"):
        kind = st.selectbox(
            "Alert when",
            kinds,
            key=f"alerts.{where}.kind",
            help="\n\n".join(f"**{k}**: {alerts.NEEDS[k]}" for k in kinds),
        )
        a, b, c, d = st.columns(4)
        key = a.text_input("Metric key (metric)", "val/loss", key=f"alerts.{where}.key")
        op = b.selectbox("Above or below (metric)", ("above", "below"), key=f"alerts.{where}.op")
        threshold = c.number_input("Value, or fraction (data wait)", value=0.5, key=f"alerts.{where}.threshold")
        minutes = d.number_input("Minutes", min_value=0.0, value=30.0, key=f"alerts.{where}.minutes")
        epochs = a.number_input("Epochs (stalled)", min_value=0, value=0, key=f"alerts.{where}.epochs")
        cooldown = b.number_input("Cooldown, minutes", min_value=0.0, value=60.0, key=f"alerts.{where}.cooldown")
        if not st.form_submit_button("Add rule"):
            return
    rule = alerts.RuleInput(
        kind,
        run_id,
        key if kind == "metric" else None,
        op if kind == "metric" else None,
        threshold if kind in ("metric", "data_wait") else None,
        (int(epochs) or None) if kind == "stalled" else None,
        (minutes or None) if kind in ("stalled", "data_wait", "worker_silent", "queued") else None,
        cooldown,
        project,
    )
    try:
        made = alerts.add_rule(user, rule, queries.engine())
        watching.clear()  # the sidebars start polling for notices at once
    except (ValueError, auth.PermissionDenied) as e:
        st.error(f.md_text(str(e)), icon=":material/error:")
        return
    st.success(f"Added: {f.md_text(alerts.describe(made))}", icon=":material/check:")


@st.cache_data(ttl=30, show_spinner=False)
def watching(db_url: str) -> bool:
    """Whether any alert rule exists (asked at most every 30 s per database): with none, no page's sidebar polls for
    alert notices."""
    try:
        return bool(alerts.list_rules(engine=queries.engine()))
    except Exception:  # noqa: BLE001 - a database hiccup must not break every page's sidebar
        return False


def sidebar_notices(since: datetime, run_page: str) -> None:
    """The firings since `since` the acting person should hear of (theirs: runs they follow; an admin's: all), each
    toasted once, the newest linked to their run."""
    try:
        rows = alerts.notices(project_context.acting(), since, queries.engine())
    except Exception:  # noqa: BLE001 - a database hiccup must not break every page's sidebar
        return
    seen = st.session_state.setdefault(NOTICES_SEEN, set())
    for row in reversed(rows):
        if row.id not in seen:
            seen.add(row.id)
            st.toast(f"Alert: {f.md_text(row.reason)}", icon=":material/notifications_active:", duration="long")
    if not rows:
        return
    st.caption(f":material/notifications_active: {len(rows)} alert{'s' if len(rows) != 1 else ''} lately")
    for row in rows[:NOTICES_LISTED]:
        if row.run_id:
            label = f.md_text(row.reason if len(row.reason) <= 60 else row.reason[:59] + "…")
            st.page_link(run_page, label=label, query_params={"id": row.run_id}, icon=":material/warning:")
