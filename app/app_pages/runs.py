"""Runs: a paged, filtered, sorted table (the database pages it: fine with 10,000 runs) and the
actions on the selected rows. Rows of running runs refresh live."""

from __future__ import annotations

import streamlit as st

from app import auth
from app.present import text as f
from app.services import runs as run_service
from app.services.owners import owner_labels
from app.ui import frame, project_context, queries, run_units, runs_table
from app.ui.runs_table import COLUMNS, frame_of
from db import repo
from db.types import DEFAULT_PROJECT, RUN_STATUSES, RunRecord

K = frame.page_state("runs")
SORTS = {
    "created": "created_at",
    "started": "started_at",
    "finished": "finished_at",
    "name": "name",
    "status": "status",
    "owner": "owner",
    "val/acc (last)": "metric:val/acc",
    "val/loss (last)": "metric:val/loss",
    "test/acc": "metric:test/acc",
}


def flash(message: str, kind: str = "success") -> None:
    st.session_state.setdefault(K("flash"), []).append((kind, message))


def show_flash() -> None:
    for kind, message in st.session_state.pop(K("flash"), []):
        getattr(st, kind)(message)


def filters() -> tuple[dict, bool]:
    """The list's filters (those of queries.runs_page) and whether rows are grouped. Each lives in the URL too
    (`?status=`, `?tag=`, `?owner=`, `?search=`, `?sweep=`, `?q=`): a link opens the same view."""
    owners, tags = queries.owners_and_tags(project_context.project())
    labels = owner_labels(owners, engine=queries.engine())  # names, not `<issuer>#<subject>` keys
    from_url("status", K("status"), lambda raw: [s for s in (raw or "").split(",") if s in RUN_STATUSES])
    from_url("tag", K("tag"), lambda raw: raw if raw in tags else None)
    from_url("owner", K("owner"), lambda raw: raw if raw in owners else None)
    from_url("search", K("text"), lambda raw: raw or "")
    a, b, c, d, e, g = st.columns([2, 1.2, 1.2, 2, 1.3, 0.8], vertical_alignment="bottom")
    status = a.multiselect(
        "Status", RUN_STATUSES, key=K("status"), placeholder="any status", format_func=f.status_label
    )
    tag = b.selectbox("Tag", tags, index=None, key=K("tag"), placeholder="any tag")
    owner = c.selectbox(
        "Owner", owners, index=None, key=K("owner"), placeholder="anyone", format_func=lambda key: labels.get(key, key)
    )
    text = d.text_input("Search", key=K("text"), placeholder="name, id, tag or notes…")
    sort = e.selectbox("Sort by", list(SORTS), key=K("sort"))
    descending = g.toggle("Desc.", value=True, key=K("desc"))
    for param, raw in (("status", ",".join(status)), ("tag", tag), ("owner", owner), ("search", text.strip())):
        to_url(param, raw or None)
    h, j, i = st.columns([2.4, 4.3, 2], vertical_alignment="bottom")
    sweep_id = sweep_filter(h)
    expression = expression_filter(j)
    grouped = i.toggle(
        "Group sweeps and seed groups",
        key=K("group"),
        disabled=expression is not None,
        help="One row per sweep and per seed group (runs that differ only by seed), with their best "
        "objective as mean ± std (n); select a row to list its runs. Filtered to one sweep, its "
        "seed groups are the rows."
        + (" Not with a filter expression: clear it to group." if expression is not None else ""),
    )
    return {
        "status": status,
        "tag": [tag] if tag else [],
        "owner": owner,
        "text": text.strip() or None,
        "sweep_id": sweep_id,
        "expression": expression,
        "sort": SORTS[sort],
        "descending": descending,
    }, grouped and expression is None


def from_url(param: str, key: str, parse) -> None:
    """Before a filter's widget: `?param=` as its value, when a link (or the back button) changed it."""
    raw = st.query_params.get(param) or None
    if st.session_state.get(K(f"url.{param}")) != raw or key not in st.session_state:
        st.session_state[K(f"url.{param}")] = raw
        st.session_state[key] = parse(raw)


def to_url(param: str, raw: str | None) -> None:
    """After a filter's widget: its value as `?param=` (left out when empty), so the view can be shared by link."""
    if raw != st.session_state.get(K(f"url.{param}")):
        if raw:
            st.query_params[param] = raw
        else:
            st.query_params.pop(param, None)
        st.session_state[K(f"url.{param}")] = raw


EXAMPLE = "val/acc > 0.9 and optim.lr <= 1e-3"
FILTER_HELP = (
    "Conditions joined by `and`: a metric (its last value; `max(val/acc)`, `min(val/loss)`) or a "
    "spec field (`optim.lr`, `train.batch_size`, `model.name`) compared with `>` `>=` `<` `<=` `==` "
    "`!=`, and `status`, `owner`, `tag`, `sweep`, `parent` with `==` or `!=`. For example "
    f"`{EXAMPLE}` or `model.name == resnet18 and tag != baseline`. Quote a value with spaces."
)


