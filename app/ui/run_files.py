"""The Run page's Artifacts tab: the run's files (checkpoints, exports with their parity and latency, the bundle),
each with its download and shareable link, the files later ones superseded, the metrics as CSV and JSON Lines, and
"Export now" for a finished run's owner."""

from __future__ import annotations

import pandas as pd
import streamlit as st

from app import auth
from app.present import text as f
from app.services import jobs
from app.services.artifacts import artifact_problem, latest_by_kind
from app.services.owners import owner_label
from app.ui import external_view, frame, project_context, queries
from app.web import downloads
from core.names import (
    BUNDLE,
    CHECKPOINT_BEST,
    CHECKPOINT_LAST,
    EXPORT_FORMATS,
    EXPORT_REPORT,
    LR_FINDER,
    MISCLASSIFIED,
    SAMPLE_GRID,
    SUCCESS_STATUSES,
)
from db.types import RunRecord

FILES_SHOWN = 200  # a script's files listed, by path (each row has its download)
ARTIFACT_LABELS = {
    CHECKPOINT_BEST: "Best checkpoint (.pt)",
    CHECKPOINT_LAST: "Last checkpoint (.pt)",
    "torchscript": "TorchScript (.ts)",
    "onnx": "ONNX (.onnx)",
    "pt2": "torch.export (.pt2)",
    BUNDLE: "Bundle (.zip: model + preprocessing)",
    EXPORT_REPORT: "Export report (export.json)",
    SAMPLE_GRID: "Sample grid (.png)",
    MISCLASSIFIED: "Most confident mistakes (.png)",
    LR_FINDER: "LR range test (lr_finder.json: its loss curve and suggested learning rate)",
}


def _report_row(kind: str, meta: dict) -> dict:
    parity, latency = meta.get("parity") or {}, meta.get("latency_ms") or {}
    return {
        "max |Δlogit|": parity.get("max_abs_diff"),
        "top-1 agreement %": parity.get("top1_agreement"),
        "parity": "passed" if parity.get("passed") else ("failed" if parity else ""),
        **{f"latency {k} (ms)": v for k, v in latency.items()},
    }


def artifacts_panel(r: RunRecord) -> None:
    if r.external:  # the files its script logged, by their paths
        script_files(r)
        metrics_downloads(r)
        return
    every = queries.artifacts(r.id)
    arts = latest_by_kind(every)
    rows = [a for kind, a in arts.items() if kind != SAMPLE_GRID]
    if not rows:
        st.caption("No files yet: checkpoints appear after the first epoch, exports at the end.")
    for a in sorted(rows, key=lambda a: list(ARTIFACT_LABELS).index(a.kind) if a.kind in ARTIFACT_LABELS else 99):
        problem = artifact_problem(a)
        left, right = st.columns([3, 1], vertical_alignment="center")
        with left:
            st.markdown(
                f"**{f.md_text(ARTIFACT_LABELS.get(a.kind, a.kind))}** · {f.size(a.size)}"
                + (f" · sha256 {f.code_span(a.sha256[:12])}" if a.sha256 else "")
            )
            st.page_link(frame.ARTIFACT, label="Shareable link", query_params={"id": a.id}, icon=":material/link:")
            if a.kind in EXPORT_FORMATS and a.meta:
                st.dataframe(pd.DataFrame([_report_row(a.kind, dict(a.meta))]), hide_index=True, width="stretch")
        if problem is not None:
            right.caption(f.md_text(problem))
        else:  # by opaque artifact id only, streamed from the artifact store by the download route
            with right:
                downloads.control(a, key=f"run.dl.{a.id}", width="stretch")
    earlier_files(every, arts)
    metrics_downloads(r)


def metrics_downloads(r: RunRecord) -> None:
    """The run's metrics as CSV and as JSON Lines, built when clicked."""
    csv_col, jsonl_col = st.columns(2)
    csv_col.download_button(
        "Metrics as CSV",
        lambda: queries.metrics_csv(r.id),
        file_name=f"{r.id}-metrics.csv",
        mime="text/csv",
        icon=":material/table_view:",
        key=f"run.csv.{r.id}",
    )
    jsonl_col.download_button(
        "Metrics as JSON Lines",
        lambda: queries.metrics_jsonl(r.id),
        file_name=f"{r.id}-metrics.jsonl",
        mime="application/jsonl",
        icon=":material/data_object:",
        key=f"run.jsonl.{r.id}",
    )


