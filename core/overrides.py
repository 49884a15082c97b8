"""Spec errors a person can act on, and `--set section.key=value` overrides (no torch, no pydantic models)."""

from __future__ import annotations

import json
from typing import Any

import yaml
from pydantic import ValidationError

from core import bounded_yaml


class SpecError(ValueError):
    """An invalid spec: a list of (field path, what is wrong and what is allowed)."""

    def __init__(self, errors: list[tuple[str, str]]):
        self.errors = errors
        super().__init__("invalid run spec:\n" + "\n".join(f"  {f}: {m}" for f, m in errors))


def describe_errors(e: ValidationError) -> list[tuple[str, str]]:
    """Turn pydantic's errors into (dotted field, message) pairs a person can act on."""
    out = []
    for err in e.errors():
        loc = ".".join(str(p) for p in err["loc"]) or "(root)"
        msg = err["msg"].removeprefix("Value error, ")
        if err["type"] == "extra_forbidden":
            msg = "unknown key (check the spelling; allowed keys are the schema's fields)"
        out.append((loc, msg))
    return out


def apply_overrides(data: dict[str, Any], overrides: list[str]) -> dict[str, Any]:
    """Apply `--set a.b.c=value` overrides; values are parsed as YAML scalars/lists."""
    data = json.loads(json.dumps(data))  # deep copy, JSON-safe
    for item in overrides:
        if "=" not in item:
            raise SpecError([(item, "an override must look like section.key=value, e.g. train.epochs=5")])
        path, raw = item.split("=", 1)
        keys = [k for k in path.strip().split(".") if k]
        if not keys:
            raise SpecError([(item, "empty key in override")])
        node = data
        for k in keys[:-1]:
            child = node.setdefault(k, {})
            if not isinstance(child, dict):
                raise SpecError([(path, f"{k} is not a section")])
            node = child
        try:
            node[keys[-1]] = bounded_yaml.load(raw, f"the value of {path}") if raw.strip() else None
        except (bounded_yaml.YamlRefused, yaml.YAMLError) as e:
            raise SpecError([(path, f"cannot read {raw[:60]!r}: {' '.join(str(e).split())[:200]}")]) from None
    return data