def expression_filter(col) -> str | None:
    """The filter expression, kept in the URL (`?q=`); None when empty or unreadable (the error is shown under it)."""
    from_url("q", K("q"), lambda raw: raw or "")
    with col:
        text = st.text_input("Filter", key=K("q"), placeholder=EXAMPLE, help=FILTER_HELP).strip()
        to_url("q", text or None)
        if not text:
            return None
        try:
            repo.parse_filter(text)
        except repo.FilterError as e:
            st.error(f"Filter not applied: {f.md_text(e)}", icon=":material/filter_alt_off:")
            return None
    return text


def sweep_filter(col) -> str | None:
    """The Sweep filter (the current project's sweeps), kept in the URL (`?sweep=<id>`): a link opens the Runs page
    filtered to that sweep."""
    project = project_context.project()
    sweeps = {s.id: s for s in queries.sweeps(project)}
    wanted = st.query_params.get("sweep") or None
    if wanted and wanted not in sweeps and (found := queries.sweep(wanted)) is not None and found.project == project:
        sweeps[wanted] = found  # older than the newest sweeps listed
    if st.session_state.get(K("sweep_url"), "") != wanted:  # a link or the back button changed the URL
        st.session_state[K("sweep_url")] = wanted
        st.session_state[K("sweep")] = wanted if wanted in sweeps else None
        if wanted and wanted not in sweeps:
            st.warning(
                f"No sweep {f.md_text(repr(wanted))}: it may have been deleted. Showing every sweep's runs.",
                icon=":material/filter_alt_off:",
            )
    if st.session_state.get(K("sweep")) not in sweeps:
        st.session_state[K("sweep")] = None
    chosen = col.selectbox(
        "Sweep",
        list(sweeps),
        index=None,
        key=K("sweep"),
        placeholder="any sweep",
        format_func=lambda i: f"{sweeps[i].name} · {sweeps[i].status}",
    )
    if chosen != wanted:
        if chosen:
            st.query_params["sweep"] = chosen
        else:
            st.query_params.pop("sweep", None)
        st.session_state[K("sweep_url")] = chosen
    return chosen


def table(query: dict, offset: int, limit: int) -> list[RunRecord]:
    """The page's rows; returns the selected runs."""
    page = queries.runs_page(**query, limit=limit, offset=offset, project=project_context.project())
    st.caption(f"{page.total:,} run(s) match · showing {offset + 1 if page.runs else 0:,}–{offset + len(page.runs):,}")
    df = frame_of(page.runs)
    state = st.dataframe(
        df,
        hide_index=True,
        column_config=COLUMNS,
        on_select="rerun",
        selection_mode="multi-row",
        key=K("table"),
        width="stretch",
        height=min(38 + 35 * max(len(df), 1), 740),
    )
    rows = state.selection.rows if state is not None else []
    return [page.runs[i] for i in rows if i < len(page.runs)]


def grouped_table(query: dict, offset: int, limit: int) -> list[RunRecord]:
    """One row per sweep, seed group and other run; the selected rows' runs are listed below and selected."""
    page = queries.units_page(**query, limit=limit, offset=offset, project=project_context.project())
    members = queries.unit_members(page.units)  # each row's runs (a sweep's, a seed group's: all of them; the run)
    units = list(members.runs)
    st.caption(
        f"{page.runs:,} run(s) match in {page.total:,} row(s) · showing {offset + 1 if units else 0:,}–"
        f"{offset + len(page.units):,}"
    )
    df = runs_table.grouped_rows(members)
    state = st.dataframe(
        df,
        hide_index=True,
        column_config=runs_table.GROUP_COLUMNS,
        on_select="rerun",
        width="stretch",
        selection_mode="multi-row",
        key=K("gtable"),
        height=min(38 + 35 * max(len(df), 1), 740),
    )
    picked = [units[i] for i in (state.selection.rows if state is not None else []) if i < len(units)]
    for u in picked:
        if u.kind != run_units.RUN:
            runs_table.expand(u, members.runs[u], df.iloc[units.index(u)], K(f"members.{u.id}"))
    return [r for u in picked for r in members.runs[u]]


MODIFY_RULE = (
    "only a run's owner (a member of its project), a maintainer of the project or an admin may cancel or delete it"
)


def action_bar(selected: list[RunRecord]) -> None:
    """The actions on the selected runs: a viewer of the project opens and compares them; a member also re-runs,
    clones, and cancels and deletes their own; a maintainer cancels and deletes anyone's."""
    n = len(selected)
    ids = [r.id for r in selected]
    names = (
        ["open"] + (["cancel", "rerun", "clone", "delete"] if project_context.may_contribute() else []) + ["compare"]
    )
    cols = dict(zip(names, st.columns(6)))
    if cols["open"].button("Open", disabled=n != 1, icon=":material/open_in_new:", key=K("open"), width="stretch"):
        frame.open_run(ids[0])
    if "cancel" in cols:
        modify_buttons(selected, cols)
    if "rerun" in cols and cols["rerun"].button(
        "Re-run", disabled=n == 0, icon=":material/replay:", key=K("rerun"), width="stretch"
    ):
        rerun(selected)
    if "clone" in cols and cols["clone"].button(
        "Clone", disabled=n != 1, icon=":material/content_copy:", key=K("clone"), width="stretch"
    ):
        st.switch_page(frame.NEW, query_params={"clone": ids[0]})
    if cols["compare"].button(
        "Compare", disabled=n < 2, icon=":material/compare_arrows:", key=K("compare"), width="stretch"
    ):
        st.switch_page(frame.COMPARE, query_params={"ids": ",".join(ids)})


