"""Sweeps. Without `?id=`: every sweep, newest first, with its trials done and its best objective. With it: one
sweep, live: its trials (status, parameters, objective, epochs used; pruned ones shaded, with why), the best
so far, every trial's objective per epoch overlaid, parallel coordinates, Optuna's parameter importances,
cancel, and the best configuration launched again as a run or a seed group. While the sweep runs only its
live fragment refreshes (every sweep_view.REFRESH_S seconds); once it has ended, nothing does."""

from __future__ import annotations

import streamlit as st

from app import auth
from app.present import test_scores
from app.present import text as f
from app.present.seed_groups import mean_std_text
from app.services import sweeps
from app.services.owners import owner_label
from app.ui import frame, project_context, queries, queue_view
from app.ui import sweep_view as sv
from db.errors import SweepNotFound

K = frame.page_state("sweep")
CONFIG = {"displaylogo": False}


def list_sweeps() -> None:
    st.title("Sweeps")
    project = project_context.project()
    df = sv.listing(project)
    if df.empty and not project_context.may_contribute():
        st.info(f"Project {f.md_text(project)} has no sweeps yet.", icon=":material/info:")
        return
    if df.empty:
        st.info(
            "No sweeps yet: on the **New run** page, tick **sweep** beside a numeric or choice field, or "
            "load a sweep YAML there (or run `torchdeck sweep SPEC.yaml --space SPACE.yaml`).",
            icon=":material/info:",
        )
        st.page_link(frame.NEW, label="New run", icon=":material/add_circle:")
        return
    st.caption(f"{len(df)} sweep(s) of project {f.md_text(project)}, newest first")
    cc = st.column_config
    st.dataframe(
        df,
        hide_index=True,
        width="stretch",
        height=min(38 + 35 * len(df), 740),
        key=K("list"),
        column_config={
            "created": cc.DatetimeColumn("created", format="YYYY-MM-DD HH:mm"),
            "open": cc.LinkColumn("open", display_text="open ↗", width="small"),
        },
    )


def header(v: sweeps.SweepView) -> None:
    s, spec = v.sweep, v.spec
    st.title(f.md_text(s.name))  # a user's name: its text, never Markdown
    st.caption(
        " · ".join(
            [
                f"id {f.code_span(s.id)}",
                f"owner {f.md_text(owner_label(s.owner, queries.engine()))}",
                f"created {s.created_at:%Y-%m-%d %H:%M}",
            ]
        )
    )
    st.caption(
        " · ".join(
            [
                f"method {f.code_span(spec.method)}",
                f"objective {f.code_span(spec.metric)} ({spec.mode})",
                f"{spec.trials} trials, {spec.budget.parallel} at once",
                f"pruner {f.code_span(spec.pruner.kind)}",
                f"{spec.seeds} seed(s) per configuration",
                "swept: " + ", ".join(f.code_span(p) for p in spec.space),
            ]
        )
    )


def cancel_button(v: sweeps.SweepView) -> None:
    """Its owner (a member of its project), a maintainer of the project or an admin cancels a sweep: the others
    see no button (and the service refuses them, saying why)."""
    user = project_context.acting()
    if v.sweep.finished or not auth.can_modify(user, v.sweep):
        return
    if st.button(
        "Cancel sweep",
        icon=":material/stop_circle:",
        key=K("cancel"),
        help="End the sweep: no new trial starts, its queued and running runs are cancelled.",
    ):
        try:
            sweeps.cancel_sweep(v.sweep.id, by=user, engine=queries.engine())
        except auth.PermissionDenied as e:
            st.error(f.md_text(e), icon=":material/lock:")
            return
        queries.clear()
        st.rerun()


def status_line(v: sweeps.SweepView) -> None:
    a, b = st.columns([1, 4], vertical_alignment="center")
    a.markdown(f"#### {f.status_md(v.sweep.status)}")
    b.markdown(sv.counts_text(v))
    if not v.sweep.finished:
        b.caption(f":material/autorenew: Live: this part of the page refreshes every {sv.REFRESH_S:g} s.")
    if sweeps.waits_for_room(v, queries.engine()):
        b.caption(
            f":material/hourglass_top: The next trial waits: its owner has as many queued runs as this "
            f"dashboard allows ({v.sweep.max_queued} per person); it is queued once some of them start."
        )
    elif v.sweep.finished_at is not None:
        b.caption(f"Ended {v.sweep.finished_at:%Y-%m-%d %H:%M:%S}: the page no longer refreshes.")
    if v.sweep.error:
        st.error(f.md_text(v.sweep.error, multiline=True), icon=":material/error:")


