"""The sweep spec: YAML in and out, each error naming its field, grids sized and refused beyond the budget."""

from __future__ import annotations

import pytest

from core.config import RunSpec
from sweep.space import known_paths
from sweep.spec import SweepSpec, SweepSpecError

BASE = RunSpec.model_validate({"data": {"name": "digits"}, "train": {"epochs": 6}, "seed": 3})


def errors(text: str) -> dict[str, str]:
    with pytest.raises(SweepSpecError) as e:
        SweepSpec.from_yaml(text, base=BASE)
    assert str(e.value).startswith("invalid sweep spec:")
    return dict(e.value.errors)


def test_yaml_round_trip_and_defaults():
    spec = SweepSpec.from_yaml(
        "space:\n  optim.lr: {loguniform: [1.0e-4, 1.0e-1]}\n  train.batch_size: {int: [16, 64], step: 16}\n", base=BASE
    )
    assert spec.method == "tpe" and spec.trials == 20 and spec.budget.parallel == 1
    assert spec.metric == "val/loss" and spec.mode == "min" and spec.sampler_seed == 3  # from the base's early stopping
    again = SweepSpec.from_yaml(spec.to_yaml())
    assert again == spec and "int:" in spec.to_yaml()


def test_val_f1_macro_is_an_objective_higher_is_better_read_where_it_is_stored():
    spec = SweepSpec.from_yaml("space: {optim.lr: {choice: [0.1, 0.01]}}\nobjective: {metric: val/f1_macro}", base=BASE)
    assert (spec.metric, spec.mode, spec.stored_metric) == ("val/f1_macro", "max", "val/f1_macro")
    monitored = BASE.model_copy(
        update={
            "train": BASE.train.model_copy(
                update={"early_stopping": BASE.train.early_stopping.model_copy(update={"monitor": "val/f1_macro"})}
            )
        }
    )
    by_default = SweepSpec.from_yaml("space: {optim.lr: {choice: [0.1, 0.01]}}", base=monitored)
    assert (by_default.metric, by_default.mode) == ("val/f1_macro", "max")  # the base's early-stopping monitor
    assert SweepSpec.from_yaml(spec.to_yaml()) == spec


def test_grids_are_sized_from_choices_steps_and_points():
    spec = SweepSpec.from_yaml(
        "space:\n  optim.lr: {loguniform: [1.0e-4, 1.0e-1], num: 4}\n"
        "  optim.momentum: {uniform: [0.5, 0.9], step: 0.2}\n  train.batch_size: {int: [16, 48], step: 16}\n"
        "method: grid\nseeds: 2",
        base=BASE,
    )
    assert spec.grid_values() == {
        "optim.lr": [0.0001, 0.001, 0.01, 0.1],
        "optim.momentum": [0.5, 0.7, 0.9],
        "train.batch_size": [16, 32, 48],
    }
    assert spec.trials == 36 and spec.runs() == 72 and spec.max_epochs() == 72 * 6
    run = spec.run_spec({"optim.lr": 0.01, "optim.momentum": 0.7, "train.batch_size": 32}, seed_index=1, name="s #0")
    assert (run.optim.lr, run.optim.momentum, run.train.batch_size, run.seed, run.name) == (0.01, 0.7, 32, 4, "s #0")


def test_each_error_names_its_field():
    assert "unknown field; known fields:" in errors("space: {optim.lrr: {choice: [1]}}")["space.optim.lrr"]
    assert "optim.lr" in ", ".join(known_paths()) and "seed" not in known_paths()
    assert "Input should be greater than 0" in errors("space: {optim.lr: {choice: [0.1, -1]}}")["space.optim.lr"]
    assert "low < high" in errors("space: {optim.lr: {uniform: [0.1, 0.01]}}")["space.optim.lr"]
    assert "exactly one of" in errors("space: {optim.lr: {choice: [0.1], uniform: [1, 2]}}")["space.optim.lr"]
    assert "seeds: k" in errors("space: {seed: {choice: [1, 2]}}")["space.seed"]
    assert "give num" in errors("space: {optim.lr: {uniform: [0.01, 0.1]}}\nmethod: grid")["space.optim.lr"]
    assert "'grid', 'random' or 'tpe'" in errors("space: {optim.lr: {choice: [0.1]}}\nmethod: bayes")["method"]
    assert "at least 1 item" in errors("space: {}")["space"]
    assert "unknown key" in errors("space: {optim.lr: {choice: [0.1]}}\nbudgett: {trials: 3}")["budgett"]


