"""RunSpec as a list of form fields: walked from the pydantic schema, so a field added to
core/config.py appears in the form with its default, bounds and description (the help text)
without touching the UI. Plain functions, no Streamlit: the tests call them directly."""

from __future__ import annotations

import re
import types
import typing
from dataclasses import dataclass
from typing import Any, Literal

import annotated_types as at
from pydantic import BaseModel

from app.present.form_rules import label as label_of
from core.catalog import DATASET_NAMES, MODEL_NAMES
from core.config import RunSpec, SpecError

GROUPS = (
    "Data",
    "Model & transfer learning",
    "Optimization",
    "Schedule",
    "Precision & stability",
    "Early stopping",
    "Checkpoints & export",
    "Resources",
)
# Fields whose prefix decides the group; first match wins (so train.early_stopping before train).
_GROUP_RULES: tuple[tuple[str, str], ...] = (
    ("name", "Run"),
    ("data.", "Data"),
    ("model.", "Model & transfer learning"),
    ("optim.", "Optimization"),
    ("train.epochs", "Optimization"),
    ("train.batch_size", "Optimization"),
    ("train.accumulate", "Optimization"),
    ("train.label_smoothing", "Optimization"),
    ("train.steps_per_epoch", "Optimization"),
    ("train.mix.", "Optimization"),
    ("train.ema.", "Optimization"),
    ("train.class_weights", "Optimization"),
    ("train.sampler", "Optimization"),
    ("train.lr_finder.", "Optimization"),
    ("schedule.", "Schedule"),
    ("train.early_stopping.", "Early stopping"),
    ("train.", "Precision & stability"),
    ("seed", "Precision & stability"),
    ("deterministic", "Precision & stability"),
    ("checkpoint.", "Checkpoints & export"),
    ("export.", "Checkpoints & export"),
    ("loader.", "Resources"),
    ("resources.", "Resources"),
    ("device", "Resources"),
    ("compile", "Resources"),
    ("channels_last", "Resources"),
)
# The catalog's names (core/catalog.py), validated by a field_validator (the annotation is a plain str).
_REGISTRIES: dict[str, tuple[str, ...]] = {"data.name": DATASET_NAMES, "model.name": MODEL_NAMES}
_SECTIONS = ("data", "model", "optim", "schedule", "train", "checkpoint", "export", "loader", "resources")


@dataclass(frozen=True)
class FormField:
    path: str  # dotted, as in YAML and in SpecError: "optim.lr"
    kind: str  # bool | int | float | str | choice | multichoice | pair | intlist | floatlist | optbool
    default: Any
    help: str
    optional: bool = False
    options: tuple[Any, ...] = ()
    min: float | None = None
    max: float | None = None
    group: str = "Run"

    @property
    def label(self) -> str:
        """In words, with the unit where there is one (app/present/form_rules.py)."""
        return label_of(self.path)


def group_of(path: str) -> str:
    for prefix, group in _GROUP_RULES:
        if path == prefix or (prefix.endswith(".") and path.startswith(prefix)):
            return group
    return "Resources"


def _bounds(metadata: list[Any]) -> tuple[float | None, float | None]:
    lo = hi = None
    for m in metadata:
        if isinstance(m, at.Ge):
            lo = m.ge
        elif isinstance(m, at.Le):
            hi = m.le
    return lo, hi


def _leaf(path: str, ann: Any, default: Any, help_text: str, metadata: list[Any]) -> FormField:
    optional = False
    if typing.get_origin(ann) in (typing.Union, types.UnionType):
        args = [a for a in typing.get_args(ann) if a is not type(None)]
        optional, ann = len(args) < len(typing.get_args(ann)), args[0]
    origin, args = typing.get_origin(ann), typing.get_args(ann)
    lo, hi = _bounds(metadata)
    common = {"path": path, "default": default, "help": help_text, "optional": optional, "group": group_of(path)}
    if path in _REGISTRIES:
        return FormField(kind="choice", options=_REGISTRIES[path], **common)
    if origin is Literal:
        return FormField(kind="choice", options=args, **common)
    if origin is list and typing.get_origin(args[0]) is Literal:
        return FormField(kind="multichoice", options=typing.get_args(args[0]), **common)
    if origin is list:
        return FormField(kind="floatlist" if args[0] is float else "intlist", **common)
    if origin is tuple:
        return FormField(kind="pair", **common)
    if ann is bool:
        return FormField(kind="optbool" if optional else "bool", **common)
    if ann in (int, float):
        return FormField(kind=ann.__name__, min=lo, max=hi, **common)
    return FormField(kind="str", **common)


def form_fields(model: type[BaseModel] = RunSpec, prefix: str = "") -> list[FormField]:
    """Every leaf field of the schema, in declaration order."""
    out: list[FormField] = []
    for name, info in model.model_fields.items():
        path = f"{prefix}{name}"
        ann = info.annotation
        if isinstance(ann, type) and issubclass(ann, BaseModel):
            out.extend(form_fields(ann, f"{path}."))
            continue
        default = info.get_default(call_default_factory=True)
        out.append(_leaf(path, ann, default, info.description or "", list(info.metadata)))
    return out


FIELDS: tuple[FormField, ...] = tuple(form_fields())
FIELD_PATHS = frozenset(f.path for f in FIELDS)


def get_path(data: dict[str, Any], path: str, default: Any = None) -> Any:
    node: Any = data
    for part in path.split("."):
        if not isinstance(node, dict) or part not in node:
            return default
        node = node[part]
    return node


def set_path(data: dict[str, Any], path: str, value: Any) -> None:
    parts = path.split(".")
    node = data
    for part in parts[:-1]:
        node = node.setdefault(part, {})
    node[parts[-1]] = value


def flatten(spec: dict[str, Any]) -> dict[str, Any]:
    """{dotted field: value} for every schema field (missing ones: the schema default)."""
    return {f.path: get_path(spec, f.path, f.default) for f in FIELDS}


_MENTION = re.compile(r"\b((?:" + "|".join(_SECTIONS) + r")\.[a-z_]+(?:\.[a-z_]+)*)")


def field_for_error(loc: str, message: str) -> str | None:
    """The form field an error belongs beside: its own location, the longest field path it
    starts with (tuple items: optim.betas.0), or a field its message names (model validators
    report on the section: "data.path is required for imagefolder")."""
    if loc in FIELD_PATHS:
        return loc
    parts = loc.split(".")
    for n in range(len(parts) - 1, 0, -1):
        if ".".join(parts[:n]) in FIELD_PATHS:
            return ".".join(parts[:n])
    for mention in _MENTION.findall(message):
        if mention in FIELD_PATHS:
            return mention
    return None


def errors_by_field(errors: list[tuple[str, str]]) -> tuple[dict[str, list[str]], list[str]]:
    """Split SpecError.errors into {field path: messages} and messages that belong to no field."""
    by_field: dict[str, list[str]] = {}
    general: list[str] = []
    for loc, message in errors:
        target = field_for_error(loc, message)
        if target is None:
            general.append(f"{loc}: {message}")
        else:
            by_field.setdefault(target, []).append(message)
    return by_field, general


def validate(values: dict[str, Any]) -> tuple[RunSpec | None, list[tuple[str, str]]]:
    """A nested spec dict → (RunSpec, []) or (None, [(field, message), ...])."""
    try:
        return RunSpec.from_dict(values), []
    except SpecError as e:
        return None, list(e.errors)
