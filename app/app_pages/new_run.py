"""New run: a form for every RunSpec field, presets, YAML upload/download, clone, pre-flight, launch; and a
sweep of it (app/ui/new_sweep.py: a sweep box beside numeric and choice fields, the Sweep section, sweep YAML).
`?dataset=<name>` opens it with that dataset chosen (built-in or uploaded). A finished run's best checkpoint can be
the weights to start from (the new run is linked to it); before Launch, a line says which worker takes the run and,
from similar finished runs, its memory and time (app/present/new_run_hints.py).

The choices that decide which fields matter (dataset, model, transfer mode, optimizer, schedule, clipping;
app/present/form_rules.py) come first, outside the st.form, so that changing one reshapes the form at once; the form
then shows, per section, the fields that matter, the rarely changed ones under "Advanced"."""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

import streamlit as st

from app import auth
from app.present import external, form_rules
from app.present import text as f
from app.present.form_schema import errors_by_field, flatten, validate
from app.services import jobs
from app.services.broker import run_queue
from app.services.runs import submit
from app.ui import frame, new_sweep, preflight_view, project_context, queries, run_view, spec_form, sweep_fields
from app.ui import new_run_sources as sources
from core import catalog
from core.config import RunSpec, SpecError
from core.names import PREFLIGHT_OVERFIT_BATCH, PREFLIGHT_OVERFIT_S, PREFLIGHT_OVERFIT_STEPS

K = frame.page_state("nr")
PRESETS = Path(__file__).resolve().parents[2] / "configs"
NO_DATASET = sources.NO_DATASET


def load_into_form(spec: dict, source: str, parent: str | None = None) -> None:
    """`source` says, in Markdown, where the form's values came from (a user's names in it escaped)."""
    spec_form.fill(spec)
    st.session_state[K("source")] = source
    st.session_state[K("parent")] = parent  # only a clone links the new run to another


def forget_form() -> None:
    for name in ("source", "parent", "preflight", "weights_chosen"):
        st.session_state.pop(K(name), None)
    new_sweep.forget()


def presets_bar() -> None:
    files = sorted(PRESETS.glob("*.yaml"))
    left, mid, right = st.columns([2, 1, 3], vertical_alignment="bottom")
    choice = left.selectbox(
        "Preset", [p.stem for p in files], key=K("preset"), index=None, placeholder="choose a preset…"
    )
    if mid.button("Load preset", disabled=choice is None, key=K("load_preset")):
        try:
            spec = RunSpec.from_yaml((PRESETS / f"{choice}.yaml").read_text())
            load_into_form(spec.model_dump(mode="json"), f"preset {choice}")
        except SpecError as e:
            st.error(f.md_text(e, multiline=True))
    upload = right.file_uploader("Fill from a YAML spec", type=["yaml", "yml"], key=K("upload"))
    if upload is not None and st.session_state.get(K("upload_id")) != upload.file_id:
        st.session_state[K("upload_id")] = upload.file_id
        try:
            spec = RunSpec.from_yaml(upload.getvalue().decode("utf-8", errors="replace"))
        except SpecError as e:
            st.session_state[K("upload_errors")] = e.errors
        else:
            st.session_state.pop(K("upload_errors"), None)
            load_into_form(spec.model_dump(mode="json"), f"file {f.md_text(upload.name)}")
    for loc, msg in st.session_state.get(K("upload_errors"), []):
        where = f.md_text(upload.name) if upload else "YAML"  # the file's name and keys, the value it gave: text
        st.error(f"{where} — {f.md_text(loc)}: {f.md_text(msg, multiline=True)}", icon=":material/error:")


def clone_from_query() -> None:
    """`?clone=<run id>` pre-fills the form from that run, once: the parameter is then dropped, so
    later reruns keep the user's edits."""
    run_id = st.query_params.get("clone")
    if not run_id:
        return
    del st.query_params["clone"]
    r = queries.run(run_id)
    if r is None or not project_context.may_read(r.project):  # none, or of a project the user may not see: alike
        st.warning(f"no run {f.md_text(repr(run_id))} to clone")
        return
    if r.external:  # the params and tags a script logged are no spec
        st.warning(f"Cannot clone {f.md_text(r.name)}: {external.NO_SPEC}", icon=":material/terminal:")
        return
    project_context.follow(r.project)  # the clone goes to the project of its original
    spec = dict(r.spec)
    spec["name"] = f"{r.name} (clone)"[:200]
    load_into_form(spec, f"clone of {f.md_text(r.name)} ({f.md_text(r.id)})", parent=r.id)
    st.session_state[K("tags")] = ", ".join(r.tags)


def read_spec() -> tuple[RunSpec | None, dict[str, list[str]], list[str]]:
    values, bad = spec_form.read()
    chosen = st.session_state.get(K("dataset"), NO_DATASET)
    if chosen != NO_DATASET:
        stored = sources.chosen_dataset()
        if stored is not None:
            values["data"]["name"], values["data"]["path"] = catalog.FOLDER_DATASET, stored.uri
    spec, errors = validate(values)
    by_field, general = errors_by_field(errors)
    for path, msg in bad.items():
        by_field.setdefault(path, []).insert(0, msg)
    return (spec if not bad else None), by_field, general