def test_a_grid_larger_than_the_budget_is_refused_with_its_size():
    found = errors(
        "space:\n  optim.lr: {loguniform: [1.0e-4, 1.0e-1], num: 5}\n  optim.weight_decay: {choice: [0, 0.1]}\n"
        "method: grid\nbudget: {trials: 8}"
    )
    assert found["budget.trials"].startswith("the grid has 10 configurations, more than budget.trials=8")


def test_a_pruner_needs_more_than_one_epoch_and_yaml_is_bounded():
    one = RunSpec.model_validate({"train": {"epochs": 1}})
    with pytest.raises(SweepSpecError) as e:
        SweepSpec.from_yaml("space: {optim.lr: {choice: [0.1, 0.01]}}\npruner: {kind: asha}", base=one)
    assert "pruner.kind" in dict(e.value.errors)
    assert "(root)" in errors("a: &a [*a, *a]\n" + "b: &b [" + ", ".join(["*a"] * 10) + "]\n" * 1 + "- not yaml: [")


def test_fields_naming_files_or_datasets_are_never_swept():
    from core.admission import FILE_FIELDS
    from sweep.space import sweepable_paths

    assert set(FILE_FIELDS) == {"data.name", "data.path", "data.download", "data.test_path", "model.weights_file"}
    for field, values in (
        ("model.weights_file", ["/etc/shadow"]),
        ("data.path", ["/etc"]),
        ("data.name", ["mnist"]),
        ("data.download", [True, False]),
    ):
        for method in ("grid", "random", "tpe"):
            found = errors(f"space: {{{field}: {{choice: {values}}}}}\nmethod: {method}")
            assert list(found) == [f"space.{field}"] and "names a file or a dataset" in found[f"space.{field}"]
    assert not set(FILE_FIELDS) & set(sweepable_paths()) and set(sweepable_paths()) < set(known_paths())


# Specs that made the old validation build a grid of 10^9 to 10^12 points (a MemoryError after 6.6 s of CPU
# under 600 MB, 15 GB without a limit) or raise an uncaught OverflowError: each must be refused with its field
# (and the grid's size) before any list is built.
BOMBS = {
    "grid, step 1e-12": (
        "space: {optim.momentum: {uniform: [0.0, 0.99], step: 1.0e-12}}\nmethod: grid",
        "space.optim.momentum",
        "grid points",
    ),
    "grid, step 1e-9": (
        "space: {optim.momentum: {uniform: [0.0, 0.99], step: 1.0e-9}}\nmethod: grid",
        "space.optim.momentum",
        "grid points",
    ),
    "grid, 10^15 integers": (
        "space: {model.unfreeze_at_epoch: {int: [1, 1000000000000000]}}\nmethod: grid",
        "space.model.unfreeze_at_epoch",
        "1,000,000,000,000,000 grid points",
    ),
    "grid, 10^6 configurations": (
        "space:\n  optim.lr: {loguniform: [1.0e-5, 1.0e-1], num: 100}\n"
        "  optim.momentum: {uniform: [0.0, 0.9], num: 100}\n"
        "  optim.weight_decay: {uniform: [0.0, 0.1], num: 100}\nmethod: grid",
        "space",
        "the grid has 1,000,000 configurations",
    ),
    "random, step 1e-300 overflows": (
        "space: {optim.lr: {uniform: [1.0e-300, 1.0e300], step: 1.0e-300}}\nmethod: random",
        "space.optim.lr",
        "into inf points",
    ),
    "grid, step 1e-300 overflows": (
        "space: {optim.lr: {uniform: [1.0e-300, 1.0e300], step: 1.0e-300}}\nmethod: grid",
        "space.optim.lr",
        "into inf points",
    ),
}


def test_grids_are_sized_arithmetically_and_bounded_before_anything_is_built():
    from tests._bounded import run_bounded

    found = run_bounded(f"""
        from core.config import RunSpec
        from sweep.spec import SweepSpec
        base = RunSpec.model_validate({{"data": {{"name": "digits"}}, "train": {{"epochs": 6}}}})
        CAP
        texts = {{name: text for name, (text, _, _) in {BOMBS!r}.items()}}
        print(json.dumps({{name: measure(lambda: SweepSpec.from_yaml(text, base=base) and "accepted")
                          for name, text in texts.items()}}))
    """)
    for name, (_, field, words) in BOMBS.items():
        result = found[name]
        assert result.get("raised") == "SweepSpecError", (name, result)
        message = dict(map(tuple, result["errors"])).get(field, "")
        assert words in message, (name, result["errors"])
        assert result["peak"] < 50 * 2**20, (name, result["peak"])  # and no list of the grid's points
