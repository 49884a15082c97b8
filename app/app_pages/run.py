"""Run: status, progress and ETA, live charts, diagnosis, evaluation, events, samples, spec,
artifacts with export now, predictions by its ONNX export. While the run is active, only the fragments refresh (every
queries.REFRESH_S seconds); the rest of the page never reruns on a timer."""

from __future__ import annotations

import streamlit as st

from app import auth
from app.live import route, series
from app.live.chart import live_charts
from app.present import text as f
from app.present.figures import X_MODES
from app.services.owners import owner_label
from app.services.runs import cancel, follow, rerun, set_tags_and_notes, unfollow
from app.ui import (
    alerts_view,
    evaluations_view,
    external_view,
    frame,
    lr_finder_view,
    predict_view,
    preprocessing_view,
    project_context,
    queries,
    run_charts,
    run_files,
    run_processes,
    run_view,
    test_view,
)
from db.errors import RunNotFound
from db.types import NOTES_LEN

K = frame.page_state("run")
# Fed by the live route, the charts are also sent by the page this often: whatever the frame may have missed
# (a reconnect, a grant dropped) is drawn within this time, at a few milliseconds of the browser's per second.
FED_CHECK_S = 10.0


def pick_run() -> None:
    st.title("Run")
    recent = queries.runs_page(limit=100, project=project_context.project()).runs
    if not recent:
        st.info("No runs yet: launch one from the **New run** page.", icon=":material/info:")
        if project_context.may_contribute():
            st.page_link(frame.NEW, label="New run", icon=":material/add_circle:")
        return
    chosen = st.selectbox(
        "Open a run", recent, format_func=f.run_label, index=None, key=K("pick"), placeholder="choose a recent run…"
    )
    if chosen is not None:
        st.query_params["id"] = chosen.id
        st.rerun()


def header(r) -> None:
    st.title(f.md_text(r.name))  # a name, an owner, a tag: shown as their text, never as Markdown
    bits = [
        f"id {f.code_span(r.id)}",
        f"owner {f.md_text(owner_label(r.owner, queries.engine()))}",
        f"created {r.created_at:%Y-%m-%d %H:%M}",
    ]
    if r.tags:
        bits.append("tags " + ", ".join(f.code_span(t) for t in r.tags))
    st.caption(" · ".join(bits))
    if r.external:
        external_view.source_caption(r)  # its script, git commit and user
    run_processes.show(r)  # a run of several processes: its batch per rank and in total, its learning rate
    run_view.lineage(r)  # parent, sweep, seed group and children, as links
    run_view.notes_panel(r)
    alerts_view.run_section(r)  # when and why an alert fired for this run, and its own rules


def buttons(r) -> None:
    """The run's actions: a viewer of its project compares and follows it; a member also clones, re-runs and repeats
    it, and cancels, tags and annotates their own; a maintainer (or an admin) does that to anyone's (the service
    refuses the others too)."""
    user = project_context.acting()
    mine = auth.can_modify(user, r)
    member = project_context.may_contribute(r.project)
    ours = member and not r.external  # a script's run: no spec to run again, no worker to stop
    wanted = (
        (["cancel"] if ours and not r.finished else [])
        + (["clone"] if ours else [])
        + (["rerun"] if ours and r.finished else [])
        + ["compare"]
        + (["seeds"] if ours else [])
        + ["follow"]
        + (["organise"] if mine else [])
    )
    cols = dict(zip(wanted, st.columns([1] * len(wanted) + [max(7 - len(wanted), 1)])[: len(wanted)], strict=True))
    owner = f.md_text(owner_label(r.owner, queries.engine()))
    why = None if mine else f"only {owner}, a maintainer of project {f.md_text(r.project)} or an admin may cancel it"
    if "cancel" in cols and cols["cancel"].button(
        "Cancel", icon=":material/stop_circle:", key=K("cancel"), disabled=not mine, help=why
    ):
        try:
            cancel(r.id, engine=queries.engine(), by=user)
        except auth.PermissionDenied as e:
            st.error(f.md_text(e), icon=":material/lock:")
        else:
            queries.clear()
            st.rerun()
    if "clone" in cols and cols["clone"].button("Clone", icon=":material/content_copy:", key=K("clone")):
        st.switch_page(frame.NEW, query_params={"clone": r.id})
    if "rerun" in cols and cols["rerun"].button("Re-run", icon=":material/replay:", key=K("rerun")):
        try:
            new = rerun(r.id, owner=user.id, engine=queries.engine())
        except (RuntimeError, ValueError, auth.PermissionDenied) as e:
            st.error(f.md_text(e, multiline=True))
        else:
            queries.clear()
            frame.open_run(new.id)
    if cols["compare"].button("Compare…", icon=":material/compare_arrows:", key=K("compare")):
        st.switch_page(frame.COMPARE, query_params={"ids": r.id})
    if "seeds" in cols:
        run_view.repeat_with_seeds(r, cols["seeds"])
    follow_button(r, user, cols["follow"])
    if "organise" in cols and (refused := organise(r, user, cols["organise"])):
        st.error(f.md_text(refused), icon=":material/error:")
    if r.external:
        external_view.actions_note(r)