def owner_and_tags() -> tuple[str, list[str]]:
    tags = [t.strip() for t in st.session_state.get(K("tags"), "").split(",") if t.strip()]
    # Team mode: the run belongs to whoever is signed in, whatever the form says.
    owner = project_context.acting().id if auth.team_mode() else (st.session_state.get(K("owner")) or "local")
    return owner, tags


def launch(spec: RunSpec, slots: dict) -> None:
    """Submit through the gate of every new run (app.services.admission); a refused field is also said beside it."""
    owner, tags = owner_and_tags()
    try:
        r = submit(
            spec,
            name=spec.name,
            owner=owner,
            tags=tags,
            parent_id=st.session_state.get(K("parent")),
            engine=queries.engine(),
            project=project_context.project(),
        )
    except (RuntimeError, ValueError, auth.PermissionDenied) as e:
        if isinstance(e, SpecError):  # a path the run may not read, a field out of bounds
            spec_form.show_errors(slots, errors_by_field(list(e.errors))[0])
        st.error(f.md_text(e, multiline=True), icon=":material/error:")
        return
    queries.clear()
    forget_form()
    frame.open_run(r.id)


def show_preflight(spec: RunSpec) -> None:
    """Ask a jobs worker for the pre-flight (with overfit-one-batch when its box is ticked), under a status."""
    overfit = bool(st.session_state.get(K("overfit"), True))
    what = "shape check, sample grid" + (" and overfitting one batch" if overfit else "")
    with st.status(f"Pre-flight: {what}, in a separate process…") as status:
        result = jobs.preflight(spec, overfit=overfit)
        status.update(
            label=f"Pre-flight {'done' if result.get('ok') else 'failed'}: see below",
            state="complete" if result.get("ok") else "error",
        )
    st.session_state[K("preflight")] = result


def preflight_panel() -> None:
    """The last pre-flight's answer (app/ui/preflight_view.py), kept across reruns."""
    result = st.session_state.get(K("preflight"))
    if result:
        preflight_view.show(result)


def relevance() -> tuple[Callable[[str], bool], dict]:
    """Whether each field matters for the choices now in the form (a swept choice: for any value it tries;
    an uploaded dataset: the catalog's folder dataset, its path given), and those values ({dotted field: value})."""
    values = flatten(spec_form.read()[0])
    swept = {x.path for x in sweep_fields.swept()}
    tries = {
        p: list(st.session_state.get(sweep_fields.part_key(p, "values")) or [])
        for p in swept
        if p in form_rules.CHOOSERS
    }
    uploaded = st.session_state.get(K("dataset"), NO_DATASET) != NO_DATASET
    if uploaded:
        values["data.name"] = catalog.FOLDER_DATASET

    def shown(path: str) -> bool:
        if uploaded and path == "data.path":
            return False
        return path in swept or form_rules.relevant_any(path, values, tries)

    return shown, values


def choosers(shown: Callable[[str], bool], slots: dict) -> None:
    """The choices that shape the form, above it: a change takes effect at once (inside the form it would
    wait for a button)."""
    fields = [spec_form.by_path(p) for p in form_rules.CHOOSERS if shown(p)]
    items = [lambda x=x: new_sweep.draw_field(x, slots) for x in fields]
    items.insert(1, sources.dataset_picker)
    items.insert(3, sources.weights_picker)
    with st.container(border=True):
        st.markdown("**What to train**")
        st.caption("These choices shape the form below: each section shows the fields that matter for them.")
        cols = st.columns(3)
        for i, item in enumerate(items):
            with cols[i % 3]:
                item()


def form(shown: Callable[[str], bool], values: dict):
    """The form (the run's fields, each numeric and choice one with a sweep box; the Sweep section; the buttons)."""
    slots: dict = {}
    choosers(shown, slots)
    with st.form(K("form"), border=False):
        with st.container(border=True):
            a, b, c = st.columns(3)
            with a:
                spec_form.draw_field(spec_form.by_path("name"), slots)
            b.text_input(
                "Owner",
                key=K("owner"),
                disabled=auth.team_mode(),
                help="Who the run belongs to (filter on the Runs page)"
                + ("; in team mode, the signed-in user." if auth.team_mode() else "."),
            )
            c.text_input("Tags", key=K("tags"), help="Comma-separated labels, e.g. baseline, lr-sweep.")
        above = [c for c in form_rules.CHOOSERS if shown(c)]  # drawn by choosers()
        slots |= spec_form.render(
            draw=new_sweep.draw_field, shown=shown, skip=above, unused_note=form_rules.choices_in_words(values)
        )
        sweep = new_sweep.section()
        hints_line(values)
        general_slot = st.empty()
        st.checkbox(
            "Pre-flight: also overfit one batch",
            key=K("overfit"),
            help=f"Trains a copy of the model for {PREFLIGHT_OVERFIT_STEPS} steps on one batch of "
            f"{PREFLIGHT_OVERFIT_BATCH} samples, on the CPU (at most {PREFLIGHT_OVERFIT_S:g} s): a "
            "healthy model, loss and labels memorise it. Its loss should fall.",
        )
        v, p, l_ = st.columns([1, 1, 1])
        validate_clicked = v.form_submit_button("Validate", icon=":material/rule:", width="stretch")
        preflight_clicked = p.form_submit_button("Pre-flight check", icon=":material/flight_takeoff:", width="stretch")
        launch_clicked = l_.form_submit_button(
            "Launch run",
            type="secondary" if sweep.active else "primary",
            icon=":material/rocket_launch:",
            width="stretch",
        )
    return slots, general_slot, sweep, (validate_clicked, preflight_clicked, launch_clicked)


