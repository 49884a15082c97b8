"""Compare: overlaid curves, hyperparameters against a metric (parallel coordinates), the spec diff
and a summary table of any set of runs (`?ids=a,b,c`). Grouped (`&group=seed|sweep|tag`), each seed group,
sweep or tag is one mean curve with a ± std band and one summary row, its figures as mean ± std (n).
While any chosen run is active (queued, running, lost) only the curves refresh, every queries.REFRESH_S seconds,
in place (zoom and legend survive); the Curves CSV holds every stored point, built when its button is clicked."""

from __future__ import annotations

import streamlit as st

from app.live.chart import live_charts
from app.present import text as f
from app.present.figures import COMPARE_X_MODES, X_LABELS
from app.ui import compare_groups as cg
from app.ui import compare_view as cv
from app.ui import evaluations_view, frame, project_context, queries
from core.names import SYSTEM_PREFIX

K = frame.page_state("cmp")
DEFAULT_KEYS = ("train/loss", "val/loss", "val/acc")
# Points per run and chart: 20 overlaid runs × 500 points already exceed a chart's pixel columns.
MAX_POINTS = 500
CHART_POINTS = 20_000  # beyond 40 runs each run gets fewer points, so a chart draws about this many in all
MAX_RUNS = 100  # runs compared at once (the URL may name more: the first ones are taken)


