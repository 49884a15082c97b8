"""Panels of the Run page: status and progress, diagnosis, evaluation, events, samples, artifacts.
Each takes a RunRecord and draws; the page decides which of them refresh live."""

from __future__ import annotations

import pandas as pd
import streamlit as st

from app import services
from app import charts, jobs
from app import fmt as f
from app.ui import frame, queries
from core.config import RunSpec
from core.names import (
    BUNDLE,
    CHECKPOINT_BEST,
    CHECKPOINT_LAST,
    EXPORT_FORMATS,
    EXPORT_REPORT,
    SAMPLE_GRID,
    SUCCESS_STATUSES,
)
from db.types import EventRecord, RunRecord

ARTIFACT_LABELS = {
    CHECKPOINT_BEST: "Best checkpoint (.pt)", CHECKPOINT_LAST: "Last checkpoint (.pt)",
    "torchscript": "TorchScript (.ts)", "onnx": "ONNX (.onnx)", "pt2": "torch.export (.pt2)",
    BUNDLE: "Bundle (.zip: model + preprocessing)", EXPORT_REPORT: "Export report (export.json)",
    SAMPLE_GRID: "Sample grid (.png)",
}


class EventLog:
    """A run's events held in session state; each refresh asks only for events after the last id."""

    def __init__(self) -> None:
        self.events: list[EventRecord] = []

    @classmethod
    def of(cls, run_id: str) -> list[EventRecord]:
        k = f"run.events.{run_id}"
        log = st.session_state.setdefault(k, cls())
        after = log.events[-1].id if log.events else 0
        log.events.extend(queries.events(run_id, after_id=after))
        return log.events


def status_panel(r: RunRecord) -> None:
    a, b, c, d = st.columns([1.2, 3, 1.5, 1.5])
    a.markdown(f"#### {f.status_md(r.status)}")
    p = r.progress or (1.0 if r.status == "completed" else 0.0)
    eta = f.eta_s(r)
    b.progress(min(max(p, 0.0), 1.0), text=f"{p:.0%} · elapsed {f.seconds(f.duration_s(r))}"
               + (f" · ETA {f.seconds(eta)}" if eta is not None else ""))
    metric, value = f.best(r)
    best_epoch = ((r.summary or {}).get("best") or {}).get("epoch")
    c.metric(f"best {metric}" if metric else "best", f"{value:.4f}" if value is not None else "–",
             help=f"at epoch {best_epoch}" if best_epoch else None)
    d.caption(f"worker `{r.worker_id or '–'}`  \ndevice `{r.device or '–'}` · attempt {r.attempt}")
    if r.status == "queued":
        waiting_for(services.spec_of(r).resource)
    if r.degraded:
        st.warning(f"Incomplete record: {r.degraded}", icon=":material/database_off:")
    if r.status == "lost":
        st.warning("The worker running this run stopped heartbeating; it will be re-queued and resume from its last "
                   "checkpoint.", icon=":material/heart_broken:")
    if r.cancel_requested and not r.finished:
        st.info("Cancel requested: the run stops after its current step.", icon=":material/stop_circle:")
    if r.error:
        st.error(r.error, icon=":material/error:")


def waiting_for(queue: str) -> None:
    """Which live workers would take a run from `queue`, or that none would and how to fix it."""
    status = services.queue_status(queue, engine=queries.engine())
    text = status.message()
    if status.served:
        st.info(text[0].upper() + text[1:], icon=":material/hourglass_top:")
    else:
        st.warning(text[0].upper() + text[1:], icon=":material/hourglass_disabled:")


def diagnosis_panel(events: list[EventRecord]) -> None:
    found = [e for e in events if e.kind == "diagnosis" or (e.kind == "lifecycle" and e.level == "error")]
    if not found:
        st.success("No problems found so far: loss finite, gradients in range, no data bottleneck.",
                   icon=":material/health_and_safety:")
        return
    for e in found:
        data = e.data or {}
        show = st.error if e.level == "error" else st.warning
        advice = data.get("advice")
        show(f"**{e.code or data.get('code') or e.kind}** — {e.message}" + (f"\n\n**What to do:** {advice}" if advice else ""),
             icon=":material/troubleshoot:")
        if data.get("traceback"):
            with st.expander("traceback"):
                st.code(data["traceback"], language="text")


def evaluation_panel(r: RunRecord, events: list[EventRecord]) -> None:
    evals = [e for e in events if e.kind == "evaluation" and (e.data or {}).get("confusion")]
    if not evals:
        st.caption("The confusion matrix and per-class accuracy appear after the first validation epoch.")
        return
    last = evals[-1].data
    names = last.get("class_names") or [str(i) for i in range(len(last["confusion"]))]
    st.caption(f"After epoch {last.get('epoch', '?')} of {len(evals)} evaluated.")
    left, right = st.columns(2)
    left.plotly_chart(charts.confusion_figure(last["confusion"], names, uirevision=f"{r.id}:cm"),
                      key=f"run.cm.{r.id}", config={"displaylogo": False})
    right.plotly_chart(charts.bar_figure("Per-class accuracy (validation)", names, last.get("per_class_acc", []),
                                         y_title="accuracy", uirevision=f"{r.id}:pc", percent=True),
                       key=f"run.pc.{r.id}", config={"displaylogo": False})