def best_panel(v: sweeps.SweepView) -> None:
    b = v.best
    with st.container(border=True):
        if b is None:
            st.caption(
                "The best configuration appears here once a trial has completed; then it can be launched "
                "again as a new run or seed group."
            )
            return
        left, right = st.columns([3, 1.2], vertical_alignment="bottom")
        value = mean_std_text(sv.run_bests(v.state, b.number))
        left.markdown(f"**Best so far: trial #{b.number}** · {f.md_text(v.spec.metric)} {f.md_text(value)}")
        left.markdown(test_scores.beside_winner(v.state.runs_of(b.number)))  # held out: never chose the winner
        left.markdown(sv.params_md(b.params, list(v.spec.space)))
        st.session_state.setdefault(K("best_seeds"), v.spec.seeds)
        seeds = right.number_input(
            "Seeds",
            min_value=1,
            max_value=20,
            step=1,
            key=K("best_seeds"),
            help="1: one new run; more: a seed group (base seed, +1, …) shown as mean ± std.",
        )
        if project_context.may_contribute(v.sweep.project) and right.button(
            "Launch the best configuration", icon=":material/rocket_launch:", key=K("launch_best"), width="stretch"
        ):
            launch_best(v, int(seeds))
    launched = st.session_state.get(K("launched"))
    if launched and launched[0] == v.sweep.id:
        ids = launched[1]
        st.success(
            f"The best configuration is queued as a seed group of {len(ids)} runs.", icon=":material/check_circle:"
        )
        st.page_link(
            frame.COMPARE,
            label="Compare the group's runs",
            query_params={"ids": ",".join(ids)},
            icon=":material/compare_arrows:",
        )


def launch_best(v: sweeps.SweepView, seeds: int) -> None:
    try:
        runs = sweeps.launch_best(v.sweep.id, owner=project_context.acting().id, seeds=seeds, engine=queries.engine())
    except (RuntimeError, ValueError, auth.PermissionDenied) as e:
        st.error(f.md_text(e, multiline=True), icon=":material/error:")
        return
    queries.clear()
    if len(runs) == 1:
        frame.open_run(runs[0].id)
    st.session_state[K("launched")] = (v.sweep.id, [r.id for r in runs])


def trials_table(v: sweeps.SweepView) -> None:
    if not v.outcomes:
        st.caption("No trial yet: the first ones are queued as the sweep starts.")
        return
    st.markdown("**Trials**")
    st.dataframe(
        sv.styled_trials(v),
        hide_index=True,
        width="stretch",
        column_config=sv.trial_columns(v),
        height=min(38 + 35 * len(v.outcomes), 600),
    )
    if any(o.state == "pruned" for o in v.outcomes):
        st.caption(
            "Shaded rows: trials the pruner stopped early (why pruned says why); their runs' status is `pruned`."
        )


def charts_grid(v: sweeps.SweepView) -> None:
    if not any(o.curve for o in v.outcomes):
        st.caption("The charts appear with the first trial's first epoch: its objective, then every trial's.")
        return
    a, b = st.columns(2)
    a.plotly_chart(sv.best_so_far_figure(v), key=K("best_chart"), config=CONFIG)
    b.plotly_chart(sv.curves_figure(v), key=K("curves"), config=CONFIG)
    c, d = st.columns(2)
    parallel = sv.parallel_figure(v)
    with c:
        st.markdown("**Parameters against the objective** (completed trials)")
        if parallel is None:
            st.caption("Parallel coordinates appear once a trial has completed.")
        else:
            st.plotly_chart(parallel, key=K("parallel"), config=CONFIG)
    with d:
        values = sv.importances(v)
        if values:
            st.plotly_chart(sv.importance_figure(v, values), key=K("importance"), config=CONFIG)
        else:
            st.caption(
                "Parameter importances (Optuna's fANOVA) appear once two trials with different parameters "
                "have completed."
            )


def live(sweep_id: str, was_running: bool) -> None:
    v = sv.view(sweep_id)
    if v is None:
        st.warning("This sweep was deleted.")
        return
    if was_running and v.sweep.finished:
        st.rerun()  # the whole page once more: no Cancel button, no refresh
    status_line(v)
    best_panel(v)
    trials_table(v)
    charts_grid(v)


def spec_panel(v: sweeps.SweepView) -> None:
    with st.expander("Sweep spec (YAML)", icon=":material/description:"):
        text = v.spec.to_yaml()
        st.download_button(
            "Download the sweep as YAML",
            text,
            file_name="sweep.yaml",
            mime="application/yaml",
            icon=":material/download:",
            key=K("yaml"),
        )
        st.code(text, language="yaml")


def readable(sweep_id: str) -> bool:
    """Whether the sweep exists and the acting user may see its project."""
    try:
        sweeps.readable_sweep(sweep_id, by=project_context.acting(), engine=queries.engine())
    except SweepNotFound:
        return False
    return True


def main() -> None:
    sweep_id = st.query_params.get("id")
    if not sweep_id:
        list_sweeps()
        return
    v = sv.view(sweep_id) if readable(sweep_id) else None
    if v is None:  # none, or of a project the user may not read: the same words
        st.error(f"No sweep {f.md_text(repr(sweep_id))}: it may have been deleted.", icon=":material/error:")
        st.page_link(frame.SWEEP, label="All sweeps", icon=":material/tune:")
        return
    project_context.follow(v.sweep.project)  # a shared link opens the sweep's project
    running = not v.sweep.finished
    if running:  # a refreshed fragment fades while it reruns; nothing in it is out of date meanwhile
        st.html("<style>[data-stale='true']{opacity:1 !important;transition:none !important}</style>")
    header(v)
    cancel_button(v)
    queue_view.sweep_priority_control(v.sweep)
    st.fragment(live, run_every=sv.REFRESH_S if running else None)(v.sweep.id, running)
    spec_panel(v)


main()
