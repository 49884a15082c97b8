"""The New run page's sources (app/app_pages/new_run.py): the uploaded dataset to train on and the finished run whose
weights to start from, both of the current project (a run reads only its project's datasets and checkpoints),
`?dataset=` choosing a dataset when the page opens, and the hints before Launch from runs the user may see."""

from __future__ import annotations

import streamlit as st

from app.present import new_run_hints
from app.present import text as f
from app.services.artifacts import artifact_root
from app.ui import frame, project_context, queries, spec_form
from core import catalog
from core.names import queue_for
from db.types import DatasetRecord

K = frame.page_state("nr")  # the New run page's session state
NO_DATASET = "— none (use data.name / data.path) —"


def hints(values: dict) -> new_run_hints.Hints:
    """What is said before Launch (new_run_hints.hints), learnt from the similar runs of the projects the user may
    read only: the memory estimate names the run it comes from."""
    engine = queries.engine()
    similar = [r for r in new_run_hints.similar_runs(engine, values) if project_context.may_read(r.project)]
    n = new_run_hints.processes_of(values)
    return new_run_hints.Hints(
        new_run_hints.worker_hint(queue_for(values.get("device"), n), engine, n),
        new_run_hints.memory_estimate(similar, values),
        new_run_hints.time_estimate(similar, values.get("train.epochs")),
    )


def datasets() -> list[DatasetRecord]:
    """The current project's uploaded datasets."""
    return queries.datasets(project_context.project())


def chosen_dataset() -> DatasetRecord | None:
    """The uploaded dataset chosen in the form, or None."""
    return next((d for d in datasets() if d.name == st.session_state.get(K("dataset"))), None)


def dataset_from_query() -> None:
    """`?dataset=<name>` (a built-in dataset, or an uploaded one that is ready) chooses it, once: the parameter
    is then dropped, so later reruns keep the user's choice."""
    name = st.query_params.get("dataset")
    if not name:
        return
    del st.query_params["dataset"]
    if name in spec_form.by_path("data.name").options and not catalog.is_folder(name):  # built in: chosen as is
        st.session_state[spec_form.key("data.name")] = name
        st.session_state[K("dataset")] = NO_DATASET
    elif any(d.name == name and d.status == "ready" for d in datasets()):
        st.session_state[K("dataset")] = name
    else:
        st.warning(
            f"No dataset {f.md_text(repr(name))} is ready to train on: choose one below.", icon=":material/dataset:"
        )


def apply_weights(sources: dict[str, new_run_hints.WeightSource]) -> None:
    """On choosing a run's weights: its best checkpoint, its model and the suggested transfer settings fill the
    form, and the new run will be linked to it; on clearing it, what the choice filled is undone."""
    chosen = sources.get(st.session_state.get(K("weights_from")))
    previous = st.session_state.pop(K("weights_chosen"), None)  # (run id, checkpoint path) it filled in
    if previous is not None:
        run_id, path = previous
        if st.session_state.get(spec_form.key("model.weights_file")) == path:
            spec_form.fill({"model": {"weights_file": None, "transfer": "scratch", "unfreeze_at_epoch": None}})
        if st.session_state.get(K("parent")) == run_id:
            st.session_state[K("parent")] = None
    if chosen is None or chosen.path is None:
        return
    spec_form.fill(new_run_hints.suggestion(chosen))
    st.session_state[K("parent")] = chosen.run.id
    st.session_state[K("weights_chosen")] = (chosen.run.id, str(chosen.path))


def weights_picker() -> None:
    """A finished run of the project whose best checkpoint the new run starts from."""
    root = artifact_root()
    project = project_context.project()  # a run starts only from its own project's checkpoints
    sources = {s.run.id: s for s in new_run_hints.weight_sources(queries.engine(), root, project)}
    if st.session_state.get(K("weights_from")) not in (None, *sources):  # a run of the project switched from
        del st.session_state[K("weights_from")]
    st.selectbox(
        "Start from a run's weights",
        list(sources),
        key=K("weights_from"),
        index=None,
        placeholder="a finished run…",
        format_func=lambda i: sources[i].label() if i in sources else i,
        on_change=apply_weights,
        args=(sources,),
        help="A finished run's best checkpoint becomes model.weights_file (its model too), and the new "
        "run is linked to it.",
    )
    chosen = sources.get(st.session_state.get(K("weights_from")))
    if chosen is not None and chosen.path is None:
        st.warning(
            f"The best checkpoint of {f.md_text(chosen.run.name)} is only in the object store: the weights "
            f"must be on this host (under {f.md_text(root)}) to start from them.",
            icon=":material/cloud:",
        )
    elif chosen is not None:
        st.caption(
            f"Starts from the best checkpoint of {f.md_text(chosen.run.name)}, and the new run is linked to "
            f"it. {new_run_hints.SUGGESTION_NOTE}"
        )


def dataset_picker() -> None:
    """One of the project's uploaded datasets, ready to train on."""
    ready = [d for d in datasets() if d.status == "ready"]
    options = [NO_DATASET] + [d.name for d in ready]
    if st.session_state.get(K("dataset"), NO_DATASET) not in options:  # a dataset of the project switched from
        del st.session_state[K("dataset")]
    st.selectbox(
        "Uploaded dataset",
        options,
        key=K("dataset"),
        help="An ImageFolder dataset of this project, uploaded on the Datasets page: sets data.name="
        f"{catalog.FOLDER_DATASET} and data.path to its stored folder.",
    )
