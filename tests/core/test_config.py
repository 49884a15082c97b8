"""RunSpec: defaults, YAML round trips, overrides, presets, and errors that name the field."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from core.catalog import DATASET_NAMES, MODEL_NAMES
from core.config import RunSpec, SpecError, load_spec

CONFIGS = sorted((Path(__file__).parents[2] / "configs").glob("*.yaml"))


def _errors(data: dict, overrides: list[str] | None = None) -> dict[str, str]:
    with pytest.raises(SpecError) as e:
        RunSpec.from_dict(data, overrides)
    return dict(e.value.errors)


def test_defaults_are_valid_and_documented():
    spec = RunSpec()
    assert spec.data.name == "digits" and spec.model.name == "simple_cnn"
    # every field of every section carries a description where it is declared (the form's help text)
    sections = [RunSpec] + [
        f.annotation for f in RunSpec.model_fields.values() if hasattr(f.annotation, "model_fields")
    ]
    for cls in sections:
        for name, f in cls.model_fields.items():
            assert f.description, f"{cls.__name__}.{name} has no description"


def test_yaml_round_trip_is_identity():
    spec = RunSpec.from_dict(
        {
            "model": {"name": "resnet18", "pretrained": True, "transfer": "feature_extract"},
            "schedule": {"name": "multistep", "milestones": [3, 6]},
            "train": {"epochs": 3},
        }
    )
    again = RunSpec.from_yaml(spec.to_yaml())
    assert again == spec
    assert again.spec_hash() == spec.spec_hash()
    assert yaml.safe_load(spec.to_yaml())["model"]["name"] == "resnet18"


def test_spec_hash_ignores_name_but_not_hyperparameters():
    a = RunSpec(name="a")
    assert a.spec_hash() == RunSpec(name="b").spec_hash()
    assert a.spec_hash() != RunSpec.from_dict({}, ["optim.lr=0.01"]).spec_hash()


def test_dotted_overrides_parse_yaml_values():
    spec = RunSpec.from_dict(
        {}, ["train.epochs=5", "optim.lr=3e-4", "export.formats=[onnx]", "data.augment.hflip=true"]
    )
    assert spec.train.epochs == 5 and spec.optim.lr == 3e-4
    assert spec.export.formats == ["onnx"] and spec.data.augment.hflip is True


@pytest.mark.parametrize("path", CONFIGS, ids=[p.stem for p in CONFIGS])
def test_every_preset_validates(path: Path):
    spec = load_spec(path)
    assert spec.name, "presets carry a name"
    assert spec.export.formats, "presets export and verify their model"


def test_required_presets_exist():
    combos = {(s.data.name, s.model.name, s.model.pretrained) for s in map(load_spec, CONFIGS)}
    assert ("digits", "simple_cnn", False) in combos
    assert ("synthetic", "resnet18", True) in combos
    assert ("imagefolder", "mobilenet_v3_small", True) in combos or (
        "imagefolder",
        "mobilenet_v3_large",
        True,
    ) in combos


def test_negative_learning_rate_names_field_and_bound():
    errs = _errors({"optim": {"lr": -0.1}})
    assert "optim.lr" in errs and "greater than 0" in errs["optim.lr"]


def test_patience_zero_is_refused():
    errs = _errors({"train": {"early_stopping": {"patience": 0}}})
    assert "greater than or equal to 1" in errs["train.early_stopping.patience"]


def test_unknown_model_lists_known_models():
    errs = _errors({"model": {"name": "resnet9000"}})
    msg = errs["model.name"]
    assert "resnet9000" in msg and all(n in msg for n in MODEL_NAMES)


def test_unknown_dataset_lists_known_datasets():
    msg = _errors({"data": {"name": "imagenet"}})["data.name"]
    assert all(n in msg for n in DATASET_NAMES)


def test_fp16_on_cpu_is_refused_with_alternative():
    msg = " ".join(_errors({"device": "cpu", "train": {"precision": "fp16"}}).values())
    assert "fp16" in msg and "bf16" in msg


def test_bad_precision_lists_allowed_values():
    msg = _errors({"train": {"precision": "fp8"}})["train.precision"]
    assert "'fp32'" in msg and "'bf16'" in msg


def test_misspelt_key_is_an_error_not_ignored():
    errs = _errors({"train": {"epoch": 5}})
    assert "train.epoch" in errs and "unknown key" in errs["train.epoch"]


def test_imagefolder_needs_a_path():
    msg = " ".join(_errors({"data": {"name": "imagefolder"}}).values())
    assert "data.path" in msg


def test_feature_extraction_without_weights_is_refused():
    msg = " ".join(_errors({"model": {"name": "resnet18", "transfer": "feature_extract"}}).values())
    assert "pretrained" in msg


def test_bad_override_syntax():
    with pytest.raises(SpecError, match="section.key=value"):
        RunSpec.from_dict({}, ["train.epochs"])


def test_spec_file_not_found(tmp_path):
    with pytest.raises(SpecError, match="not found"):
        load_spec(tmp_path / "nope.yaml")


def test_resource_follows_device():
    assert RunSpec(device="cpu").resource == "cpu"
    assert RunSpec(device="cuda").resource == "gpu"
