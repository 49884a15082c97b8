"""The New run form's sweep part: a "sweep" box beside each numeric and choice field (ticked, its widget gives
way to a range or a list of values), the Sweep section (settings, trial count and compute estimate, Launch
sweep), a sweep YAML to fill the form from, and the form's sweep as YAML. All of it is inside the run form's
st.form: a ticked box takes effect at the next press of one of its buttons (Set up sweep, Validate, ...). Its
session state (the keys, what may be swept) and the sweep that state stands for are sweep_fields.py."""

from __future__ import annotations

import copy
import math
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial
from typing import Any

import streamlit as st
from pydantic import ValidationError

from app.auth import PermissionDenied
from app.present import text as f
from app.present.form_schema import FormField, set_path
from app.services import sweeps
from app.services.broker import run_queue
from app.ui import frame, project_context, queries, run_view, spec_form, sweep_view
from app.ui.sweep_fields import (
    BY_PATH,
    CHOICES,
    DEFAULTS,
    OPTBOOL,
    WIDGETS,
    K,
    build,
    fill_sweep,
    on_key,
    options_of,
    part_key,
    place,
    set_parts,
    shown,
    swept,
)
from core.config import RunSpec, SpecError
from sweep.spec import SweepSpec, SweepSpecError


def forget() -> None:
    """The form was reset or launched: what a sweep YAML left (its notes, pruner details, sampler seed) goes."""
    for name in ("extra", "yaml_errors", "yaml_notes"):
        st.session_state.pop(K(name), None)


# --- before the form: keep what a swept field hides, give a newly swept one a range ----------------------
def prepare() -> None:
    """A swept field's own widget is not drawn, and Streamlit drops the state of a widget it does not draw:
    its value (the base spec's) is kept by setting it again. A newly swept field gets a range around it."""
    for name, value in DEFAULTS.items():
        st.session_state.setdefault(K(name), value)
    fields = swept()
    if not fields:
        return
    base = spec_form.read()[0]
    for x in fields:
        k = spec_form.key(x.path)
        st.session_state[k] = st.session_state.get(k)
        first = part_key(x.path, "values" if x.kind in CHOICES else "low")
        if first not in st.session_state:
            set_parts(x, _default_range(x, base))


def _valid(base: dict[str, Any], path: str, values: list[Any]) -> bool:
    for value in values:
        trial = copy.deepcopy(base)
        set_path(trial, path, value)
        try:
            RunSpec.model_validate(trial)
        except (ValidationError, ValueError):
            return False
    return True


