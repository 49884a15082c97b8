"""Models too large to train (core/model_size.py): a spec whose model no machine can train (a 25.8-billion-
parameter MLP: `model.hidden: 8192` on 1024-px images) is refused at validation, naming the fields, without
torch; the pre-flight refuses one that does not fit where it trains, before anything is built. The estimate is
checked against torch: the parameter count is the real one of every catalog model (core/catalog.py),
whatever the task's classes, channels and image size, and the activations are within a fifth of the bytes
autograd really keeps for the backward pass."""

from __future__ import annotations

import subprocess
import sys
import tracemalloc
from pathlib import Path

import pytest
import torch
import yaml

from core import model_size
from core.catalog import MODELS
from core.config import RunSpec, SpecError
from core.model_size import Task
from core.models import build_model, count_parameters
from core.spec_sections import ModelSpec

ROOT = Path(__file__).resolve().parents[2]
GIANT_MLP = {"data": {"name": "synthetic", "image_size": 1024}, "model": {"name": "mlp", "hidden": 8192}}
TOO_BIG = [  # (spec, what the refusal must say)
    (
        GIANT_MLP,
        [
            "model.hidden=8192 with data.image_size=1024",
            "25.8 billion parameters",
            "96.3 GiB as float32",
            "lower model.hidden or data.image_size",
        ],
    ),
    (
        {"data": {"name": "synthetic", "size": 512}, "model": {"name": "simple_cnn_wide", "hidden": 8192}},
        ["model.hidden=8192 with data.size=512", "8.6 billion parameters", "lower model.hidden or data.size"],
    ),
    (
        {"data": {"name": "imagefolder", "path": "/d", "image_size": 1024}, "train": {"batch_size": 65_536}},
        [
            "training simple_cnn on data.image_size=1024 at train.batch_size=65536 takes about 11.3 TiB",
            "lower train.batch_size or data.image_size",
            "model.gradient_checkpointing",
        ],
    ),
]


@pytest.mark.parametrize(("data", "says"), TOO_BIG, ids=["giant-mlp", "wide-cnn", "activations"])
def test_a_model_no_machine_can_train_is_refused_naming_the_fields(data, says):
    """The spec alone tells (core/model_size.py, torch-free): refused at validation, which every submit path
    runs, before anything is allocated anywhere."""
    tracemalloc.start()
    try:
        with pytest.raises(SpecError) as e:
            RunSpec.from_yaml(yaml.safe_dump(data))
        peak = tracemalloc.get_traced_memory()[1] / 2**20
    finally:
        tracemalloc.stop()
    for words in says:
        assert words in str(e.value), str(e.value)
    assert peak < 50


def test_torchdeck_validate_refuses_the_giant_mlp_without_importing_torch(tmp_path):
    spec = tmp_path / "giant.yaml"
    spec.write_text(yaml.safe_dump(GIANT_MLP))
    probe = (
        "import sys; from core.config import load_spec, SpecError\n"
        f"try: load_spec({str(spec)!r})\nexcept SpecError as e: print(e)\n"
        "print('torch imported' if 'torch' in sys.modules else 'no torch')"
    )
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert "25.8 billion parameters" in done.stdout and done.stdout.strip().endswith("no torch"), done.stdout


def test_models_real_users_train_pass_the_size_bound():
    for data in (
        {"model": {"name": "mlp", "hidden": 8192}, "data": {"name": "imagefolder", "path": "/d", "image_size": 224}},
        {
            "model": {"name": "resnet50"},
            "data": {"name": "imagefolder", "path": "/d", "image_size": 512},
            "train": {"batch_size": 256},
        },
        {"model": {"name": "convnext_tiny"}, "data": {"name": "cifar10"}, "train": {"batch_size": 4096}},
    ):
        assert RunSpec.from_dict(data).model.name == data["model"]["name"]


def test_a_run_whose_model_does_not_fit_this_hosts_memory_fails_before_it_is_built(tmp_path, monkeypatch):
    """The pre-flight compares the same estimate with the memory free where the model trains (here: the host)."""
    from core import preflight, train
    from core.events import MemorySink

    def built(*args, **kwargs):
        raise AssertionError("the model was built before the memory check refused it")

    monkeypatch.setattr(preflight, "available_memory_bytes", lambda: 256 << 20)
    monkeypatch.setattr(train, "build_trainer", built)
    spec = RunSpec.from_dict(
        {"data": {"name": "synthetic", "size": 64}, "model": {"name": "mlp", "hidden": 4096}, "device": "cpu"}
    )
    summary = train.run_training(spec, tmp_path, MemorySink())
    assert summary["status"] == "failed"
    error = summary["error"]
    assert error.startswith("MemoryError: training mlp takes about 1.1 GiB (67,158,026 parameters"), error
    assert "host has 0.2 GiB free" in error
    assert "lower train.batch_size, data.size or model.hidden, or set model.gradient_checkpointing" in error, error


SHAPES = [(10, 3, 32), (7, 1, 20), (3, 3, 64)]  # (classes, channels, image size)


@pytest.mark.parametrize("name", list(MODELS))
@pytest.mark.parametrize(("classes", "channels", "size"), SHAPES, ids=[f"{k}cls-{c}ch-{s}px" for k, c, s in SHAPES])
def test_the_parameter_count_is_the_models_own(name, classes, channels, size):
    spec = ModelSpec(name=name, hidden=48, dropout=0.1)
    model = build_model(spec, classes, channels, size)
    total, _ = count_parameters(model)
    assert model_size.parameters(name, 48, Task(channels, size, classes, "data.image_size")) == total


def _saved_bytes(model: torch.nn.Module, x: torch.Tensor) -> int:
    """Bytes of the distinct tensors autograd keeps for backward, the model's own weights left out."""
    weights = {p.data_ptr() for p in model.parameters()}
    kept: dict[tuple, int] = {}

    def pack(t: torch.Tensor) -> torch.Tensor:
        if t.data_ptr() not in weights:
            kept[(t.data_ptr(), t.numel(), t.dtype)] = t.numel() * t.element_size()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        model(x)
    return sum(kept.values())


@pytest.mark.parametrize("name", list(MODELS))
def test_the_activation_estimate_is_close_to_what_autograd_keeps(name):
    task = Task(3, 48, 10, "data.image_size")
    model = build_model(ModelSpec(name=name, hidden=64), task.classes, task.channels, task.size).train()
    measured = _saved_bytes(model, torch.randn(2, 3, task.size, task.size)) / 2
    estimated = model_size.activations_per_sample(name, 64, task)
    assert 0.8 * measured <= estimated <= 1.2 * measured, (estimated, measured)


def test_on_a_gpu_the_pre_flight_compares_with_the_gpus_free_memory(monkeypatch):
    """(torch's CUDA calls stand in for a GPU here: the estimate, not the device, is under test.)"""
    from core import preflight

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda *a: (8 << 30, 80 << 30))
    spec = RunSpec.from_dict(
        {
            "model": {"name": "resnet50"},
            "train": {"batch_size": 512},
            "data": {"name": "imagefolder", "path": "/d", "image_size": 224},
        }
    )
    with pytest.raises(MemoryError) as e:
        preflight.check_memory(spec)
    assert "training resnet50 takes about 41.5 GiB" in str(e.value) and "this GPU has 8.0 GiB free" in str(e.value)
    assert "lower train.batch_size, data.image_size, or set model.gradient_checkpointing" in str(e.value)
    preflight.check_memory(spec.model_copy(update={"train": spec.train.model_copy(update={"batch_size": 64})}))