def follow_button(r, user: auth.User, container) -> None:
    """Follow or unfollow the run (anyone who may see it): on every page, the sidebar then says when it ends."""
    following = any(row.run_id == r.id for row in frame.followed_runs())
    label, icon = ("Unfollow", ":material/notifications_off:") if following else ("Follow", ":material/notifications:")
    if not container.button(
        label,
        icon=icon,
        key=K("follow"),
        help="Stop the notices about this run"
        if following
        else "Be told, on any page, when this run completes, fails or diverges",
    ):
        return
    try:
        (unfollow if following else follow)(r.id, queries.engine(), by=user)
    except RunNotFound:
        st.error("This run was deleted.", icon=":material/error:")
        return
    frame.note_followed(r.id, None if following else r.status)  # the notices start from the status shown
    st.rerun()


def organise(r, user: auth.User, container) -> str | None:
    """Edit tags & notes (the run's owner or an admin: the others never see it, and the service refuses them);
    why a save was refused, or None."""
    with container.popover("Edit tags & notes", icon=":material/edit_note:", width="stretch"):
        with st.form(K(f"organise.{r.id}"), border=False):
            tags = st.text_input(
                "Tags",
                value=", ".join(r.tags),
                key=K(f"tags.{r.id}"),
                help="Comma-separated; the Runs page filters and searches by them.",
            )
            notes = st.text_area(
                "Notes",
                value=r.notes,
                key=K(f"notes.{r.id}"),
                max_chars=NOTES_LEN,
                height=200,
                help="Plain text, shown as written (never as Markdown); the Runs page's search finds it.",
            )
            saved = st.form_submit_button("Save", type="primary", icon=":material/save:")
    if not saved:
        return None
    tag_list = [t.strip() for t in tags.split(",") if t.strip()]
    try:  # checked and written together: a refused or failed save changes nothing
        set_tags_and_notes(r.id, tag_list, notes, engine=queries.engine(), by=user)
    except RunNotFound:
        return "Tags and notes not saved: this run was deleted"
    except (auth.PermissionDenied, ValueError) as e:
        return f"Tags and notes not saved: {e}"
    queries.clear()
    st.rerun()


def live_status(run_id: str, was_active: bool) -> None:
    r = readable(run_id, fresh=True)
    if r is None:
        st.warning("This run was deleted.")
        return
    run_view.status_panel(r)
    if was_active and r.finished:
        st.rerun()  # the whole page once more: artifacts, export, static charts


def chart_controls() -> tuple[str, float, int]:
    a, b, c = st.columns([2, 2, 1])
    xmode = a.segmented_control("x-axis", X_MODES, default="step", key=K("xmode")) or "step"
    smoothing = b.slider(
        "Smoothing",
        0.0,
        0.99,
        0.6,
        0.01,
        key=K("smooth"),
        help="Exponential moving average of per-step series (the raw series stays faint).",
    )
    cols = c.segmented_control("Columns", (1, 2, 3), default=2, key=K("cols")) or 2
    return xmode, smoothing, cols


def charts_view(run_id: str, xmode: str, smoothing: float, ncols: int, live: bool, timed: bool = False) -> None:
    # While live, the run's record may be a moment old: the status fragment notices the end and reruns the page.
    # Fed by the live route, the charts rerun only when their frame asks (the run ended, a grant expired).
    fed = live and route.served()
    r = readable(run_id, fresh=fed or not live)
    if r is None:  # gone (or its project no longer readable): no grant for its live feed
        return
    if fed and r.finished:
        st.rerun()  # the whole page once more: artifacts, export, static charts
    charts, counts = run_charts.figures(r, xmode, smoothing)
    if not charts:
        st.info("No metrics yet: the first points arrive after the first logged step.", icon=":material/hourglass:")
        if fed and not timed:  # metrics none of the charts shows (yet): the frame waits for its charts itself
            live_charts([], columns=ncols, key=K("charts"), feed=_feed(r.id, xmode, smoothing))
        return
    if fed and timed:
        st.rerun()  # the first points: the whole page once more, its charts then fed by the live route (no timer)
    feed = _feed(r.id, xmode, smoothing) if counts is not None and route.served() else None
    live_charts(charts, columns=ncols, key=K("charts"), feed=feed)  # updated in place: zoom and legend survive
    if len(more := run_charts.uncharted(r, list(r.metrics))) > run_charts.MAX_OTHER_CHARTS:
        st.caption(f"{len(more) - run_charts.MAX_OTHER_CHARTS} more metric keys: overlay any of them on Compare.")
    if counts is not None and feed is None:
        last = series.shared(queries.db_url(), r.id).get("train/loss")[0]
        st.caption(f"{len(counts)} metric keys" + (f" · last step {last[-1]}" if last else ""))
        run_charts.wait_for_more(r.id, counts, K("charts"))


