"""The New run form (app/form_rules.py, which may not import torch) keeps its own lists of the models with
pretrained weights, the small models and the torchvision datasets: they match core's registries."""

from __future__ import annotations

from app import form_rules
from core.config import MODEL_NAMES
from core.data import TV_DATASETS
from core.models import MODELS


def test_the_form_offers_transfer_controls_for_exactly_the_models_with_pretrained_weights():
    assert form_rules.PRETRAINED_MODELS == {name for name, entry in MODELS.items() if entry.tv_name}


def test_the_hidden_layer_width_is_offered_for_exactly_the_small_models():
    assert form_rules.SMALL_MODELS == {name for name, entry in MODELS.items() if entry.family == "small"}
    assert form_rules.PRETRAINED_MODELS | form_rules.SMALL_MODELS == set(MODEL_NAMES)


def test_the_torchvision_datasets_the_form_knows_are_those_core_loads():
    assert form_rules.TORCHVISION_SETS == set(TV_DATASETS)
