"""The Run page's Evaluations (in the "Diagnosis & evaluation" tab): the run's verified ONNX export scored on another
registered dataset by a jobs worker (app/services/evaluations.py), and the run's evaluations with their scores,
per-class table and confusion matrix. Anyone who may read the dataset may evaluate any run (it only reads its file)."""

from __future__ import annotations

import pandas as pd
import streamlit as st

from app.present import figures
from app.present import test_scores as ts
from app.present import text as f
from app.services import evaluations
from app.services.owners import owner_labels
from app.services.predict import verified_onnx
from app.ui import project_context, queries
from db.evaluations import EvaluationRecord
from db.types import RunRecord

LABELS = {"acc": "accuracy", "acc_top5": "top-5", "f1_macro": "macro F1", "loss": "loss"}


def show(r: RunRecord) -> None:
    """The Evaluate form (a finished run with a verified ONNX export) and the run's evaluations."""
    if not r.finished:
        return
    st.markdown("#### Evaluations")
    onnx, why = verified_onnx(r.status, queries.artifacts(r.id))
    if onnx is None:
        st.caption(f"Evaluate on other data needs a verified ONNX export: {f.md_text(why)}")
    else:
        _form(r)
    done = evaluations.list_for_run(r.id, queries.engine())
    if not done:
        st.caption("No evaluation yet: score this run's export on a newer test set or another site's images.")
        return
    st.dataframe(_table(done), hide_index=True, width="stretch")
    for e in done[:10]:
        with st.expander(f"{f.md_text(e.dataset)} · {e.created_at:%Y-%m-%d %H:%M}", icon=":material/grid_on:"):
            _details(r, e)


def _form(r: RunRecord) -> None:
    names = [c.name for c in evaluations.choices(queries.engine(), by=project_context.acting())]
    done_key = f"run.evaluate_done.{r.id}"
    with st.form(f"run.evaluate.{r.id}", border=True):
        st.markdown("**Evaluate** — score the verified ONNX export on another dataset")
        dataset = st.selectbox(
            "Dataset",
            names,
            key=f"run.evaluate_data.{r.id}",
            help="A built-in dataset or an uploaded one (Datasets page); its class folders must be named as the "
            "model's classes (the model's other classes may be absent).",
        )
        go = st.form_submit_button("Evaluate", icon=":material/fact_check:")
    if go and dataset:
        with st.spinner(f"Scoring the export on {f.md_text(dataset)} on a jobs worker…"):
            record, message = evaluations.evaluate(r.id, dataset, by=project_context.acting(), engine=queries.engine())
        st.session_state[done_key] = (record is not None, message)
    if done_key in st.session_state:
        ok, message = st.session_state.pop(done_key)
        (st.success if ok else st.error)(
            f.md_text(message), icon=":material/check_circle:" if ok else ":material/error:"
        )


def _table(done: list[EvaluationRecord]) -> pd.DataFrame:
    rows, who = [], owner_labels({e.created_by for e in done}, queries.engine())
    for e in done:
        row = {"dataset": e.dataset, "when": e.created_at.strftime("%Y-%m-%d %H:%M"), "images": e.details.get("images")}
        row.update({LABELS.get(k, k): v for k, v in e.metrics.items()})
        row |= {"fingerprint": e.fingerprint[:12], "by": who.get(e.created_by, e.created_by)}
        rows.append(row)
    return pd.DataFrame(rows)


def _details(r: RunRecord, e: EvaluationRecord) -> None:
    data = dict(e.details)
    st.caption(
        f"{data.get('images', '?')} images of {f.md_text(e.dataset)} ({f.code_span(e.dataset_path or 'built in')}, "
        f"fingerprint {f.code_span(e.fingerprint[:12])}), export artifact {f.code_span(e.artifact_id)}"
    )
    left, right = st.columns(2)
    if data.get("class_names"):
        left.dataframe(ts.class_frame(data), hide_index=True, width="stretch")
    if data.get("confusion"):
        right.plotly_chart(
            figures.confusion_figure(data["confusion"], data["class_names"], uirevision=f"{r.id}:eval-{e.id}"),
            key=f"run.eval_cm.{e.id}",
            config={"displaylogo": False},
        )
    elif data.get("top_confusions"):
        right.dataframe(pd.DataFrame(data["top_confusions"], columns=["true", "predicted", "count"]), hide_index=True)


def compared(runs: list[RunRecord]) -> None:
    """The Compare page's evaluations: per dataset (and fingerprint) any of the runs was evaluated on, each run's
    newest scores on it side by side."""
    rows = evaluations.compare([r.id for r in runs], queries.engine())
    if not rows:
        return
    st.markdown("**Evaluations on other data**")
    label = {r.id: r.name or r.id[:8] for r in runs}
    table = pd.DataFrame(rows)
    renamed = {}
    for col in table.columns:
        run_id, _, metric = col.partition("/")
        if metric:
            renamed[col] = f"{label.get(run_id, run_id[:8])}: {LABELS.get(metric, metric)}"
    st.dataframe(table.rename(columns=renamed), hide_index=True, width="stretch")