def _feed(run_id: str, xmode: str, smoothing: float) -> dict[str, str] | None:
    """The live route's path and a grant for these charts (app/live/route.py): one grant per session and
    settings, made again when it expired; None when none can be made (the page then refreshes the charts)."""
    key = K(f"feed.{run_id}.{xmode}.{smoothing}")
    token = st.session_state.get(key)
    if token is None or not route.valid(token):
        token = st.session_state[key] = route.grant(run_id, xmode, smoothing)
    return None if token is None else {"path": route.PATH, "grant": token}


def live_details(run_id: str) -> None:
    r = readable(run_id, fresh=True)
    if r is None:
        return
    if r.external:  # torchdeck's checks run in its worker
        external_view.not_applicable("diagnosis")
        return
    events = run_view.EventLog.of(r.id)
    diag, evaluation, log = st.tabs(["Diagnosis", "Evaluation", "Event log"])
    with diag:
        run_view.diagnosis_panel(events)
    with evaluation:
        run_view.evaluation_panel(r, events)
    with log:
        run_view.events_panel(events)


def readable(run_id: str, fresh: bool = False):
    """The run, or None when there is none or the acting user may not see its project (the page, its live parts
    and the grants of its live charts show nothing of it then)."""
    r = queries.run(run_id, fresh=fresh)
    return r if r is not None and project_context.may_read(r.project) else None


def opened(run_id: str):
    """The run `?id=` names, its project then the current one (a shared link works); None, saying so, when there is
    none or it is of a project the user may not read (the same words)."""
    r = readable(run_id, fresh=True)
    if r is None:
        st.error(f"No run {f.md_text(repr(run_id))}: it may have been deleted.", icon=":material/error:")
        st.page_link(frame.RUNS, label="All runs", icon=":material/table_rows:")
        return None
    project_context.follow(r.project)
    return r


def main() -> None:
    run_id = st.query_params.get("id")
    if not run_id:
        pick_run()
        return
    r = opened(run_id)
    if r is None:
        return
    active = not r.finished
    every = queries.REFRESH_S if active else None
    if active:
        # Streamlit fades the elements of a fragment while it reruns; refreshed every second, the
        # live parts would spend half their time faded although nothing in them is out of date.
        st.html(
            "<style>[data-stale='true']{opacity:1 !important;transition:none !important} "
            "[data-testid='stStatusWidget']{display:none !important}</style>"
        )
    header(r)
    buttons(r)
    run_view.repeated_notice(r)
    # Status, progress and ETA: every couple of seconds is plenty (the charts follow the points as they come).
    # Fed by the live route, the charts tell the page when the run ends: the status may refresh less often.
    status_every = 5.0 if route.served() else 2.0
    st.fragment(live_status, run_every=max(every, status_every) if every else None)(r.id, active)
    test_view.show(r)  # the held-out test split's scores, once the run has ended
    run_tabs(r, active, every)


def run_tabs(r, active: bool, every: float | None) -> None:
    """Charts, diagnosis and evaluation, samples, spec (a script's run: its params), artifacts and predictions."""
    # Only the open tab runs (and refreshes): a hidden tab costs nothing, in the server or the browser.
    spec_label = "Parameters" if r.external else "Spec"  # a script's run: the params and tags it logged
    tabs = st.tabs(
        ["Charts", "Diagnosis & evaluation", "Samples", spec_label, "Artifacts", "Predict"],
        key=K("tab"),
        on_change="rerun",
    )
    charts_tab, details_tab, samples_tab, spec_tab, files_tab, predict_tab = tabs
    if charts_tab.open is not False:
        with charts_tab:
            xmode, smoothing, ncols = chart_controls()
            # Served with the live route, the chart frame follows the run itself once it has points: the page
            # refreshes the charts only every FED_CHECK_S then (before them, a refresh a second waits for the first).
            fed = active and route.served()
            timer = (queries.REFRESH_S if not r.metrics else FED_CHECK_S) if fed else queries.LIVE_S if active else None
            st.fragment(charts_view, run_every=timer)(r.id, xmode, smoothing, ncols, active, fed and not r.metrics)
            lr_finder_view.show(r)  # the pre-flight's LR range test, when the spec asked for it
    if details_tab.open:
        with details_tab:
            st.fragment(live_details, run_every=max(every, 3.0) if every else None)(r.id)
            if not r.external:
                evaluations_view.show(r)  # the export scored on other registered datasets, on a jobs worker
    if samples_tab.open:
        with samples_tab:
            run_view.samples_panel(r)
    if spec_tab.open:
        with spec_tab:
            if not r.external:
                preprocessing_view.show(r)  # whose resize, crop and mean/std the run used
            run_view.spec_panel(r)  # a script's run: its params and tags
    if files_tab.open:
        with files_tab:
            run_files.artifacts_panel(r)
            if r.finished:
                run_files.export_panel(r)
    if predict_tab.open:
        with predict_tab:
            predict_view.show(r)  # the verified ONNX export on images the user drops


main()
