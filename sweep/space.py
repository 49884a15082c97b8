"""A sweep's search space: its dimensions (ParamSpec: choices or a range, and the values a grid takes from it,
counted before any is made) and the dotted run-spec fields they may name, each checked against the base spec.

Torch-free: the dashboard and the CLI validate sweeps with it (through sweep/spec.py).
"""

from __future__ import annotations

import math
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from core.admission import FILE_FIELDS
from core.config import RunSpec, apply_overrides, describe_errors

MAX_CHOICES = 200
MAX_GRID = 10_000  # configurations of a grid, and values of one of its dimensions (a sweep's runs: alike)
MAX_STEPS = 2**53  # values of a stepped float range: beyond, neighbouring floats are no longer `step` apart
NOT_SWEPT = ("name", "seed")  # a sweep names its runs, and `seeds` repeats a configuration with several seeds

Scalar = bool | int | float | str | None


class ParamSpec(BaseModel):
    """One dimension of the space: exactly one of choice, uniform, loguniform or int."""

    model_config = ConfigDict(extra="forbid", populate_by_name=True)

    choice: list[Scalar] | None = Field(
        None, min_length=1, max_length=MAX_CHOICES, description="Values to choose from."
    )
    uniform: tuple[float, float] | None = Field(None, description="A range [low, high], sampled evenly.")
    loguniform: tuple[float, float] | None = Field(
        None, description="A range [low, high] > 0, sampled evenly in log space."
    )
    int_: tuple[int, int] | None = Field(None, alias="int", description="Integers in [low, high].")
    step: float | None = Field(None, gt=0, description="Spacing of a uniform or int range's values.")
    num: int | None = Field(
        None,
        ge=2,
        le=MAX_CHOICES,
        description="Points of a range in a grid (evenly spaced, geometrically for loguniform).",
    )

    @model_validator(mode="after")
    def _one_kind(self) -> ParamSpec:
        given = [k for k in ("choice", "uniform", "loguniform", "int_") if getattr(self, k) is not None]
        if len(given) != 1:
            raise ValueError(
                "give exactly one of choice, uniform, loguniform, int"
                + (f" (got {', '.join(k.rstrip('_') for k in given)})" if given else "")
            )
        if self.choice is not None:
            if len({repr(v) for v in self.choice}) != len(self.choice):
                raise ValueError("choice lists a value twice")
            if self.step is not None or self.num is not None:
                raise ValueError("step and num are for ranges, not for choice")
            return self
        low, high = getattr(self, given[0])
        if not (math.isfinite(low) and math.isfinite(high)) or low >= high:
            raise ValueError(f"a range needs low < high, both finite; got [{low}, {high}]")
        if self.uniform is not None:
            _check_float_range(low, high, self.step)
        if self.loguniform is not None and low <= 0:
            raise ValueError(f"loguniform needs low > 0; got {low}")
        if self.step is not None and self.loguniform is not None:
            raise ValueError("step is for uniform and int ranges; a loguniform grid takes num")
        if self.int_ is not None and self.step is not None and self.step != int(self.step):
            raise ValueError(f"an int range's step must be a whole number; got {self.step}")
        return self

    @property
    def kind(self) -> str:
        return next(k.rstrip("_") for k in ("choice", "uniform", "loguniform", "int_") if getattr(self, k) is not None)

    def points(self) -> int | None:
        """How many values a grid takes from this dimension, counted without making them (a grid is sized, and
        refused when too large, before any list is built); None for a range with neither num nor step."""
        if self.choice is not None:
            return len(self.choice)
        if self.int_ is not None and self.num is not None:
            return len(self._int_points())  # at most num (≤ MAX_CHOICES): rounding may merge some
        if self.num is not None:
            return self.num
        if self.int_ is not None:
            low, high = self.int_
            return (high - low) // int(self.step or 1) + 1
        if self.step is not None:
            low, high = self.uniform  # type: ignore[misc]
            return math.floor((high - low) / self.step + 1e-9) + 1  # finite and ≤ MAX_STEPS + 1: validated
        return None

    def _int_points(self) -> list[int]:
        (low, high), n = self.int_, self.num  # type: ignore[misc]
        return sorted({round(low + (high - low) * i / (n - 1)) for i in range(n)})

    def grid(self) -> list[Scalar]:
        """The values a grid takes: the choices, an int range's integers, or num points (or step spacing) of a range.
        Sized first: ValueError for more than MAX_GRID values, before any is made."""
        n = self.points()
        if n is None:
            raise ValueError("a grid needs discrete values: give num (points of the range) or step")
        if n > MAX_GRID:
            raise ValueError(f"{n:,} grid points; a grid has at most {MAX_GRID:,}: raise the step, or give num")
        if self.choice is not None:
            return list(self.choice)
        if self.int_ is not None:
            low, high = self.int_
            if self.num is not None:
                return list(self._int_points())
            return list(range(low, high + 1, int(self.step or 1)))
        low, high = self.uniform or self.loguniform  # type: ignore[misc]
        if self.step is not None:
            return [round(low + i * self.step, 12) for i in range(n)]
        if self.loguniform is not None:
            return [
                float(f"{math.exp(math.log(low) + (math.log(high) - math.log(low)) * i / (self.num - 1)):.6g}")
                for i in range(self.num)
            ]
        return [float(f"{low + (high - low) * i / (self.num - 1):.6g}") for i in range(self.num)]

    def bounds(self) -> list[Scalar]:
        """Values that must each make a valid run spec (the choices, or a range's ends)."""
        if self.choice is not None:
            return list(self.choice)
        return list(self.uniform or self.loguniform or self.int_)  # type: ignore[arg-type]


