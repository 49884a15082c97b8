"""The sweep specification: a base run spec, a search space over its dotted fields, a method, an objective,
a budget, a pruner and a number of seeds. Validated like RunSpec: every error names its field.

```yaml
space:
  optim.lr: {loguniform: [1.0e-4, 1.0e-1], num: 4}   # num: grid points of a continuous range
  optim.weight_decay: {choice: [0.0, 1.0e-4, 1.0e-3]}
  train.batch_size: {int: [32, 128], step: 32}
method: grid            # grid | random | tpe
objective: {metric: val/acc, mode: max}   # default: the base spec's early-stopping monitor
budget: {trials: 12, parallel: 2}         # a grid's default is its size
pruner: {kind: asha, min_epochs: 1, reduction_factor: 3}   # none | median | asha
seeds: 1                # each configuration run with this many seeds, as one group
```

A space never names a field that names a file or a dataset (core.admission.FILE_FIELDS): every trial reads
what its base reads, which the dashboard checks when the sweep is launched. A grid is sized arithmetically,
and refused above MAX_GRID with the field and its size, before any of its values is made.

Torch-free: the dashboard and the CLI validate sweeps with it.
"""

from __future__ import annotations

import math
from itertools import product
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, ValidationInfo, model_validator

from core import bounded_yaml, catalog
from core.admission import FILE_FIELDS
from core.catalog import OBJECTIVES
from core.config import RunSpec, SpecError, apply_overrides, describe_errors
from core.names import PRUNERS, SWEEP_METHODS

MAX_TRIALS = 2_000
MAX_RUNS = 10_000  # trials × seeds
MAX_CHOICES = 200
MAX_PARAMS = 20
MAX_GRID = MAX_RUNS  # configurations of a grid, and values of one of its dimensions
MAX_STEPS = 2**53  # values of a stepped float range: beyond, neighbouring floats are no longer `step` apart
MAX_SEED = 2**32 - 1
NOT_SWEPT = ("name", "seed")  # a sweep names its runs, and `seeds` repeats a configuration with several seeds


class _Section(BaseModel):
    model_config = ConfigDict(extra="forbid", populate_by_name=True)


Scalar = bool | int | float | str | None


class ParamSpec(_Section):
    """One dimension of the space: exactly one of choice, uniform, loguniform or int."""

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


class ObjectiveSpec(_Section):
    metric: Literal[OBJECTIVES] | None = Field(
        None, description="Per-epoch metric the sweep optimises (default: the base spec's early-stopping monitor)."
    )
    mode: Literal["auto", "min", "max"] = Field("auto", description="auto: min for losses, max for accuracies and F1.")


class BudgetSpec(_Section):
    trials: int | None = Field(None, ge=1, le=MAX_TRIALS, description="Configurations to try (a grid: its size).")
    parallel: int = Field(1, ge=1, le=256, description="Configurations in flight at once (each with its seeds' runs).")


class PrunerSpec(_Section):
    kind: Literal[PRUNERS] = Field("none", description="none | median | asha (successive halving).")
    min_epochs: int = Field(1, ge=1, le=10_000, description="asha: epochs of the first rung.")
    reduction_factor: int = Field(3, ge=2, le=10, description="asha: 1 in this many trials goes on at each rung.")
    startup_trials: int = Field(3, ge=0, le=1_000, description="median: completed trials before any is pruned.")
    warmup_epochs: int = Field(1, ge=0, le=10_000, description="median: epochs of each trial never judged.")


