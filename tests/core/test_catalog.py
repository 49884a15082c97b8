"""core/catalog.py is what every other module reads, so these tests check what it says against what is really
there: torchvision's weights (file and preprocessing), every model built with its named stages and head, the New
run form's rules, and which per-epoch metrics the run spec and the sweep spec accept. Nothing here compares two
lists that were written by hand; the catalog is the only list."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
import torchvision
from torch import nn

from app.present import form_rules
from core import catalog
from core.catalog import DATASETS, METRICS, MODEL_NAMES, MODELS
from core.config import RunSpec, SpecError
from core.models import BUILDERS, build_model, pretrained_weights_path
from core.optim import apply_transfer
from core.spec_sections import ModelSpec
from sweep.spec import SweepSpec, SweepSpecError

PRETRAINED = sorted(catalog.PRETRAINED_MODELS)
# torchvision's weights files (timm's are checked against timm in tests/core/test_timm_models.py)
TORCHVISION_PRETRAINED = [n for n in PRETRAINED if MODELS[n].library == "torchvision"]


# --- models ----------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("name", TORCHVISION_PRETRAINED)
def test_the_weights_file_and_preprocessing_are_torchvisions(name):
    """The catalog copies torchvision's weight metadata as plain data (no torchvision import for the dashboard):
    the copy must be what this torchvision says, or a pretrained run would look for the wrong file."""
    entry = MODELS[name]
    weights = torchvision.models.get_model_weights(entry.builder)[entry.weights.name]
    assert Path(weights.url).name == entry.weights.file
    t, p = weights.transforms(), entry.weights.preprocessing
    assert (list(t.crop_size), list(t.resize_size)) == ([p.input_size], [p.resize_size])
    assert (tuple(t.mean), tuple(t.std)) == (p.mean, p.std)
    assert t.interpolation.value == p.interpolation


@pytest.mark.parametrize("name", MODEL_NAMES)
def test_every_model_builds_with_its_stages_and_a_head_sized_to_the_task(name):
    entry = MODELS[name]
    assert entry.family in BUILDERS
    torch.manual_seed(0)
    model = build_model(ModelSpec(name=name, hidden=16), 7, 3, 16)
    assert [n for n, _ in model.stages()] == [s.name for s in entry.stages] + ["head"]
    for stage in entry.stages:
        for path in stage.modules:
            weights = list(model.net.get_submodule(path).parameters())
            assert weights, f"{name}: stage {stage.name} has no weights at {path}"
    head = model.net.get_submodule(entry.head)
    assert isinstance(head, nn.Linear) and head.out_features == 7
    if entry.footprint is not None:
        assert head.in_features == entry.footprint.head_features
    assert model(torch.randn(2, 3, 16, 16)).shape == (2, 7)


@pytest.mark.parametrize("name", PRETRAINED)
def test_transfer_learning_works_on_every_pretrained_models_stages(name):
    """feature_extract trains the head alone, finetune_last_n the top stage too, and unfreezing reaches the stem."""
    model = build_model(ModelSpec(name=name), 4, 3, 32)
    names = [s.name for s in MODELS[name].stages]
    extract = ModelSpec(name=name, pretrained=True, transfer="feature_extract", unfreeze_every=1, unfreeze_at_epoch=2)
    assert apply_transfer(model, extract, 1) == ["head"]
    assert {n for n, p in model.net.named_parameters() if p.requires_grad} == {
        n for n, _ in model.net.get_submodule(MODELS[name].head).named_parameters(prefix=MODELS[name].head)
    }
    assert apply_transfer(model, extract, 2) == [names[-1], "head"]
    assert apply_transfer(model, extract, len(names) + 1) == [*names, "head"]
    last = ModelSpec(name=name, pretrained=True, transfer="finetune_last_n", last_n=1)
    assert apply_transfer(model, last, 1) == [names[-1], "head"]


def test_a_pretrained_model_is_looked_for_in_the_catalogs_file(monkeypatch, tmp_path):
    monkeypatch.setenv("TORCH_HOME", str(tmp_path))
    for name in TORCHVISION_PRETRAINED:
        assert pretrained_weights_path(name) == tmp_path / "hub" / "checkpoints" / MODELS[name].weights.file
    with pytest.raises(ValueError, match="has no pretrained weights"):
        build_model(ModelSpec(name="mlp", pretrained=True), 3, 1, 8)


def test_an_unknown_model_or_dataset_fails_with_the_known_ones():
    for lookup, kind, known in (
        (catalog.model, "model", MODEL_NAMES),
        (catalog.dataset, "dataset", catalog.DATASET_NAMES),
    ):
        with pytest.raises(ValueError) as e:
            lookup("resnet9000")
        assert f"unknown {kind} 'resnet9000'" in str(e.value) and all(n in str(e.value) for n in known)


# --- the New run form ------------------------------------------------------------------------------------------


@pytest.mark.parametrize("name", MODEL_NAMES)
def test_the_form_offers_what_each_model_takes(name):
    entry = MODELS[name]
    values = {"model.name": name, "model.transfer": "finetune_last_n"}
    assert form_rules.relevant("model.pretrained", values) == (entry.weights is not None)
    assert form_rules.relevant("model.last_n", values) == (entry.weights is not None)
    assert form_rules.relevant("model.hidden", values) == (entry.library == "torchdeck")


@pytest.mark.parametrize("name", list(DATASETS))
def test_the_form_asks_for_what_each_dataset_reads(name):
    kind = DATASETS[name].kind
    values = {"data.name": name}
    assert form_rules.relevant("data.path", values) == (kind in ("folder", "torchvision"))
    assert form_rules.relevant("data.download", values) == (kind == "torchvision")
    assert form_rules.relevant("data.num_classes", values) == (kind == "generated")
    assert form_rules.relevant("data.max_bad_fraction", values) == (kind == "folder")


# --- per-epoch metrics -----------------------------------------------------------------------------------------


@pytest.mark.parametrize("key", list(METRICS))
def test_a_monitor_is_accepted_by_the_run_spec_exactly_when_the_catalog_allows_it(key):
    data = {"train": {"early_stopping": {"monitor": key}}}
    if METRICS[key].monitor:
        es = RunSpec.from_dict(data).train.early_stopping
        assert es.monitor == key and es.resolved_mode == METRICS[key].better
    else:
        with pytest.raises(SpecError, match="train.early_stopping.monitor"):
            RunSpec.from_dict(data)


@pytest.mark.parametrize("key", list(METRICS))
def test_a_sweep_objective_is_accepted_exactly_when_the_catalog_allows_it(key):
    data = {"space": {"optim.lr": {"choice": [0.1, 0.01]}}, "objective": {"metric": key}}
    if METRICS[key].objective:
        spec = SweepSpec.from_dict(data)
        assert spec.metric == key and spec.mode == METRICS[key].better
        assert spec.stored_metric == (METRICS[key].stored or key)
    else:
        with pytest.raises(SweepSpecError) as e:
            SweepSpec.from_dict(data)
        assert "objective.metric" in dict(e.value.errors)


def test_made_up_metrics_are_neither_monitors_nor_objectives():
    with pytest.raises(SpecError):
        RunSpec.from_dict({"train": {"early_stopping": {"monitor": "val/nonsense"}}})
    with pytest.raises(SweepSpecError):
        SweepSpec.from_dict({"space": {"optim.lr": {"choice": [0.1]}}, "objective": {"metric": "val/nonsense"}})


def test_train_loss_per_epoch_is_read_from_train_epoch_loss_and_every_metric_has_a_chart():
    assert catalog.stored_key("train/loss") == "train/epoch_loss" and catalog.stored_key("val/acc") == "val/acc"
    charts = catalog.chart_keys()
    assert charts["Loss"][:3] == ("train/loss", "train/epoch_loss", "val/loss")  # the Run page's first chart, as before
    assert charts["Loss"][3:] == ("val/loss_ema",)  # then the EMA of the weights' (train.ema), when a run keeps one
    drawn = {k for keys in charts.values() for k in keys}
    assert all(k in drawn and catalog.stored_key(k) in drawn for k in METRICS)
