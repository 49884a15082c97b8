"""New run: a form for every RunSpec field, presets, YAML upload/download, clone, pre-flight, launch; and a
sweep of it (app/ui/new_sweep.py: a sweep box beside numeric and choice fields, the Sweep section, sweep YAML)."""

from __future__ import annotations

import os
from pathlib import Path

import streamlit as st

from app import auth, services
from app import fmt as f
from app import jobs
from app.schema import errors_by_field, validate
from app.ui import frame, new_sweep, queries, run_view, spec_form
from core.config import RunSpec, SpecError

K = frame.page_state("nr")
PRESETS = Path(__file__).resolve().parents[2] / "configs"
NO_DATASET = "— none (use data.name / data.path) —"


def load_into_form(spec: dict, source: str, parent: str | None = None) -> None:
    """`source` says, in Markdown, where the form's values came from (a user's names in it escaped)."""
    spec_form.fill(spec)
    st.session_state[K("source")] = source
    st.session_state[K("parent")] = parent  # only a clone links the new run to another


def forget_form() -> None:
    for name in ("source", "parent", "preflight"):
        st.session_state.pop(K(name), None)
    new_sweep.forget()


def presets_bar() -> None:
    files = sorted(PRESETS.glob("*.yaml"))
    left, mid, right = st.columns([2, 1, 3], vertical_alignment="bottom")
    choice = left.selectbox("Preset", [p.stem for p in files], key=K("preset"), index=None,
                            placeholder="choose a preset…")
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
    if r is None:
        st.warning(f"no run {f.md_text(repr(run_id))} to clone")
        return
    spec = dict(r.spec)
    spec["name"] = f"{r.name} (clone)"[:200]
    load_into_form(spec, f"clone of {f.md_text(r.name)} ({f.md_text(r.id)})", parent=r.id)
    st.session_state[K("tags")] = ", ".join(r.tags)


def dataset_picker() -> None:
    ready = [d for d in queries.datasets() if d.status == "ready"]
    options = [NO_DATASET] + [d.name for d in ready]
    st.selectbox("Uploaded dataset", options, key=K("dataset"),
                 help="An ImageFolder dataset uploaded on the Datasets page: sets data.name=imagefolder and "
                      "data.path to its stored folder.")


def read_spec() -> tuple[RunSpec | None, dict[str, list[str]], list[str]]:
    values, bad = spec_form.read()
    chosen = st.session_state.get(K("dataset"), NO_DATASET)
    if chosen != NO_DATASET:
        stored = next((d for d in queries.datasets() if d.name == chosen), None)
        if stored is not None:
            values["data"]["name"], values["data"]["path"] = "imagefolder", stored.uri
    spec, errors = validate(values)
    by_field, general = errors_by_field(errors)
    for path, msg in bad.items():
        by_field.setdefault(path, []).insert(0, msg)
    return (spec if not bad else None), by_field, general


def owner_and_tags() -> tuple[str, list[str]]:
    tags = [t.strip() for t in st.session_state.get(K("tags"), "").split(",") if t.strip()]
    # Team mode: the run belongs to whoever is signed in, whatever the form says.
    owner = auth.current_user().id if auth.team_mode() else (st.session_state.get(K("owner")) or "local")
    return owner, tags


def launch(spec: RunSpec) -> None:
    owner, tags = owner_and_tags()
    try:
        r = services.submit(spec, name=spec.name, owner=owner, tags=tags, parent_id=st.session_state.get(K("parent")),
                            engine=queries.engine())
    except (RuntimeError, ValueError) as e:
        st.error(f.md_text(e, multiline=True), icon=":material/error:")
        return
    queries.clear()
    forget_form()
    frame.open_run(r.id)


def show_preflight(spec: RunSpec) -> None:
    with st.spinner("Pre-flight: building the data and the model in a separate process…"):
        result = jobs.preflight(spec)
    st.session_state[K("preflight")] = result


