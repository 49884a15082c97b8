"""The sweep part of the New run form as session state, and the sweep it stands for: which fields may be swept,
the keys of their boxes, ranges and settings (`nr.sw.on.<field>`, `nr.sw.r.<field>.<low|high|scale|num|values>`,
`nr.sw.<setting>`), build (that state as a SweepSpec, or the errors, each placed beside its field) and fill_sweep (a
SweepSpec as that state). new_sweep.py draws it."""

from __future__ import annotations

import re
from typing import Any

import streamlit as st

from app.present.form_schema import FIELDS, FormField, field_for_error
from app.ui import frame
from core.catalog import OBJECTIVES
from core.config import RunSpec
from core.names import PRUNERS, SWEEP_METHODS
from sweep.space import MAX_CHOICES, ParamSpec, sweepable_paths
from sweep.spec import MAX_TRIALS, SweepSpec, SweepSpecError

K = frame.page_state("nr.sw")
PREFIX = K("")
CHOICES = ("choice", "bool", "optbool")
KNOWN = frozenset(sweepable_paths())  # never `name`, `seed`, nor a field naming a file or a dataset
SWEEPABLE = tuple(x for x in FIELDS if x.kind in (*CHOICES, "int", "float") and x.path in KNOWN)
BY_PATH = {x.path: x for x in SWEEPABLE}
OPTBOOL = {"auto": None, "on": True, "off": False}
AUTO = "auto"


def on_key(path: str) -> str:
    return f"{PREFIX}on.{path}"


def part_key(path: str, part: str) -> str:
    return f"{PREFIX}r.{path}.{part}"


def swept() -> list[FormField]:
    return [x for x in SWEEPABLE if st.session_state.get(on_key(x.path))]


def options_of(x: FormField) -> list[Any]:
    return list(OPTBOOL) if x.kind == "optbool" else [True, False] if x.kind == "bool" else list(x.options)


def shown(x: FormField, value: Any) -> Any:  # a value as its option (an optional bool's None is `auto`)
    return next(k for k, v in OPTBOOL.items() if v == value) if x.kind == "optbool" else value


def set_parts(x: FormField, parts: dict[str, Any]) -> None:
    st.session_state.update({part_key(x.path, part): value for part, value in parts.items()})


# The Sweep section: SweepSpec field -> (label, default, the widget's arguments: options make a selectbox, help).
WIDGETS: dict[str, tuple[str, Any, dict[str, Any]]] = {
    "method": (
        "method",
        "grid",
        {"options": SWEEP_METHODS, "help": "grid: every combination; random: sampled; tpe: Bayesian (Optuna's TPE)."},
    ),
    "budget.trials": (
        "trials",
        None,
        {
            "min_value": 1,
            "max_value": MAX_TRIALS,
            "placeholder": "auto",
            "help": "Configurations to try. Empty: a grid's size, else 20.",
        },
    ),
    "budget.parallel": ("at once", 1, {"min_value": 1, "max_value": 256, "help": "Configurations in flight at once."}),
    "seeds": (
        "seeds",
        1,
        {
            "min_value": 1,
            "max_value": 20,
            "help": "Runs per configuration (base seed, +1, …): its objective is their mean ± std.",
        },
    ),
    "objective.metric": (
        "objective",
        AUTO,
        {"options": (AUTO, *OBJECTIVES), "help": "The per-epoch metric to optimise. auto: the early-stopping monitor."},
    ),
    "objective.mode": (
        "goal",
        "auto",
        {"options": ("auto", "max", "min"), "help": "auto: min for losses, max for accuracies and F1."},
    ),
    "pruner.kind": (
        "pruner",
        "none",
        {
            "options": PRUNERS,
            "help": "Stop trailing trials early: median (below the "
            "median of completed trials at that epoch) or asha (successive halving).",
        },
    ),
}
DEFAULTS = {name: default for name, (_, default, _) in WIDGETS.items()}


# --- the sweep the form describes ---------------------------------------------------------
def _param(x: FormField) -> dict[str, Any]:
    get = lambda part: st.session_state.get(part_key(x.path, part))  # noqa: E731
    if x.kind in CHOICES:
        values = [OPTBOOL[v] if x.kind == "optbool" else v for v in get("values") or []]
        if not values:
            raise ValueError("choose at least one value to try")
        return {"choice": values}
    text = (get("values") or "").strip()
    if text:
        return {"choice": _numbers(text, int if x.kind == "int" else float)}
    low, high = get("low"), get("high")
    if low is None or high is None:
        raise ValueError("give low and high, or a list of values")
    if x.kind == "int":
        out: dict[str, Any] = {"int": [int(low), int(high)]}
    else:
        out = {"loguniform" if get("scale") == "log" else "uniform": [float(low), float(high)]}
    if get("num") is not None:
        out["num"] = int(get("num"))
    return out


