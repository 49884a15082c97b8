"""The RunSpec form: one widget per schema field (see app/present/form_schema.py), grouped, labelled in words
(app/present/form_rules.py), with the schema's default and description, and a slot under each widget where that
field's error appears. A group shows the fields that matter for the choices made, its rarely changed ones under
"Advanced"; the others wait in a "Not used" expander, still drawn, so their values stay in the spec.

Widget state lives in page-scoped session-state keys (`nr.f.<dotted field>`), which is also how a
preset, an uploaded YAML or a cloned run fills the form: write the keys, then render."""

from __future__ import annotations

import math
from collections.abc import Callable, Collection
from typing import Any

import streamlit as st

from app.present.form_rules import advanced, choice_options, option_label
from app.present.form_schema import FIELDS, GROUPS, FormField, flatten, set_path
from app.present.text import md_text

PREFIX = "nr.f."
_OPTBOOL = {"auto": None, "on": True, "off": False}
Shown = Callable[[str], bool]  # whether a field (its dotted path) matters for the choices made


def key(path: str) -> str:
    return PREFIX + path


def _to_widget(f: FormField, value: Any) -> Any:
    if f.kind == "optbool":
        return next(k for k, v in _OPTBOOL.items() if v == value)
    if f.kind == "str":
        return "" if value is None else str(value)
    if f.kind in ("intlist", "floatlist"):
        return ", ".join(str(v) for v in value or [])
    if f.kind == "multichoice":
        return list(value or [])
    if f.kind == "float" and value is not None:
        return float(value)
    return value


def fill(spec: dict[str, Any]) -> None:
    """Put a spec (nested dict, possibly partial) into the form's widgets."""
    for path, value in flatten(spec).items():
        f = by_path(path)
        if f.kind == "pair":
            a, b = value if value is not None else f.default
            st.session_state[key(path) + ".0"], st.session_state[key(path) + ".1"] = float(a), float(b)
        else:
            st.session_state[key(path)] = _to_widget(f, value)


def ensure_defaults() -> bool:
    """First visit (or back after another page, which drops widget state): every widget starts at
    the schema default, set through session state so that no widget gets both a value and a state.
    Returns whether the form was reset."""
    if key("seed") in st.session_state:
        return False
    fill({})
    return True


def by_path(path: str) -> FormField:
    return next(f for f in FIELDS if f.path == path)


def _float_step(f: FormField) -> float:
    d = f.default if isinstance(f.default, (int, float)) and f.default else 0.01
    return float(10 ** math.floor(math.log10(abs(d))))  # a float: an int step beside a float bound is refused


def _widget(f: FormField) -> None:
    k, label, helptext = key(f.path), f.label, f.help
    if f.kind == "bool":
        st.checkbox(label, key=k, help=helptext)
    elif f.kind == "optbool":
        st.selectbox(label, list(_OPTBOOL), key=k, help=helptext)
    elif f.kind == "choice":
        options = choice_options(f.path, f.options, st.session_state.get(k))
        st.selectbox(label, options, key=k, help=helptext, format_func=lambda o, p=f.path: option_label(p, o))
    elif f.kind == "multichoice":
        st.multiselect(label, list(f.options), key=k, help=helptext)
    elif f.kind == "int":
        st.number_input(
            label,
            min_value=_int(f.min),
            max_value=_int(f.max),
            step=1,
            key=k,
            help=helptext,
            placeholder="none" if f.optional else None,
        )
    elif f.kind == "float":
        st.number_input(label, min_value=f.min, max_value=f.max, step=_float_step(f), format="%g", key=k, help=helptext)
    elif f.kind == "pair":
        a, b = st.columns(2)
        a.number_input(f"{label} (1)", step=0.001, format="%g", key=k + ".0", help=helptext)
        b.number_input(f"{label} (2)", step=0.001, format="%g", key=k + ".1", help=helptext)
    elif f.kind in ("intlist", "floatlist"):
        example = "0.485, 0.456, 0.406" if f.kind == "floatlist" else "10, 20"
        st.text_input(label, key=k, help=f"{helptext} Comma-separated, e.g. {example}.")
    else:
        st.text_input(label, key=k, help=helptext, placeholder="none" if f.optional else None)


def _int(v: float | None) -> int | None:
    return None if v is None else int(v)


def draw_field(f: FormField, slots: dict[str, Any]) -> None:
    """One field: its widget, then its error slot."""
    _widget(f)
    slots[f.path] = st.empty()