def script_files(r: RunRecord) -> None:
    """The files a script logged (mlflow.log_artifact), by their relative paths, each with its download and
    shareable link: the newest file of each path (at most FILES_SHOWN), earlier ones of a path under them."""
    every = queries.artifacts(r.id)
    latest = {_path(a): a for a in sorted(every, key=lambda a: a.created_at)}
    if not latest:
        st.caption("No files: the script logged none (`mlflow.log_artifact`).")
        return
    paths = sorted(latest)
    for path in paths[:FILES_SHOWN]:
        a = latest[path]
        problem = artifact_problem(a)
        left, right = st.columns([3, 1], vertical_alignment="center")
        left.markdown(
            f"{f.code_span(path)} · {f.size(a.size)} · {a.created_at:%Y-%m-%d %H:%M}"
            + (f" · sha256 {f.code_span(a.sha256[:12])}" if a.sha256 else "")
        )
        with left:
            st.page_link(frame.ARTIFACT, label="Shareable link", query_params={"id": a.id}, icon=":material/link:")
        if problem is not None:
            right.caption(f.md_text(problem))
        else:
            with right:
                downloads.control(a, key=f"run.dl.{a.id}", width="stretch")
    if len(paths) > FILES_SHOWN:
        st.caption(f"The first {FILES_SHOWN} of {len(paths)} files by path: the MLflow client lists them all.")
    earlier_files(every, {a.id: a for a in latest.values()}, label=_path)


def _path(a) -> str:
    """A script's file's relative path, as it logged it (its kind when it gave none)."""
    return str((a.meta or {}).get("path") or a.kind)


def earlier_files(every: list, latest: dict, label=None) -> None:
    """Files a later export (or checkpoint) superseded on the list above: they keep their bytes and their
    links, newest first."""
    newest = {a.id for a in latest.values()}
    older = [a for a in reversed(every) if a.id not in newest and a.kind not in (SAMPLE_GRID, MISCLASSIFIED)]
    if not older:
        return
    with st.expander(f"Earlier files ({len(older)}): unchanged, still downloadable", icon=":material/history:"):
        for a in older:
            st.page_link(
                frame.ARTIFACT,
                query_params={"id": a.id},
                icon=":material/link:",
                label=f"{f.md_text(label(a) if label else ARTIFACT_LABELS.get(a.kind, a.kind))} · "
                f"{a.created_at:%Y-%m-%d %H:%M:%S} · "
                f"{f.size(a.size)}" + (f" · sha256 {f.md_text(a.sha256[:12])}" if a.sha256 else ""),
            )


def export_panel(r: RunRecord) -> None:
    """'Export now' for a finished run, asked of a jobs worker (torch stays out of the UI). Only the run's owner
    or an admin may (jobs.export_now refuses the others; here the form is left out for them, with why)."""
    if r.external:
        external_view.not_applicable("export")
        return
    if r.status not in (*SUCCESS_STATUSES, "cancelled"):
        return
    user = project_context.acting()
    if not auth.can_modify(user, r):
        owner = f.md_text(owner_label(r.owner, queries.engine()) or "its owner")
        st.caption(
            f":material/lock: **Export now** is for {owner} or an admin: it adds files to the run. "
            "Its files above stay downloadable by everyone; clone the run to make your own."
        )
        return
    exported = [k for k in latest_by_kind(queries.artifacts(r.id)) if k in EXPORT_FORMATS]
    with st.form(f"run.export.{r.id}", border=True):
        st.markdown("**Export now** — (re)make verified exports from a checkpoint")
        a, b = st.columns([3, 1])
        formats = a.multiselect(
            "Formats",
            list(EXPORT_FORMATS),
            default=exported or ["onnx"],
            key=f"run.export_fmt.{r.id}",
            help="Each export is written to a new folder and registered as new files: "
            "earlier exports never change and stay downloadable (Earlier files).",
        )
        ck = b.selectbox("Checkpoint", ["best", "last"], key=f"run.export_ck.{r.id}")
        go = st.form_submit_button("Export now", icon=":material/deployed_code:")
    done_key = f"run.export_done.{r.id}"
    if go:
        with st.spinner("Exporting and verifying parity in a separate process…"):
            try:
                st.session_state[done_key] = jobs.export_now(r.id, formats, ck, by=user, engine=queries.engine())
            except auth.PermissionDenied as e:  # rights changed since the page was drawn
                st.session_state[done_key] = (False, str(e))
        queries.clear()
        st.rerun()  # the list above shows the new files
    if done_key in st.session_state:
        ok, output = st.session_state.pop(done_key)
        (st.success if ok else st.error)(
            "Export verified" if ok else "Export failed", icon=":material/check_circle:" if ok else ":material/error:"
        )
        if output:
            st.code(output[-3000:], language="text")