def events_panel(events: list[EventRecord]) -> None:
    if not events:
        st.caption("No events yet.")
        return
    df = pd.DataFrame([{"time": e.time, "kind": e.kind, "level": e.level, "code": e.code or (e.data or {}).get("code"),
                        "message": e.message} for e in reversed(events)])
    st.dataframe(df, hide_index=True, width="stretch", height=min(38 + 35 * len(df), 420),
                 column_config={"time": st.column_config.DatetimeColumn("time", format="HH:mm:ss")})


def samples_panel(r: RunRecord) -> None:
    grids = [a for a in queries.artifacts(r.id) if a.kind == SAMPLE_GRID]
    image = None
    if grids and services.artifact_problem(grids[-1]) is None:
        try:
            image = services.read_artifact(grids[-1].id, engine=queries.engine())  # from the artifact store
        except (LookupError, OSError):
            image = None
    if image is None:
        st.caption("The labelled sample grid appears once the run has loaded its data (pre-flight).")
        return
    st.image(image, caption="Training samples with their labels: a mismatch here is the most hidden bug")


def spec_panel(r: RunRecord) -> None:
    text = RunSpec.model_validate(dict(r.spec)).to_yaml()
    st.download_button("Download spec (YAML)", text, file_name=f"{r.name}.yaml", mime="application/yaml",
                       icon=":material/download:", key=f"run.spec_dl.{r.id}")
    st.code(text, language="yaml")


def _report_row(kind: str, meta: dict) -> dict:
    parity, latency = meta.get("parity") or {}, meta.get("latency_ms") or {}
    return {"max |Δlogit|": parity.get("max_abs_diff"), "top-1 agreement %": parity.get("top1_agreement"),
            "parity": "passed" if parity.get("passed") else ("failed" if parity else ""),
            **{f"latency {k} (ms)": v for k, v in latency.items()}}


def artifacts_panel(r: RunRecord) -> None:
    arts = services.latest_by_kind(queries.artifacts(r.id))
    rows = [a for kind, a in arts.items() if kind != SAMPLE_GRID]
    if not rows:
        st.caption("No files yet: checkpoints appear after the first epoch, exports at the end.")
    for a in sorted(rows, key=lambda a: list(ARTIFACT_LABELS).index(a.kind) if a.kind in ARTIFACT_LABELS else 99):
        problem = services.artifact_problem(a)
        left, right = st.columns([3, 1], vertical_alignment="center")
        with left:
            st.markdown(f"**{ARTIFACT_LABELS.get(a.kind, a.kind)}** · {f.size(a.size)}"
                        + (f" · sha256 `{a.sha256[:12]}`" if a.sha256 else ""))
            st.page_link(frame.ARTIFACT, label="Shareable link", query_params={"id": a.id}, icon=":material/link:")
            if a.kind in EXPORT_FORMATS and a.meta:
                st.dataframe(pd.DataFrame([_report_row(a.kind, dict(a.meta))]), hide_index=True, width="stretch")
        if problem is not None:
            right.caption(problem)
        else:  # by opaque artifact id only: the service streams it from the artifact store
            right.download_button("Download", _reader(a.id), file_name=services.artifact_filename(a),
                                  key=f"run.dl.{a.id}", icon=":material/download:", width="stretch")
    st.download_button("Metrics as CSV", lambda: queries.metrics_csv(r.id), file_name=f"{r.id}-metrics.csv",
                       mime="text/csv", icon=":material/table_view:", key=f"run.csv.{r.id}")


def _reader(artifact_id: str):
    return lambda: services.read_artifact(artifact_id, engine=queries.engine())  # read on click, not on every rerun


def export_panel(r: RunRecord) -> None:
    """'Export now' for a finished run: runs `torchdeck export` in a subprocess (torch stays out of the UI)."""
    if r.status not in (*SUCCESS_STATUSES, "cancelled"):
        return
    exported = [k for k in services.latest_by_kind(queries.artifacts(r.id)) if k in EXPORT_FORMATS]
    with st.form(f"run.export.{r.id}", border=True):
        st.markdown("**Export now** — (re)make verified exports from a checkpoint")
        a, b = st.columns([3, 1])
        formats = a.multiselect("Formats", list(EXPORT_FORMATS), default=exported or ["onnx"],
                                key=f"run.export_fmt.{r.id}",
                                help="The export folder is written anew: formats left out are removed from it.")
        ck = b.selectbox("Checkpoint", ["best", "last"], key=f"run.export_ck.{r.id}")
        go = st.form_submit_button("Export now", icon=":material/deployed_code:")
    done_key = f"run.export_done.{r.id}"
    if go:
        with st.spinner("Exporting and verifying parity in a separate process…"):
            st.session_state[done_key] = jobs.export_now(r.id, formats, ck)
        queries.clear()
        st.rerun()  # the list above shows the new files
    if done_key in st.session_state:
        ok, output = st.session_state.pop(done_key)
        (st.success if ok else st.error)("Export verified" if ok else "Export failed",
                                         icon=":material/check_circle:" if ok else ":material/error:")
        if output:
            st.code(output[-3000:], language="text")