def _default_range(x: FormField, base: dict[str, Any]) -> dict[str, Any]:
    """The options that make a valid run (a choice), or the first of a few ranges around the value whose ends
    both do (×/÷10 on a log scale first)."""
    if x.kind in CHOICES:
        options = [OPTBOOL[o] for o in options_of(x)] if x.kind == "optbool" else list(options_of(x))
        fine = [o for o in options if _valid(base, x.path, [o])] or options
        now = st.session_state.get(spec_form.key(x.path))  # long lists: the value alone, to add others to
        return {"values": [shown(x, o) for o in fine] if len(fine) <= 4 else [now]}
    v = st.session_state.get(spec_form.key(x.path))
    if x.kind == "int":
        v = int(v if v is not None else (x.min or 1))
        tries = [(v // 2, v * 2), (v, v * 2), (v // 2, v), (v, v + 1)]
        low, high = next(((a, b) for a, b in tries if a < b and _valid(base, x.path, [a, b])), tries[-1])
        return {"low": low, "high": high, "num": 3, "values": ""}
    v = float(v or 0.0)
    tries = (
        [(v / 10, v * 10, "log"), (v / 10, v, "log"), (v / 2, v * 2, "log")]
        if v > 0
        else [(v, v + 0.1, "linear"), (v, v + 1.0, "linear")]
    )
    low, high, scale = next(((a, b, s) for a, b, s in tries if _valid(base, x.path, [a, b])), tries[0])
    return {"low": float(f"{low:.6g}"), "high": float(f"{high:.6g}"), "scale": scale, "num": 3, "values": ""}


# --- inside the form ---------------------------------------------------------------------------------
def draw_field(x: FormField, slots: dict[str, Any]) -> None:
    """spec_form's field drawer with a sweep box beside each numeric and choice field."""
    if x.path not in BY_PATH:
        spec_form.draw_field(x, slots)
        return
    left, right = st.columns([3, 1], vertical_alignment="top")  # wide enough for "sweep", no help icon
    box = right.checkbox("sweep", key=on_key(x.path))
    with left:
        if not box:
            spec_form.draw_field(x, slots)
            return
        st.markdown(f"**{f.md_text(x.label)}** · swept", help=x.help)
    _range(x)
    slots[x.path] = st.empty()


def _range(x: FormField) -> None:
    k = lambda part: part_key(x.path, part)  # noqa: E731
    if x.kind in CHOICES:
        st.multiselect(
            "values",
            options_of(x),
            key=k("values"),
            format_func=str,
            placeholder="values to try…",
            help="The sweep picks among these values.",
        )
        return
    ref = x.default if isinstance(x.default, (int, float)) and x.default else 0.01  # fixed: the step is in its id
    step, fmt = (1, "%d") if x.kind == "int" else (10 ** math.floor(math.log10(abs(ref))), "%g")
    a, b = st.columns(2)
    a.number_input("low", step=step, format=fmt, key=k("low"))
    b.number_input("high", step=step, format=fmt, key=k("high"))
    c, d = st.columns(2)
    if x.kind == "float":
        c.selectbox(
            "scale",
            ("log", "linear"),
            key=k("scale"),
            help="log: evenly in log space (learning rates, weight decay); linear: evenly.",
        )
    (c if x.kind == "int" else d).number_input(
        "grid points",
        min_value=2,
        max_value=200,
        step=1,
        key=k("num"),
        placeholder="every integer" if x.kind == "int" else "–",
        help="Values of the range a grid tries (evenly spaced; geometrically on a log "
        "scale). Random and TPE sample the whole range.",
    )
    st.text_input(
        "or exactly these values",
        key=k("values"),
        placeholder="e.g. 1, 3, 10",
        help="Comma-separated: the sweep picks among them (low and high are then unused).",
    )


@dataclass
class Section:
    active: bool
    info: Any = None
    slots: dict[str, Any] = field(default_factory=dict)
    setup: bool = False
    check: bool = False
    launch: bool = False


def section() -> Section:
    """The Sweep section at the bottom of the form: a hint until a field is swept, then the sweep's settings."""
    with st.container(border=True):
        st.markdown("**Sweep**")
        if not swept():
            st.caption(
                "To try several values of a field, tick **sweep** beside it (numeric and choice fields), "
                "then press **Set up sweep**. Or fill the form from a sweep YAML above."
            )
            info = st.empty()
            return Section(False, info, setup=st.form_submit_button("Set up sweep", icon=":material/tune:"))
        out = Section(True)
        for col, (name, (label, _, kw)) in zip(st.columns(4) + st.columns(4), WIDGETS.items(), strict=False):
            with col:
                (st.selectbox if "options" in kw else partial(st.number_input, step=1))(label, key=K(name), **kw)
                out.slots[name] = st.empty()
        out.info = st.empty()
        a, b, _ = st.columns([1, 1, 2])
        out.check = a.form_submit_button("Check sweep", icon=":material/rule:", width="stretch")
        out.launch = b.form_submit_button(
            "Launch sweep", type="primary", icon=":material/rocket_launch:", width="stretch"
        )
    return out


def after_form(base: RunSpec | None, sec: Section, slots: dict[str, Any], *, owner: str, tags: list[str]) -> None:
    """The trial count and the estimate (or the errors, beside their fields), the launch, the YAML download."""
    if not sec.active:
        if sec.setup:
            sec.info.warning(
                "No field is swept yet: tick **sweep** beside a numeric or choice field first.", icon=":material/tune:"
            )
        return
    if base is None:
        sec.info.warning(
            "Fix the run's fields first (see the messages beside them): every trial starts from them.",
            icon=":material/error:",
        )
        return
    spec, errors = build(base)
    if spec is None:
        by_field, general = place(errors)
        spec_form.show_errors({**slots, **sec.slots}, by_field)
        text = "".join(f"\n\n{f.md_text(g, multiline=True)}" for g in general)
        sec.info.error(
            f"The sweep has {len(errors)} problem(s): see the messages beside the fields.{text}",
            icon=":material/error:",
        )
        return
    sec.info.info(f.md_text(sweep_view.estimate(spec).describe(spec.pruner.kind)), icon=":material/calculate:")
    if sec.launch:
        launch(spec, slots | sec.slots, owner=owner, tags=tags)
    st.download_button(
        "Download sweep as YAML",
        spec.to_yaml(),
        file_name=f"{spec.name or 'sweep'}.yaml",
        mime="application/yaml",
        icon=":material/download:",
        key=K("download"),
    )


def launch(spec: SweepSpec, slots: dict[str, Any], *, owner: str, tags: list[str]) -> None:
    """The sweep, in the current project (the service refuses an owner who is not a member of it)."""
    try:
        record = sweeps.submit_sweep(
            spec, owner=owner, name=spec.name, tags=tags, engine=queries.engine(), project=project_context.project()
        )
    except (RuntimeError, ValueError, PermissionDenied) as e:
        if isinstance(e, SpecError):  # a path the runs may not read
            spec_form.show_errors(slots, place(list(e.errors))[0])
        st.error(f.md_text(e, multiline=True), icon=":material/error:")
        return
    queries.clear()
    first = min(spec.budget.parallel, spec.trials)
    st.success(
        f"Sweep **{f.md_text(record.name)}** launched: {spec.trials} trials, the first {first} queued.",
        icon=":material/rocket_launch:",
    )
    st.page_link(frame.SWEEP, label="Open the sweep", query_params={"id": record.id}, icon=":material/tune:")
    run_view.waiting_for(run_queue(spec.base))


def single_run_refused() -> str:
    """Why Launch run does not launch while fields are swept (the sweep would be silently dropped)."""
    names = ", ".join(f.code_span(x.path) for x in swept())
    return names and (
        f"Set to sweep: {names}. Press **Launch sweep** in the Sweep section, or untick **sweep** "
        "beside them to launch a single run."
    )


# --- a sweep YAML into the form -----------------------------------------------------------------------------
def yaml_bar(load_into_form: Callable[[dict, str], None]) -> None:
    """Upload or paste a sweep (with `base:` inside): its base fills the run form, its space the sweep boxes."""
    with st.expander("Sweep from YAML: a whole sweep, its run spec under `base:`", icon=":material/tune:"):
        upload = st.file_uploader("Sweep YAML file", type=["yaml", "yml"], key=K("upload"))
        text = st.text_area(
            "…or paste it",
            key=K("paste"),
            height=140,
            placeholder="base: {data: {name: digits}}\n"
            "space: {optim.lr: {loguniform: [1.0e-4, 1.0e-2], num: 3}}\nmethod: grid",
        )
        if upload is not None and st.session_state.get(K("upload_id")) != upload.file_id:
            st.session_state[K("upload_id")] = upload.file_id
            _load(upload.getvalue().decode("utf-8", "replace"), f"sweep file {f.md_text(upload.name)}", load_into_form)
        if st.button("Fill the form from the pasted sweep", key=K("load")):
            _load(text, "a pasted sweep", load_into_form)
        for loc, msg in st.session_state.get(K("yaml_errors"), []):
            st.error(f"{f.md_text(loc)}: {f.md_text(msg, multiline=True)}", icon=":material/error:")
        for note in st.session_state.get(K("yaml_notes"), []):
            st.warning(f.md_text(note), icon=":material/info:")


def _load(text: str, source: str, load_into_form: Callable[[dict, str], None]) -> None:
    try:
        spec = SweepSpec.from_yaml(text)
    except SweepSpecError as e:
        st.session_state[K("yaml_errors")], st.session_state[K("yaml_notes")] = list(e.errors), []
        return
    load_into_form({**spec.base.model_dump(mode="json"), "name": spec.name or spec.base.name}, source)
    st.session_state[K("yaml_errors")], st.session_state[K("yaml_notes")] = [], fill_sweep(spec)