def _check_float_range(low: float, high: float, step: float | None) -> None:
    """A uniform range a float can span, and a step that cuts it into points floats tell apart (the count is
    computed, never the points): an overflow is a field error, not a crash."""
    if not math.isfinite(high - low):
        raise ValueError(f"the range [{low:g}, {high:g}] is wider than a float can hold: narrow it")
    if step is None:
        return
    count = (high - low) / step
    if not math.isfinite(count) or count > MAX_STEPS:
        raise ValueError(
            f"step {step:g} cuts [{low:g}, {high:g}] into {count:.3g} points, more than floats tell "
            f"apart ({MAX_STEPS:.3g}): raise the step"
        )


def known_paths(model: type[BaseModel] = RunSpec, prefix: str = "") -> list[str]:
    """Every leaf field of the run spec, dotted (sections walked), `name` and `seed` left out."""
    out = []
    for name, field in model.model_fields.items():
        annotation = field.annotation
        if isinstance(annotation, type) and issubclass(annotation, BaseModel):
            out += known_paths(annotation, f"{prefix}{name}.")
        elif f"{prefix}{name}" not in NOT_SWEPT:
            out.append(f"{prefix}{name}")
    return out


def sweepable_paths() -> list[str]:
    """The fields a space may name: every leaf field but `name`, `seed` and the fields naming files or datasets."""
    return [p for p in known_paths() if p not in FILE_FIELDS]


def set_path(data: dict[str, Any], path: str, value: Any) -> None:
    *sections, leaf = path.split(".")
    node = data
    for key in sections:
        node = node.setdefault(key, {})
    node[leaf] = value


def check_path(path: str, param: ParamSpec, base: RunSpec, *, stored: bool = False) -> None:
    """A sweepable field, and every value the space can give it (choices, a range's ends) makes a valid run spec."""
    if path in NOT_SWEPT:
        raise ValueError(
            f"space.{path}: not swept"
            + ("; use `seeds: k` to run each configuration with k seeds" if path == "seed" else "")
        )
    if path in FILE_FIELDS and not stored:
        raise ValueError(
            f"space.{path}: names a file or a dataset, which a sweep never sweeps: every trial reads "
            "what its base reads, checked when the sweep is launched; set it in the base"
        )
    if path not in known_paths():
        raise ValueError(f"space.{path}: unknown field; known fields: {', '.join(sweepable_paths())}")
    data = base.model_dump(mode="json")
    for value in param.bounds():
        trial = apply_overrides(data, [])
        set_path(trial, path, value)
        try:
            RunSpec.model_validate(trial)
        except ValidationError as e:
            problems = "; ".join(f"{loc}: {msg}" for loc, msg in describe_errors(e))
            raise ValueError(f"space.{path}: the value {value!r} makes an invalid run: {problems}") from None