def _numbers(text: str, kind: type) -> list[Any]:
    try:
        return [kind(p) for p in re.split(r"[,;\s]+", text) if p]
    except ValueError:
        raise ValueError(
            f"values: {'whole ' if kind is int else ''}numbers separated by commas, e.g. 1, 3, 10"
        ) from None


def build(base: RunSpec) -> tuple[SweepSpec | None, list[tuple[str, str]]]:
    """The sweep of the form's run (its base) and the Sweep section, or the errors, each naming its field."""
    space, bad = {}, []
    for x in swept():
        try:
            space[x.path] = _param(x)
        except ValueError as e:  # inputs that could not even be read
            bad.append((f"space.{x.path}", str(e)))
    if bad:
        return None, bad
    get = lambda name: st.session_state.get(K(name), DEFAULTS[name])  # noqa: E731
    extra = st.session_state.get(K("extra")) or {}
    metric = get("objective.metric")
    data = {
        "name": base.name,
        "base": base.model_dump(mode="json"),
        "space": space,
        "method": get("method"),
        "objective": {"metric": None if metric == AUTO else metric, "mode": get("objective.mode")},
        "budget": {"trials": get("budget.trials"), "parallel": get("budget.parallel")},
        "pruner": {**extra.get("pruner", {}), "kind": get("pruner.kind")},
        "seeds": get("seeds"),
        "seed": extra.get("seed"),
    }
    try:
        return SweepSpec.from_dict(data), []
    except SweepSpecError as e:
        return None, list(e.errors)


def place(errors: list[tuple[str, str]]) -> tuple[dict[str, list[str]], list[str]]:
    """Each error beside its field (a swept one's under its range, a setting's under it); the others for the form."""
    by_field: dict[str, list[str]] = {}
    general = []
    paths = sorted(BY_PATH, key=len, reverse=True)
    for loc, msg in errors:
        rest = loc.removeprefix("space.")
        target = next((p for p in paths if rest == p or rest.startswith(p + ".")), None) if loc != rest else None
        target = target or next((s for s in WIDGETS if s == loc or f"{s}.".startswith(f"{loc}.")), None)
        target = target or field_for_error(loc.removeprefix("base."), msg)
        if target is None:
            general.append(f"{loc}: {msg}")
        else:
            by_field.setdefault(target, []).append(msg)
    return by_field, general


def fill_sweep(spec: SweepSpec) -> list[str]:
    """The sweep boxes, ranges and settings from a sweep; returns what the form could not show as it is."""
    notes = []
    for x in SWEEPABLE:
        st.session_state[on_key(x.path)] = x.path in spec.space
    for path, param in spec.space.items():
        x = BY_PATH.get(path)
        if x is None:
            notes.append(f"space.{path}: the form sweeps numeric and choice fields only; left out")
            continue
        parts, note = _parts_of(x, param, spec.method)
        set_parts(x, parts)
        if note:
            notes.append(f"space.{path}: {note}")
    for name in WIDGETS:
        value = spec
        for part in name.split("."):
            value = getattr(value, part)
        st.session_state[K(name)] = AUTO if name == "objective.metric" and value is None else value
    st.session_state[K("extra")] = {"pruner": spec.pruner.model_dump(exclude={"kind"}), "seed": spec.seed}
    return notes


def _parts_of(x: FormField, p: ParamSpec, method: str) -> tuple[dict[str, Any], str | None]:
    """The widgets' values for one dimension. A stepped range is shown as the values it gives only when it is
    a validated grid's (sized before it was accepted) or has at most MAX_CHOICES values, counted first: a
    random or TPE range is never listed point by point."""
    if x.kind in CHOICES:
        return {"values": [shown(x, v) for v in (p.choice if p.choice is not None else p.grid())]}, None
    cast = int if x.kind == "int" else float
    listed = p.choice is not None or (p.step is not None and (method == "grid" or (p.points() or 0) <= MAX_CHOICES))
    if listed:
        values = [cast(v) for v in (p.choice if p.choice is not None else p.grid())]
        note = "its step is shown as the values it gives" if p.step is not None else None
        return {
            "low": min(values),
            "high": max(values),
            "scale": "linear",
            "num": None,
            "values": ", ".join(f"{v:g}" for v in values),
        }, note
    low, high = p.uniform or p.loguniform or p.int_
    if p.step is not None:  # random or TPE over more values than the form lists: the range, sampled evenly
        return {"low": cast(low), "high": cast(high), "scale": "linear", "num": None, "values": ""}, (
            f"its step {p.step:g} gives {p.points():,} values, more than the form lists ({MAX_CHOICES}): the form "
            "samples the range evenly instead"
        )
    scale = "log" if p.loguniform is not None else "linear"
    return {"low": cast(low), "high": cast(high), "scale": scale, "num": p.num, "values": ""}, None
