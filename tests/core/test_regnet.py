"""regnet_y_400mf, added as one catalog entry: its pretrained weights are read from the file the catalog names in
$TORCH_HOME/hub/checkpoints (planted here, never downloaded), and transfer learning (freezing, stage-wise
unfreezing, per-stage learning rates; gradient checkpointing: tests/core/test_models.py) works on its stages:
stem, trunk_output.block1-4."""

from __future__ import annotations

import urllib.error

import pytest
import torch
import torchvision

from core.catalog import MODELS
from core.config import RunSpec
from core.events import MemorySink
from core.models import build_model
from core.optim import build_optimizer
from core.spec_sections import ModelSpec, OptimSpec
from core.train import run_training

NAME = "regnet_y_400mf"
STAGES = ["stem", "trunk_output.block1", "trunk_output.block2", "trunk_output.block3", "trunk_output.block4"]


@pytest.fixture(autouse=True)
def _one_thread():
    torch.set_num_threads(1)


@pytest.fixture
def planted(tmp_path, monkeypatch) -> dict[str, torch.Tensor]:
    """ImageNet-shaped regnet weights (a fixed seed, not the real ones) in an empty $TORCH_HOME's hub cache, under
    the catalog's file name; any download attempt fails as it would offline."""
    monkeypatch.setenv("TORCH_HOME", str(tmp_path / "torch"))

    def offline(url: str, *args: object, **kwargs: object) -> None:
        raise urllib.error.URLError(f"no network in tests: {url}")

    monkeypatch.setattr(torch.hub, "download_url_to_file", offline)
    torch.manual_seed(1234)
    state = torchvision.models.get_model(NAME, weights=None).state_dict()
    checkpoints = tmp_path / "torch" / "hub" / "checkpoints"
    checkpoints.mkdir(parents=True)
    torch.save(state, checkpoints / MODELS[NAME].weights.file)
    return state


def test_pretrained_weights_are_read_from_the_catalogs_file_and_the_head_is_swapped(planted):
    torch.manual_seed(99)  # another seed: nothing matches by chance
    model = build_model(ModelSpec(name=NAME, pretrained=True), 5, 3, 32)
    got = model.net.state_dict()
    backbone = [k for k in planted if not k.startswith("fc.")]
    assert backbone and all(torch.equal(got[k], planted[k]) for k in backbone)
    assert got["fc.weight"].shape == (5, 440) and planted["fc.weight"].shape == (1000, 440)
    assert [n for n, _ in model.stages()] == [*STAGES, "head"]


def test_per_stage_learning_rates_decay_from_the_top_block_down_to_the_stem():
    model = build_model(ModelSpec(name=NAME), 5, 3, 32)
    spec = ModelSpec(name=NAME, pretrained=True, transfer="finetune", backbone_lr_mult=0.1, lr_decay=0.5)
    opt = build_optimizer(model, OptimSpec(name="sgd", lr=1.0), spec)
    lrs = {g["name"]: g["lr"] for g in opt.param_groups if not g["name"].endswith("/no_decay")}
    assert lrs["head"] == 1.0
    for depth, stage in enumerate(reversed(STAGES)):
        assert lrs[f"backbone.{stage}"] == pytest.approx(0.1 * 0.5**depth), stage


def test_a_transfer_run_unfreezes_its_stages_one_by_one(tmp_path, planted):
    spec = RunSpec.from_dict(
        {
            "data": {"name": "synthetic", "num_classes": 3, "num_samples": 48, "size": 32, "channels": 3},
            "model": {
                "name": NAME,
                "pretrained": True,
                "transfer": "finetune_last_n",
                "last_n": 1,
                "unfreeze_every": 1,
                "lr_decay": 0.5,
            },
            "train": {
                "epochs": 3,
                "batch_size": 8,
                "steps_per_epoch": 2,
                "log_every": 1,
                "diag_every": 1,
                "early_stopping": {"enabled": False},
            },
            "export": {"formats": []},
            "checkpoint": {"save_last": False, "save_best": False},
            "device": "cpu",
            "seed": 0,
        }
    )
    sink = MemorySink()
    summary = run_training(spec, tmp_path / "run", sink)
    assert summary["status"] == "completed", summary["error"]
    unfrozen = [e["data"]["stages"] for e in sink.events if e["data"].get("code") == "unfreeze"]
    assert unfrozen == [
        ["trunk_output.block3", "trunk_output.block4", "head"],
        ["trunk_output.block2", "trunk_output.block3", "trunk_output.block4", "head"],
    ]
    grads = {k for _, _, values in sink.metric_rows for k in values if k.startswith("grad_norm/")}
    assert {"grad_norm/trunk_output.block4", "grad_norm/head"} <= grads
