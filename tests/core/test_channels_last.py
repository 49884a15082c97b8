"""The channels_last memory format: on by default on CUDA for models with convolutions, and training in it gives the
same run as the default format (checked on the CPU, where it can be asked for)."""

from __future__ import annotations

import pytest
import torch

from core.config import RunSpec
from core.events import MemorySink
from core.models import build_model, wants_channels_last
from core.spec_sections import ModelSpec
from core.train import run_training


def test_the_default_is_channels_last_on_cuda_for_convolutions_only():
    cnn = build_model(ModelSpec(name="simple_cnn"), 3, 1, 16)
    mlp = build_model(ModelSpec(name="mlp"), 3, 1, 16)
    cuda, cpu = torch.device("cuda"), torch.device("cpu")
    assert wants_channels_last(None, cuda, cnn) and not wants_channels_last(None, cuda, mlp)
    assert not wants_channels_last(None, cpu, cnn)
    assert wants_channels_last(True, cpu, mlp) and not wants_channels_last(False, cuda, cnn)


@pytest.mark.parametrize("model", ["simple_cnn", "resnet18", "mlp"])
def test_a_run_in_channels_last_trains_like_one_in_the_default_format(tmp_path, model):
    losses, accs = {}, {}
    for cl in (False, True):
        spec = RunSpec.from_dict(
            {
                "data": {"name": "synthetic", "num_classes": 3, "num_samples": 96, "size": 16, "channels": 3},
                "model": {"name": model, "hidden": 16},
                "train": {"epochs": 2, "batch_size": 16, "log_every": 1, "early_stopping": {"enabled": False}},
                "export": {"formats": []},
                "device": "cpu",
                "channels_last": cl,
                "seed": 0,
            }
        )
        sink = MemorySink()
        assert run_training(spec, tmp_path / str(cl), sink)["status"] == "completed"
        losses[cl] = [v for _, v in sink.series("train/loss")]
        accs[cl] = sink.series("val/acc")[-1][1]
    assert len(losses[True]) == len(losses[False]) > 5
    # the same model and batch: the first step's loss agrees to rounding (Adam's first update, g/|g| per weight,
    # then turns rounding into differences, as another GPU or thread count would)
    assert losses[True][0] == pytest.approx(losses[False][0], rel=1e-5)
    assert accs[True] == pytest.approx(accs[False], abs=0.05)