def render_group(
    group: str,
    slots: dict[str, Any],
    columns: int = 3,
    draw: Callable[[FormField, dict[str, Any]], None] = draw_field,
    fields: list[FormField] | None = None,
) -> None:
    """The fields of one group (or the given ones) in `columns` columns, each drawn by `draw` (its widget and
    its error slot)."""
    fields = [f for f in FIELDS if f.group == group] if fields is None else fields
    cols = st.columns(columns)
    for i, f in enumerate(fields):
        with cols[i % columns]:
            draw(f, slots)


def split(group: str, shown: Shown | None = None, skip: Collection[str] = ()) -> tuple[list[FormField], ...]:
    """A group's fields as (main, advanced, unused): unused ones do not matter for the choices made (`shown`
    says no), advanced ones are rarely changed (app/present/form_rules.py); `skip`: drawn elsewhere."""
    fields = [f for f in FIELDS if f.group == group and f.path not in skip]
    used = [f for f in fields if shown is None or shown(f.path)]
    unused = [f for f in fields if f not in used]
    return [f for f in used if not advanced(f.path)], [f for f in used if advanced(f.path)], unused


def render(
    extra: dict[str, Any] | None = None,
    draw: Callable[[FormField, dict[str, Any]], None] = draw_field,
    shown: Shown | None = None,
    skip: Collection[str] = (),
    unused_note: str = "",
) -> dict[str, Any]:
    """All groups (call inside a st.form); returns the error slots by field path. `draw` draws one field
    (the New run page's adds a sweep box beside some). Each group shows the fields that matter (`shown`; all
    by default), its rarely changed ones under "Advanced"; those that do not matter wait, with their values,
    in one "Not used" expander at the end (`unused_note` says for which choices)."""
    slots: dict[str, Any] = {}
    unused: dict[str, list[FormField]] = {}
    for group in GROUPS:
        main, rare, unused[group] = split(group, shown, skip)
        with st.container(border=True):
            st.markdown(f"**{group}**")
            if extra and group in extra:
                extra[group]()
            render_group(group, slots, draw=draw, fields=main)
            if rare:
                with st.expander("Advanced", icon=":material/tune:"):
                    render_group(group, slots, draw=draw, fields=rare)
    n = sum(len(v) for v in unused.values())
    if n:
        with st.expander(
            f"Not used{' with ' + unused_note if unused_note else ''} ({n} fields)", icon=":material/visibility_off:"
        ):
            st.caption(
                "These fields do nothing with the choices made above. They keep their values, which stay "
                "in the spec and its YAML; change a choice and they come back into their section."
            )
            for group, fields in unused.items():
                if fields:
                    st.markdown(f"*{group}*")
                    render_group(group, slots, draw=draw, fields=fields)
    return slots


def read() -> tuple[dict[str, Any], dict[str, str]]:
    """The form's values as a nested spec dict, and fields that could not even be parsed."""
    spec: dict[str, Any] = {}
    bad: dict[str, str] = {}
    for f in FIELDS:
        try:
            value = _from_widget(f)
        except ValueError as e:
            bad[f.path] = str(e)
            continue
        set_path(spec, f.path, value)
    return spec, bad


def _from_widget(f: FormField) -> Any:
    k = key(f.path)
    if f.kind == "pair":
        return [st.session_state.get(k + ".0"), st.session_state.get(k + ".1")]
    v = st.session_state.get(k)
    if f.kind == "optbool":
        return _OPTBOOL.get(v)
    if f.kind == "str":
        v = (v or "").strip()
        return v or (None if f.optional else "")
    if f.kind in ("intlist", "floatlist"):
        parts = [p.strip() for p in (v or "").replace(";", ",").split(",") if p.strip()]
        if f.kind == "floatlist" and not parts and f.optional:
            return None  # left empty: the schema's default (none)
        number = float if f.kind == "floatlist" else int
        try:
            return [number(p) for p in parts]
        except ValueError:
            raise ValueError(
                "numbers separated by commas, e.g. 0.5, 0.5, 0.5"
                if f.kind == "floatlist"
                else "whole numbers separated by commas, e.g. 10, 20"
            ) from None
    return v


def show_errors(slots: dict[str, Any], by_field: dict[str, list[str]]) -> None:
    for path, messages in by_field.items():
        slot = slots.get(path)
        if slot is not None:
            slot.error("; ".join(md_text(m) for m in messages), icon=":material/error:")  # they quote the input