def modify_buttons(selected: list[RunRecord], cols: dict) -> None:
    """Cancel and Delete, enabled when the acting user may do it to every selected run (the service refuses the
    others too)."""
    user = project_context.acting()
    mine = [r for r in selected if auth.can_modify(user, r)]
    others = MODIFY_RULE if len(mine) < len(selected) else None
    active = [r for r in mine if not r.finished and not r.external]  # a script's run is the script's to end
    if cols["cancel"].button(
        "Cancel", disabled=not active, icon=":material/stop_circle:", key=K("cancel"), width="stretch", help=others
    ):
        done = 0
        for r in active:
            try:
                run_service.cancel(r.id, engine=queries.engine(), by=user)
                done += 1
            except auth.PermissionDenied as e:  # a role changed since the page was drawn
                flash(f.md_text(e), "error")
        queries.clear()
        flash(f"cancel requested for {done} run(s)")
        st.rerun()
    if cols["delete"].button(
        "Delete",
        disabled=not selected or len(mine) < len(selected),
        icon=":material/delete:",
        key=K("delete"),
        width="stretch",
        help=others,
    ):
        st.session_state[K("confirm")] = {r.id: f.run_label(r) for r in selected}  # id → what to call it
        st.rerun()  # the confirmation lives outside this fragment


def rerun(selected: list[RunRecord]) -> None:
    try:
        owner = project_context.acting().id
        new = [run_service.rerun(r.id, owner=owner, engine=queries.engine()) for r in selected]
    except (RuntimeError, ValueError, auth.PermissionDenied) as e:
        flash(f.md_text(e, multiline=True), "error")
    else:
        flash(f"queued {len(new)} new run(s): {', '.join(r.id for r in new)}")
    queries.clear()
    st.rerun()


def confirm_delete() -> None:
    ids = st.session_state.get(K("confirm"))
    if not ids:
        return
    with st.container(border=True):
        named = ", ".join(f.md_text(label) for label in ids.values())  # names as their text, never Markdown
        st.warning(
            f"Delete {len(ids)} run(s) — {named} — with their metrics, events and artifact files? "
            "This cannot be undone.",
            icon=":material/warning:",
        )
        a, b, _ = st.columns([1, 1, 4])
        if a.button("Delete permanently", type="primary", key=K("confirm_yes")):
            user = project_context.acting()
            refused = [
                msg for run_id in ids if (msg := run_service.refused_removal(run_id, by=user, engine=queries.engine()))
            ]
            st.session_state.pop(K("confirm"))
            queries.clear()
            flash(f"deleted {len(ids) - len(refused)} run(s)")
            for msg in refused:
                flash(f.md_text(msg), "error")
            st.rerun()
        if b.button("Keep", key=K("confirm_no")):
            st.session_state.pop(K("confirm"))
            st.rerun()


def no_runs_yet(project: str) -> None:
    if not project_context.may_contribute():
        st.info(f"Project {f.md_text(project)} has no runs yet.", icon=":material/info:")
        return
    cli = " or `torchdeck submit configs/digits_simple_cnn.yaml`" if project == DEFAULT_PROJECT else ""
    st.info(f"No runs yet. Configure one on the **New run** page{cli}.", icon=":material/info:")
    st.page_link(frame.NEW, label="New run", icon=":material/add_circle:")


def main() -> None:
    st.title("Runs")
    show_flash()
    query, grouped = filters()
    limit = 50
    project = project_context.project()
    runs_total = queries.runs_page(**query, limit=1, project=project).total
    if runs_total == 0 and not any(query[k] for k in ("status", "tag", "owner", "text", "sweep_id", "expression")):
        no_runs_yet(project)
        return
    unit_query = {k: v for k, v in query.items() if k != "expression"}  # grouped only without an expression
    total = queries.units_page(**unit_query, limit=1, project=project).total if grouped else runs_total
    pages = max(1, -(-total // limit))
    page_no = st.pagination(pages, key=K("page")) if pages > 1 else 1
    offset = (min(page_no, pages) - 1) * limit
    if grouped:
        units = queries.units_page(**unit_query, limit=limit, offset=offset, project=project).units
        shown = [r for runs in queries.unit_members(units).runs.values() for r in runs]
    else:
        shown = list(queries.runs_page(**query, limit=limit, offset=offset, project=project).runs)
    live = any(not r.finished for r in shown)

    @st.fragment(run_every=max(queries.REFRESH_S, 2.0) if live else None)
    def body() -> None:
        selected = grouped_table(unit_query, offset, limit) if grouped else table(query, offset, limit)
        action_bar(selected)

    body()
    confirm_delete()


main()