def hints_line(values: dict) -> None:
    """Before Launch: which worker takes the run, and its memory and time as in similar finished runs."""
    values = dict(values)
    stored = sources.chosen_dataset()
    if stored is not None:
        values["data.path"] = stored.uri
    h = sources.hints(values)
    parts = [f.md_text(x.describe()) for x in (h.memory, h.time) if x is not None]
    if h.workers.served:  # it names the workers and their hosts: as text
        st.info("\n\n".join([f.md_text(h.workers.text), *parts]), icon=":material/info:")
    else:  # our own words and commands
        st.warning("\n\n".join([h.workers.text, *parts]), icon=":material/hourglass_disabled:")


def unused_but_invalid(by_field: dict[str, list[str]], shown: Callable[[str], bool]) -> list[str]:
    """Errors of fields in the "Not used" expander, where they are easy to miss: also said with the others."""
    return [
        f"{f.code_span(p)} ({f.md_text(spec_form.by_path(p).label)}, under *Not used*): "
        + "; ".join(f.md_text(m) for m in msgs)
        for p, msgs in by_field.items()
        if not shown(p)
    ]


def viewer_only() -> bool:
    """A viewer of the current project launches nothing in it: it is said instead of the form."""
    if project_context.may_contribute():
        return False
    st.info(
        f"You are a viewer of project {f.md_text(project_context.project())}: its members launch runs and "
        "sweeps in it. A maintainer of the project can make you a member (see the Project page).",
        icon=":material/visibility:",
    )
    return True


def main() -> None:
    st.title("New run")
    if viewer_only():
        return
    if spec_form.ensure_defaults():
        forget_form()
    if auth.team_mode():
        st.session_state[K("owner")] = project_context.acting().describe()  # shown, not editable (not the key)
    else:
        st.session_state.setdefault(K("owner"), os.environ.get("USER") or "local")
    st.session_state.setdefault(K("tags"), "")
    st.session_state.setdefault(K("overfit"), True)
    clone_from_query()
    sources.dataset_from_query()
    presets_bar()
    new_sweep.yaml_bar(load_into_form)
    if st.session_state.get(K("source")):
        st.info(
            f"Form filled from {st.session_state[K('source')]}. Change anything, then launch.",
            icon=":material/content_copy:",
        )
    new_sweep.prepare()
    shown, values = relevance()
    slots, general_slot, sweep, (validate_clicked, preflight_clicked, launch_clicked) = form(shown, values)
    spec, by_field, general = read_spec()
    if validate_clicked or preflight_clicked or launch_clicked or sweep.setup or sweep.check or sweep.launch:
        spec_form.show_errors(slots, by_field)
        said = [f.md_text(g, multiline=True) for g in general] + unused_but_invalid(by_field, shown)
        if said:
            general_slot.error("\n\n".join(said), icon=":material/error:")
        if spec is None:
            n = sum(len(v) for v in by_field.values()) + len(general)
            st.error(f"The spec has {n} problem(s): see the messages beside the fields.", icon=":material/error:")
        elif launch_clicked and new_sweep.single_run_refused():
            st.error(new_sweep.single_run_refused(), icon=":material/tune:")
        elif launch_clicked:
            launch(spec, slots)
        elif preflight_clicked:
            show_preflight(spec)
        elif validate_clicked:
            st.success(
                f"Valid spec: queue '{run_queue(spec)}', hash {spec.spec_hash()[:12]}", icon=":material/check_circle:"
            )
        if spec is not None and not launch_clicked and not sweep.launch:
            run_view.waiting_for(run_queue(spec))
    owner, tags = owner_and_tags()
    new_sweep.after_form(spec, sweep, slots, owner=owner, tags=tags)
    preflight_panel()
    if spec is not None:
        st.download_button(
            "Download spec as YAML",
            spec.to_yaml(),
            file_name=f"{spec.name or 'run'}.yaml",
            mime="application/yaml",
            icon=":material/download:",
            key=K("download"),
        )
    else:
        st.caption("Fix the form's errors to download the spec as YAML.")


main()
