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
and refused above MAX_GRID with the field and its size, before any of its values is made. The space's
dimensions and the fields they may name are sweep/space.py.

Torch-free: the dashboard and the CLI validate sweeps with it.
"""

from __future__ import annotations

from itertools import product
from typing import Annotated, Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, ValidationInfo, model_validator

from core import bounded_yaml, catalog
from core.catalog import OBJECTIVES
from core.config import RunSpec, SpecError, apply_overrides, describe_errors
from core.names import PRUNERS, SWEEP_METHODS
from core.spec_base import never_test
from sweep.space import MAX_GRID, ParamSpec, Scalar, check_path, set_path

MAX_TRIALS = 2_000
MAX_RUNS = MAX_GRID  # trials × seeds: as many runs as a grid may have configurations
MAX_PARAMS = 20
MAX_SEED = 2**32 - 1


class _Section(BaseModel):
    model_config = ConfigDict(extra="forbid", populate_by_name=True)


class ObjectiveSpec(_Section):
    metric: Annotated[Literal[OBJECTIVES] | None, never_test("objective.metric")] = Field(
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
                "pruner.kind: a pruner needs base.train.epochs ≥ 2 "
                "(a trial is judged at the end of each epoch but the last)"
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