def points_per_run(n_runs: int) -> int:
    """MAX_POINTS per run up to 40 runs, then fewer (never under 100): 100 runs × 200 points still give each
    run a point every few pixels, and the browser draws a chart in a fraction of a second."""
    return max(100, min(MAX_POINTS, CHART_POINTS // max(n_runs, 1)))


def choose_runs() -> list[str]:
    named = list(dict.fromkeys(i for i in (st.query_params.get("ids") or "").split(",")[: 10 * MAX_RUNS] if i))
    if len(named) > MAX_RUNS:
        st.warning(
            f"Compare shows at most {MAX_RUNS} runs at once: the first {MAX_RUNS} of the {len(named)} named are shown.",
            icon=":material/filter_list:",
        )
    wanted = named[:MAX_RUNS]
    if st.session_state.get(K("seeded")) != wanted:
        st.session_state[K("seeded")] = wanted
        st.session_state[K("ids")] = of_the_project(wanted)
    project = project_context.project()
    recent = {r.id: r for r in queries.runs_page(limit=200, project=project).runs}
    for run_id in st.session_state.get(K("ids"), []):
        if run_id not in recent and (r := queries.run(run_id)) is not None and r.project == project:
            recent[run_id] = r
    st.session_state[K("ids")] = [i for i in st.session_state.get(K("ids"), []) if i in recent]
    ids = st.multiselect(
        "Runs",
        list(recent),
        key=K("ids"),
        format_func=lambda i: f.run_label(recent[i]),
        placeholder="choose runs to compare…",
        max_selections=MAX_RUNS,
    )
    if ids != wanted:
        st.query_params["ids"] = ",".join(ids)
        st.session_state[K("seeded")] = ids
    return ids


def of_the_project(wanted: list[str]) -> list[str]:
    """Of the runs a link names, those of the current project; a link naming only runs of another project the user
    may read opens that project (a shared link works). Runs of other projects are left out, saying so; runs that do
    not exist and runs of projects the user may not read are both "not found"."""
    found = queries.runs_by_id(wanted)
    readable = {i: r for i, r in found.items() if project_context.may_read(r.project)}
    if readable and all(r.project != project_context.project() for r in readable.values()):
        project_context.follow(readable[next(i for i in wanted if i in readable)].project)
    project = project_context.project()
    missing = [i for i in wanted if i not in readable]
    others = sorted({r.project for r in readable.values() if r.project != project})
    if missing:
        st.warning(
            f"{len(missing)} run(s) of the link not found (deleted, or never there): "
            + ", ".join(f.code_span(i[:40]) for i in missing[:10]),
            icon=":material/filter_list_off:",
        )
    if others:
        st.warning(
            f"Runs of project(s) {', '.join(f.md_text(p) for p in others)} left out: Compare shows the runs of one "
            f"project, here {f.md_text(project)}. Switch project in the sidebar to compare those.",
            icon=":material/filter_list_off:",
        )
    return [i for i in wanted if i in readable and readable[i].project == project]


def choose_grouping(runs) -> list[cg.Group] | None:
    """The Group by control, kept in the URL (`&group=seed`): None when ungrouped."""
    from_url = {v: k for k, v in cg.URL_VALUES.items()}.get(st.query_params.get("group") or "", "none")
    if st.session_state.get(K("group_url")) != from_url:  # a link (the Run page's seed group) or the back button
        st.session_state[K("group_url")] = from_url
        st.session_state[K("group_by")] = from_url
    by = (
        st.segmented_control(
            "Group by",
            cg.GROUP_BY,
            key=K("group_by"),
            help="Runs that differ only by seed (seed group), a sweep's trials or the runs with a "
            "tag as one mean curve with a ± std band, and one summary row each.",
        )
        or "none"
    )
    if by != from_url:
        if by == "none":
            st.query_params.pop("group", None)
        else:
            st.query_params["group"] = cg.URL_VALUES[by]
        st.session_state[K("group_url")] = by
    if by == "none":
        return None
    names = {sid: s.name for sid in {r.sweep_id for r in runs if r.sweep_id} if (s := queries.sweep(sid))}
    return cg.groups_of(runs, by, names)


def curve_controls(ids: list[str]) -> tuple[tuple[str, ...], dict]:
    """The metrics to overlay, and how to draw them: the figure builders' xmode, smoothing and log_y."""
    available = queries.union_keys(ids)
    default = [k for k in DEFAULT_KEYS if k in available] or available[:2]
    a, b, c, d = st.columns([4, 2.6, 1.5, 1])
    keys = a.multiselect("Metrics", available, default=default, key=K("keys"))
    xmode = (
        b.segmented_control(
            "x-axis",
            COMPARE_X_MODES,
            default="step",
            key=K("xmode"),
            format_func=X_LABELS.get,
            help="Relative time: seconds since each run started. Wall time: the clock (UTC).",
        )
        or "step"
    )
    smoothing = c.slider("Smoothing", 0.0, 0.99, 0.0, 0.01, key=K("smooth"))
    log_y = d.toggle("Log scale", key=K("log_y"), help="A logarithmic y-axis (points at or below zero are not drawn).")
    return tuple(keys), {"xmode": xmode, "smoothing": smoothing, "log_y": log_y}


def curves(runs, ids: list[str], groups: list[cg.Group] | None) -> None:
    keys, look = curve_controls(ids)
    if not keys:
        st.caption("Choose metrics to overlay.")
        return
    if groups is not None:
        st.caption("Each line is a group's mean over its runs, the band ± one standard deviation (n shown as ×n).")
    if any(not r.finished for r in runs):
        # While a run is active only the charts refresh, in place (zoom and legend survive), without fading.
        st.html("<style>[data-stale='true']{opacity:1 !important;transition:none !important}</style>")
        st.fragment(curve_charts, run_every=queries.REFRESH_S)(runs, groups, keys, look, True)
    else:
        curve_charts(runs, groups, keys, look, False)
    labels = None if groups is None else cg.labels_by_run(groups)
    st.download_button(
        "Curves as CSV",
        cv.csv_builder(runs, keys, labels),
        file_name="compare-curves.csv",
        mime="text/csv",
        icon=":material/download:",
        key=K("curves_csv"),
        on_click="ignore",
        help="Every stored point of the chosen metrics (not the charts' downsampled lines), built when clicked.",
    )


def curve_charts(runs, groups: list[cg.Group] | None, keys: tuple[str, ...], look: dict, live: bool) -> None:
    """The curves; `live` (a fragment rerun every REFRESH_S): the runs and their series read afresh, drawn by the
    live-chart component, and the whole page once more when the last active run has finished."""
    if live:
        runs = cv.fresh_runs([r.id for r in runs])
        groups = None if groups is None else cg.refreshed(groups, runs)
    series = cv.load_series(runs, keys, points_per_run(len(runs)))
    if groups is None:
        figs = cv.curve_figures(runs, series, keys, **look)
    else:
        figs = cg.band_figures(groups, series, keys, **look)
    if not figs:
        st.caption("No points yet for these metrics.")
    elif live:
        live_charts(figs, columns=2, key=K("live_charts"))
    else:
        cols = st.columns(2)
        for i, (key, fig) in enumerate(figs):
            cols[i % 2].plotly_chart(fig, key=K(f"chart.{key}"), config={"displaylogo": False})
    if live and all(r.finished for r in runs):
        st.rerun()  # the whole page once more: static charts, no more refreshing


def hyperparameters(runs) -> None:
    metrics = sorted({k for r in runs for k in r.metrics if not k.startswith(SYSTEM_PREFIX)})
    default = "val/acc" if "val/acc" in metrics else (metrics[0] if metrics else None)
    if default is None:
        return
    every = list(cv.varying_hyperparameters(runs, limit=None))
    if K("pc_axes") in st.session_state:  # runs removed since: their fields may no longer vary
        st.session_state[K("pc_axes")] = [a for a in st.session_state[K("pc_axes")] if a in every]
    a, b = st.columns([1, 3])
    metric = a.selectbox("Metric", metrics, index=metrics.index(default), key=K("pc_metric"))
    axes = b.multiselect(
        "Hyperparameters",
        every,
        default=every[: cv.DEFAULT_AXES],
        key=K("pc_axes"),
        help="The spec fields that differ between the runs, as axes in this order.",
    )
    st.plotly_chart(cv.parallel(runs, metric, axes), key=K("parallel"), config={"displaylogo": False})


def main() -> None:
    st.title("Compare")
    ids = choose_runs()
    if not ids:
        st.info(
            "Choose two or more runs above, or select them on the **Runs** page and press Compare.",
            icon=":material/info:",
        )
        return
    runs = cv.fresh_runs(ids)
    groups = choose_grouping(runs)
    # Only the open tab runs (on_change="rerun"): the hidden ones cost nothing, in the server or the browser.
    curves_tab, params_tab, diff_tab, summary_tab = st.tabs(
        ["Curves", "Hyperparameters", "Spec diff", "Summary"], key=K("tab"), on_change="rerun"
    )
    if curves_tab.open is not False:
        with curves_tab:
            curves(runs, ids, groups)
    if params_tab.open:
        with params_tab:
            hyperparameters(runs)
    if diff_tab.open:
        with diff_tab:
            spec_diff(runs)
    if summary_tab.open:
        with summary_tab:
            summary(runs, groups)
            evaluations_view.compared(runs)  # the runs' scores on the same other datasets


def spec_diff(runs) -> None:
    only = st.toggle("Differences only", value=True, key=K("diff_only"))
    diff = cv.spec_diff(runs, only)
    if diff.empty:
        st.caption("The specs are identical." if only else "No fields.")
    else:
        st.dataframe(diff, hide_index=True, width="stretch", height=min(38 + 35 * len(diff), 700))


def choose_objective(runs) -> str | None:
    metrics = sorted({k for r in runs for k in r.metrics if not k.startswith(SYSTEM_PREFIX)})
    if not metrics:
        return None
    default = cv.objective(runs)
    return st.selectbox(
        "Objective",
        metrics,
        index=metrics.index(default) if default in metrics else 0,
        key=K("objective"),
        help="Best, min, max and last of this metric over every stored point (by default the metric the runs monitor).",
    )


def summary(runs, groups: list[cg.Group] | None) -> None:
    if groups is not None:
        table = cg.group_summary(groups)
        st.dataframe(table, hide_index=True, width="stretch", column_order=cg.SUMMARY_COLUMNS)
    else:
        table = cv.summary_table(runs, choose_objective(runs))
        number = st.column_config.NumberColumn(format="%.4f")
        st.dataframe(
            table,
            hide_index=True,
            width="stretch",
            column_config={
                **dict.fromkeys(cv.OBJECTIVE_COLUMNS, number),
                "best val/acc": number,
                "lowest val/loss": number,
                "test/acc": number,
                "test/loss": number,
                "time (s)": st.column_config.NumberColumn(format="%.1f"),
            },
        )
    st.download_button(
        "Summary as CSV",
        table.to_csv(index=False).encode(),
        file_name="compare-summary.csv",
        mime="text/csv",
        icon=":material/download:",
        key=K("summary_csv"),
    )


main()
