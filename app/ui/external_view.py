"""The Run page's panels for a run logged by a person's own script through the MLflow client (app/present/external.py
says what such a run is): where it comes from, its params and tags, why it is lost, and the one line each section of
torchdeck's own runs says instead when it does not apply (no spec, no worker, no export)."""

from __future__ import annotations

import pandas as pd
import streamlit as st

from app.present import external as ext
from app.present import text as f
from db.types import RunRecord


def source_caption(r: RunRecord) -> None:
    """Under the title: logged by a script, its name, git commit and user as the MLflow client tagged them."""
    bits = [f"{label} {f.code_span(value)}" for label, value in ext.source_line(r.spec)]
    st.caption(":material/terminal: logged by a script through the MLflow client" + "".join(f" · {b}" for b in bits))


def actions_note(r: RunRecord) -> None:
    """Where a torchdeck run has Clone, Re-run, Seeds and Cancel: why this run has none of them."""
    st.caption(f":material/info: {ext.NO_SPEC}" + ("" if r.finished else f" {ext.NO_CANCEL}"))


def worker_caption() -> str:
    """The status panel's worker and device line for a script's run."""
    return f"worker: its {ext.SOURCE_LABEL}  \n{ext.NO_WORKER}"


def progress_line(r: RunRecord, now) -> str:
    """In place of a progress bar (a script says nothing of its progress): how long it ran and when it last wrote."""
    text = f"elapsed {f.seconds(f.duration_s(r))}"
    if r.heartbeat_at is not None and not r.finished:
        text += f" · last written {f.seconds((now - r.heartbeat_at).total_seconds())} ago"
    return text


def lost_warning(r: RunRecord) -> None:
    st.warning(ext.silent_text(r.heartbeat_at, f.now()), icon=":material/heart_broken:")


def not_applicable(kind: str) -> None:
    """One line: the section does not apply to a run logged by a script (ext.NOT_APPLICABLE's `kind`)."""
    st.caption(f":material/info: {ext.NOT_APPLICABLE[kind]}")


def _table(values: dict[str, str], key: str, value: str = "value") -> pd.DataFrame:
    return pd.DataFrame({key: list(values), value: list(values.values())}, columns=[key, value])


def params_panel(r: RunRecord) -> None:
    """The Parameters tab: the params the script logged (like a spec's fields), its own tags, and the MLflow
    client's system tags (where it comes from) apart."""
    not_applicable("spec")
    params = ext.params(r.spec)
    own, system = ext.tags(r.spec)
    st.markdown("**Parameters**")
    if params:
        st.dataframe(_table(params, "param"), hide_index=True, width="stretch", key=f"run.params.{r.id}")
    else:
        st.caption("No params logged (`mlflow.log_param`).")
    st.markdown("**Tags**")
    if own:
        st.dataframe(_table(own, "tag"), hide_index=True, width="stretch", key=f"run.script_tags.{r.id}")
    else:
        st.caption("No tags of the script's own (`mlflow.set_tag`).")
    st.markdown("**Source**")
    named = dict(ext.source(r.spec))
    rest = {k: v for k, v in system.items() if k not in ext.SOURCE_TAGS and k != ext.NAME_TAG}
    if named or rest:
        st.dataframe(
            _table({**named, **rest}, "of the run"), hide_index=True, width="stretch", key=f"run.source.{r.id}"
        )
    else:
        st.caption("The MLflow client tagged no source (script, git commit, user).")