def preflight_panel() -> None:
    result = st.session_state.get(K("preflight"))
    if not result:
        return
    with st.container(border=True):
        st.markdown("**Pre-flight**")
        if result.get("ok"):
            s = result["shapes"]
            st.success(f"Shape check passed: input {s['input_shape']} → output {s['output_shape']} "
                       f"({s['num_classes']} classes)", icon=":material/check_circle:")
        else:
            st.error(f.md_text(result.get("error", "pre-flight failed"), multiline=True), icon=":material/error:")
        if result.get("data"):
            d, m = result["data"], result.get("model", {})
            st.caption(f"data {f.md_text(d['name'])}: {d['train']} train / {d['val']} val, {len(d['classes'])} classes, "
                       f"{d['channels']}×{d['image_size']}×{d['image_size']}"
                       + (f" · model {f.md_text(m['name'])}: {m['parameters']:,} parameters" if m else ""))
        if result.get("grid"):
            st.image(result["grid"], caption="Training samples with their labels: check they match")


def form():
    """The form (the run's fields, each numeric and choice one with a sweep box; the Sweep section; the buttons)."""
    with st.form(K("form"), border=False):
        with st.container(border=True):
            a, b, c = st.columns(3)
            with a:
                spec_form._widget(spec_form._by_path("name"))
                name_slot = st.empty()
            b.text_input("Owner", key=K("owner"), disabled=auth.team_mode(),
                         help="Who the run belongs to (filter on the Runs page)"
                              + ("; in team mode, the signed-in user." if auth.team_mode() else "."))
            c.text_input("Tags", key=K("tags"), help="Comma-separated labels, e.g. baseline, lr-sweep.")
        slots = spec_form.render({"Data": dataset_picker}, draw=new_sweep.draw_field)
        slots["name"] = name_slot
        sweep = new_sweep.section()
        general_slot = st.empty()
        v, p, l_ = st.columns([1, 1, 1])
        validate_clicked = v.form_submit_button("Validate", icon=":material/rule:", width="stretch")
        preflight_clicked = p.form_submit_button("Pre-flight check", icon=":material/flight_takeoff:",
                                                 width="stretch")
        launch_clicked = l_.form_submit_button("Launch run", type="secondary" if sweep.active else "primary",
                                               icon=":material/rocket_launch:", width="stretch")
    return slots, general_slot, sweep, (validate_clicked, preflight_clicked, launch_clicked)


def main() -> None:
    st.title("New run")
    if spec_form.ensure_defaults():
        forget_form()
    if auth.team_mode():
        st.session_state[K("owner")] = auth.current_user().describe()  # shown, not editable (not the key)
    else:
        st.session_state.setdefault(K("owner"), os.environ.get("USER") or "local")
    st.session_state.setdefault(K("tags"), "")
    clone_from_query()
    presets_bar()
    new_sweep.yaml_bar(load_into_form)
    if st.session_state.get(K("source")):
        st.info(f"Form filled from {st.session_state[K('source')]}. Change anything, then launch.",
                icon=":material/content_copy:")
    new_sweep.prepare()
    slots, general_slot, sweep, (validate_clicked, preflight_clicked, launch_clicked) = form()
    spec, by_field, general = read_spec()
    if validate_clicked or preflight_clicked or launch_clicked or sweep.setup or sweep.check or sweep.launch:
        spec_form.show_errors(slots, by_field)
        if general:
            general_slot.error("\n\n".join(f.md_text(g, multiline=True) for g in general), icon=":material/error:")
        if spec is None:
            n = sum(len(v) for v in by_field.values()) + len(general)
            st.error(f"The spec has {n} problem(s): see the messages beside the fields.", icon=":material/error:")
        elif launch_clicked and new_sweep.single_run_refused():
            st.error(new_sweep.single_run_refused(), icon=":material/tune:")
        elif launch_clicked:
            launch(spec)
        elif preflight_clicked:
            show_preflight(spec)
        elif validate_clicked:
            st.success(f"Valid spec: queue '{spec.resource}', hash {spec.spec_hash()[:12]}",
                       icon=":material/check_circle:")
        if spec is not None and not launch_clicked and not sweep.launch:
            run_view.waiting_for(spec.resource)
    owner, tags = owner_and_tags()
    new_sweep.after_form(spec, sweep, slots, owner=owner, tags=tags)
    preflight_panel()
    if spec is not None:
        st.download_button("Download spec as YAML", spec.to_yaml(), file_name=f"{spec.name or 'run'}.yaml",
                           mime="application/yaml", icon=":material/download:", key=K("download"))
    else:
        st.caption("Fix the form's errors to download the spec as YAML.")


main()