class SweepSpec(_Section):
    """Many runs as one experiment. YAML keys mirror these fields."""

    name: str | None = Field(None, max_length=200, description="A name for the sweep (its runs are named after it).")
    base: RunSpec = Field(default_factory=RunSpec, description="The run every trial starts from.")
    space: dict[str, ParamSpec] = Field(..., min_length=1, max_length=MAX_PARAMS, description="Dotted field -> values.")
    method: Literal[SWEEP_METHODS] = Field(
        "tpe", description="grid: every combination; random; tpe: Bayesian (Optuna)."
    )
    objective: ObjectiveSpec = Field(default_factory=ObjectiveSpec, description="What the sweep optimises.")
    budget: BudgetSpec = Field(default_factory=BudgetSpec, description="How many trials, how many at once.")
    pruner: PrunerSpec = Field(default_factory=PrunerSpec, description="Stop trailing trials early.")
    seeds: int = Field(1, ge=1, le=20, description="Seeds per configuration (base seed, +1, ...), shown as one group.")
    seed: int | None = Field(None, ge=0, le=2**32 - 1, description="The sampler's seed (default: the base spec's).")
    tags: list[str] = Field(default_factory=list, max_length=20, description="Tags of every trial's run.")

    @model_validator(mode="after")
    def _check(self, info: ValidationInfo) -> SweepSpec:
        stored = bool((info.context or {}).get("stored"))
        for path, param in self.space.items():
            check_path(path, param, self.base, stored=stored)
        if self.base.seed + self.seeds - 1 > MAX_SEED:
            raise ValueError(
                f"seeds: the base seed {self.base.seed} + {self.seeds - 1} is above {MAX_SEED}: lower base.seed"
            )
        if self.method == "grid":
            size = self.grid_size()
            if self.budget.trials is not None and self.budget.trials < size:
                raise ValueError(
                    f"budget.trials: the grid has {size} configurations, more than budget.trials={self.budget.trials}: "
                    "raise the budget or shrink the space"
                )
        if self.trials * self.seeds > MAX_RUNS:
            raise ValueError(
                f"budget.trials: {self.trials} trials × {self.seeds} seeds = {self.trials * self.seeds} runs; "
                f"at most {MAX_RUNS} per sweep"
            )
        if self.pruner.kind != "none" and self.base.train.epochs < 2:
            raise ValueError(
                "pruner.kind: a pruner needs base.train.epochs ≥ 2 (a trial is judged at the end of each epoch but the last)"
            )
        return self

    # --- derived -------------------------------------------------------------------------------------
    def grid_values(self) -> dict[str, list[Scalar]]:
        out = {}
        for path, param in self.space.items():
            try:
                out[path] = param.grid()
            except ValueError as e:
                raise ValueError(f"space.{path}: {e}") from None
        return out

    def grid_size(self) -> int:
        """The grid's configurations, from each dimension's size (nothing built): ValueError naming the field for
        a dimension that cannot be a grid, or one or a product above MAX_GRID (with its size)."""
        size = 1
        for path, param in self.space.items():
            n = param.points()
            if n is None:
                raise ValueError(f"space.{path}: a grid needs discrete values: give num (points of the range) or step")
            if n > MAX_GRID:
                raise ValueError(
                    f"space.{path}: {n:,} grid points; a grid has at most {MAX_GRID:,} configurations: "
                    "raise the step, or give num"
                )
            size *= n
        if size > MAX_GRID:
            raise ValueError(
                f"space: the grid has {size:,} configurations; at most {MAX_GRID:,}: shrink the space, "
                "or use method random or tpe"
            )
        return size

    @property
    def trials(self) -> int:
        if self.budget.trials is not None:
            return min(self.budget.trials, self.grid_size()) if self.method == "grid" else self.budget.trials
        return self.grid_size() if self.method == "grid" else 20

    @property
    def metric(self) -> str:
        return self.objective.metric or self.base.train.early_stopping.monitor

    @property
    def stored_metric(self) -> str:
        """The metric key the per-epoch objective is stored under (train/loss per epoch is train/epoch_loss)."""
        return catalog.stored_key(self.metric)

    @property
    def mode(self) -> Literal["min", "max"]:
        if self.objective.mode != "auto":
            return self.objective.mode
        return catalog.better(self.metric)

    @property
    def sampler_seed(self) -> int:
        return self.base.seed if self.seed is None else self.seed

    def grid_configurations(self) -> list[dict[str, Scalar]]:
        values = self.grid_values()
        return [dict(zip(values, combo, strict=True)) for combo in product(*values.values())]

    def run_spec(self, params: dict[str, Any], seed_index: int = 0, name: str | None = None) -> RunSpec:
        """The base spec with `params` set (dotted fields) and the group's seed_index-th seed."""
        data = self.base.model_dump(mode="json")
        data = apply_overrides(data, [])
        for path, value in params.items():
            set_path(data, path, value)
        data["seed"] = self.base.seed + seed_index
        data["name"] = name
        return RunSpec.model_validate(data)

    def runs(self) -> int:
        return self.trials * self.seeds

    def max_epochs(self) -> int:
        return self.runs() * self.base.train.epochs

    # --- YAML ----------------------------------------------------------------------------------------
    def to_yaml(self) -> str:
        return yaml.safe_dump(self.model_dump(mode="json", by_alias=True, exclude_none=True), sort_keys=False)

    @classmethod
    def from_yaml(cls, text: str, base: RunSpec | None = None, overrides: list[str] | None = None) -> SweepSpec:
        """A sweep YAML (with `base:` inside, or `base` given: a RunSpec read from its own file). `overrides`
        (`--set a.b=v`) apply to the base."""
        data = _read(text)
        if base is not None:
            if "base" in data:
                raise SweepSpecError([("base", "given twice: in the sweep YAML and as the run spec")])
            data["base"] = base.model_dump(mode="json")
        if overrides:
            data["base"] = apply_overrides(data.get("base") or {}, overrides)
        return cls.from_dict(data)

    @classmethod
    def stored(cls, data: Any) -> SweepSpec:
        """A sweep as stored. A space over a file-naming field, stored before such fields were refused, still
        loads (its page shows it); the controller refuses each of its trials (core.admission.check_trial)."""
        return cls.model_validate(data, context={"stored": True})

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> SweepSpec:
        try:
            return cls.model_validate(data)
        except ValidationError as e:
            raise SweepSpecError([_named(loc, msg) for loc, msg in describe_errors(e)]) from None
        except SpecError as e:
            raise SweepSpecError(e.errors) from None


class SweepSpecError(SpecError):
    """An invalid sweep spec: (field path, what is wrong and what is allowed) pairs."""

    def __init__(self, errors: list[tuple[str, str]]):
        super().__init__(errors)
        self.args = ("invalid sweep spec:\n" + "\n".join(f"  {f}: {m}" for f, m in errors),)

    def __str__(self) -> str:
        return self.args[0]


def _named(loc: str, msg: str) -> tuple[str, str]:
    """A whole-spec check names its field first (`space.optim.lr: ...`): show it as the error's field."""
    head, sep, rest = msg.partition(": ")
    if loc == "(root)" and sep and head.split(".")[0] in SweepSpec.model_fields and " " not in head:
        return head, rest
    return loc, msg


def _read(text: str) -> dict[str, Any]:
    try:
        data = bounded_yaml.load(text, "the sweep") or {}
    except bounded_yaml.YamlRefused as e:
        raise SweepSpecError([("(root)", str(e))]) from None
    except yaml.YAMLError as e:
        raise SweepSpecError([("(root)", f"not valid YAML: {' '.join(str(e).split())[:300]}")]) from None
    if not isinstance(data, dict):
        raise SweepSpecError(
            [("(root)", "a sweep spec must be a YAML mapping (space, method, objective, budget, ...)")]
        )
    return data


# --- dotted fields -----------------------------------------------------------------------------------------
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
