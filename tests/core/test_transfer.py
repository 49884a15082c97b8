"""Transfer learning between tasks: whose head a run starts from, frozen parts kept in eval mode,
stage-wise unfreezing and discriminative learning rates per stage. Tiny models and data."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image
from torch import nn

from core.config import RunSpec
from core.engine import train_one_epoch
from core.events import MemorySink, NeverStop
from core.models import build_model
from core.optim import Schedule, apply_transfer, build_optimizer, trained_stages
from core.spec_sections import ModelSpec, OptimSpec, ScheduleSpec
from core.train import build_trainer, run_training, seed_everything

A, B = [f"a{i}" for i in range(5)], [f"b{i}" for i in range(5)]


@pytest.fixture(autouse=True)
def _one_thread():
    torch.set_num_threads(1)


def _folder(root: Path, classes: list[str], seed: int, per_class: int = 8, size: int = 8) -> Path:
    """An imagefolder of grayscale class templates plus noise: one sub-folder per class."""
    rng = np.random.default_rng(seed)
    for c in classes:
        template = rng.uniform(0, 255, (size, size))
        (root / c).mkdir(parents=True)
        for i in range(per_class):
            img = np.clip(template + rng.normal(0, 40, (size, size)), 0, 255).astype(np.uint8)
            Image.fromarray(img, mode="L").save(root / c / f"{i}.png")
    return root


def _spec(path: Path, **model: object) -> RunSpec:
    return RunSpec.from_dict(
        {
            "data": {"name": "imagefolder", "path": str(path), "image_size": 8, "val_fraction": 0.25},
            "model": {"name": "simple_cnn", "hidden": 16, **model},
            "train": {"epochs": 2, "batch_size": 8, "log_every": 1, "early_stopping": {"enabled": False}},
            "export": {"formats": []},
            "device": "cpu",
            "seed": 0,
        }
    )


def _checkpoint(path: Path, classes: list[str] | None, seed: int = 1, name: str = "simple_cnn") -> tuple[Path, dict]:
    """Weights of a model trained on `classes` (a torchdeck checkpoint), or a plain state_dict when None."""
    torch.manual_seed(seed)
    state = build_model(ModelSpec(name=name, hidden=16), 5, 1, 8).state_dict()
    torch.save(state if classes is None else {"model": state, "epoch": 3, "data_info": {"class_names": classes}}, path)
    return path, state


def _head(model: nn.Module) -> torch.Tensor:
    return model.net.get_submodule(model.head_path).weight.detach()


# --- whose head ----------------------------------------------------------------------------------


@pytest.mark.parametrize("transfer", ["feature_extract", "finetune", "finetune_last_n", "scratch"])
def test_weights_trained_on_other_classes_start_a_fresh_head(tmp_path, transfer):
    path, state = _checkpoint(tmp_path / "a.pt", A)
    model = build_model(ModelSpec(name="simple_cnn", hidden=16, weights_file=str(path), transfer=transfer), 5, 1, 8, B)
    assert not torch.equal(_head(model), state["net.fc2.weight"])  # same shape, other classes: not loaded
    assert torch.equal(model.state_dict()["net.conv2.0.weight"], state["net.conv2.0.weight"])  # the backbone is
    assert model.head_report["head"] == "fresh" and "other classes" in model.head_report["reason"]
    assert model.head_report["dropped"] == ["net.fc2.weight", "net.fc2.bias"]
    assert model.weights_report == {"missing": [], "unexpected": [], "shape_mismatch": []}
    same = build_model(ModelSpec(name="simple_cnn", hidden=16, weights_file=str(path), transfer=transfer), 5, 1, 8, A)
    assert torch.equal(_head(same), state["net.fc2.weight"]) and same.head_report["head"] == "loaded"


@pytest.mark.parametrize("transfer", ["feature_extract", "finetune", "finetune_last_n"])
def test_a_plain_state_dict_gives_a_transfer_run_a_fresh_head_unless_keep_head(tmp_path, transfer):
    path, state = _checkpoint(tmp_path / "plain.pt", None)
    spec = ModelSpec(name="simple_cnn", hidden=16, weights_file=str(path), transfer=transfer)
    fresh = build_model(spec, 5, 1, 8, B)
    assert not torch.equal(_head(fresh), state["net.fc2.weight"])
    assert fresh.head_report["head"] == "fresh" and "model.keep_head" in fresh.head_report["reason"]
    kept = build_model(spec.model_copy(update={"keep_head": True}), 5, 1, 8, B)
    assert torch.equal(_head(kept), state["net.fc2.weight"])
    assert kept.head_report == {"head": "loaded", "reason": "model.keep_head=true", "file_classes": [], "dropped": []}


def test_a_run_on_new_classes_from_a_runs_best_checkpoint_starts_fresh_and_says_why(tmp_path):
    run_a = run_training(_spec(_folder(tmp_path / "A", A, seed=0)), tmp_path / "run_a", MemorySink())
    assert run_a["status"] == "completed"
    best = tmp_path / "run_a" / "checkpoints" / "best.pt"
    sink = MemorySink()
    spec_b = _spec(_folder(tmp_path / "B", B, seed=1), weights_file=str(best), transfer="feature_extract")
    assert run_training(spec_b, tmp_path / "run_b", sink)["status"] == "completed"
    (loaded,) = [e for e in sink.events if e["data"].get("code") == "weights_file"]
    assert loaded["data"]["head"] == "fresh" and loaded["data"]["weights_classes"] == A
    assert "other classes" in loaded["data"]["head_reason"] and "head fresh" in loaded["message"]
    assert loaded["level"] == "info"  # a deliberately fresh head is no mismatch to warn about


# --- frozen parts stay in eval mode ----------------------------------------------------------------


def _norm_stats(model: nn.Module) -> dict[str, torch.Tensor]:
    return {k: v.clone() for k, v in model.state_dict().items() if "running_" in k or "num_batches" in k}


@pytest.mark.parametrize("transfer, trained", [("feature_extract", ()), ("finetune_last_n", ("layer4",))])
def test_frozen_batchnorm_statistics_do_not_move_in_an_epoch(tmp_path, transfer, trained):
    torch.manual_seed(3)
    weights = tmp_path / "r18.pt"
    torch.save(build_model(ModelSpec(name="resnet18"), 5, 3, 8).state_dict(), weights)
    spec = RunSpec.from_dict(
        {
            "data": {"name": "synthetic", "num_classes": 5, "num_samples": 24, "size": 8, "channels": 3},
            "model": {"name": "resnet18", "weights_file": str(weights), "transfer": transfer, "last_n": 1},
            "train": {"epochs": 1, "batch_size": 16},
            "export": {"formats": []},
            "device": "cpu",
            "seed": 0,
        }
    )
    seed_everything(0, False)
    t = build_trainer(spec, tmp_path, MemorySink(), NeverStop(), torch.device("cpu"))
    before = _norm_stats(t.model)
    train_one_epoch(t, 1)
    after = _norm_stats(t.model)
    for k, v in before.items():
        moved = not torch.equal(after[k], v)
        assert moved == any(k.startswith(f"net.{s}.") for s in trained), k
    frozen_bn = [m for m in t.model.net.layer1.modules() if isinstance(m, nn.BatchNorm2d)]
    assert frozen_bn and not any(m.training for m in frozen_bn)  # still in eval mode after the epoch


# --- stage-wise unfreezing ---------------------------------------------------------------------------


def _stages_by_epoch(spec: ModelSpec, epochs: int) -> list[list[str]]:
    model = build_model(spec, 5, 1, 8)
    return [apply_transfer(model, spec, e) for e in range(1, epochs + 1)]


def test_unfreeze_every_unfreezes_one_more_stage_from_the_top():
    spec = ModelSpec(name="simple_cnn", transfer="finetune", unfreeze_every=2)
    spec = spec.model_copy(update={"transfer": "feature_extract"})  # skip the weights check: freezing is under test
    head, fc1, conv2, allx = ["head"], ["fc1", "head"], ["conv2", "fc1", "head"], ["conv1", "conv2", "fc1", "head"]
    assert _stages_by_epoch(spec, 8) == [head, head, fc1, fc1, conv2, conv2, allx, allx]
    late = spec.model_copy(update={"unfreeze_at_epoch": 2, "unfreeze_every": 3})
    assert _stages_by_epoch(late, 8) == [head, fc1, fc1, fc1, conv2, conv2, conv2, allx]
    last_n = spec.model_copy(update={"transfer": "finetune_last_n", "last_n": 1, "unfreeze_every": 1})
    assert _stages_by_epoch(last_n, 4) == [fc1, conv2, allx, allx]
    all_at_once = spec.model_copy(update={"unfreeze_every": None, "unfreeze_at_epoch": 3})
    assert _stages_by_epoch(all_at_once, 3) == [head, head, allx]


def test_unfreezing_is_announced_and_last_n_counts_the_registrys_stages(tmp_path):
    path, _ = _checkpoint(tmp_path / "a.pt", A)
    sink = MemorySink()
    spec = _spec(
        _folder(tmp_path / "B", B, seed=1), weights_file=str(path), transfer="feature_extract", unfreeze_every=1
    )
    spec = spec.model_copy(update={"train": spec.train.model_copy(update={"epochs": 3})})
    assert run_training(spec, tmp_path / "run", sink)["status"] == "completed"
    unfreezes = [e["data"]["stages"] for e in sink.events if e["data"].get("code") == "unfreeze"]
    assert unfreezes == [["fc1", "head"], ["conv2", "fc1", "head"]]
    too_many = ModelSpec(name="simple_cnn", weights_file=str(path), transfer="finetune_last_n", last_n=4)
    with pytest.raises(ValueError, match=r"model\.last_n=4.*3 backbone stages \(conv1, conv2, fc1\)"):
        trained_stages(build_model(too_many, 5, 1, 8), too_many, 1)


# --- learning rates --------------------------------------------------------------------------------


def test_lr_decay_gives_each_stage_further_from_the_head_a_smaller_rate(tmp_path):
    path, _ = _checkpoint(tmp_path / "a.pt", A)
    spec = ModelSpec(
        name="simple_cnn", hidden=16, weights_file=str(path), transfer="finetune", backbone_lr_mult=0.1, lr_decay=0.5
    )
    model = build_model(spec, 5, 1, 8, B)
    opt = build_optimizer(model, OptimSpec(lr=1e-2), spec)
    lr_of = {id(p): g["lr"] for g in opt.param_groups for p in g["params"]}
    assert sum(len(g["params"]) for g in opt.param_groups) == len(lr_of) == len(list(model.parameters()))
    want = {"conv1": 2.5e-4, "conv2": 5e-4, "fc1": 1e-3, "fc2": 1e-2}
    for n, p in model.named_parameters():
        assert lr_of[id(p)] == pytest.approx(want[n.split(".")[1]]), n
    assert opt.param_groups[-1]["name"].startswith("head")  # the logged lr is the head's
    plain = build_optimizer(model, OptimSpec(lr=1e-2), spec.model_copy(update={"lr_decay": 1.0}))
    assert sorted({g["lr"] for g in plain.param_groups}) == pytest.approx([1e-3, 1e-2])  # backbone_lr_mult alone


def test_a_fresh_head_skips_the_warmup_the_pretrained_backbone_gets(tmp_path):
    path, _ = _checkpoint(tmp_path / "a.pt", A)
    spec = ModelSpec(name="simple_cnn", hidden=16, weights_file=str(path), transfer="finetune")
    for classes, head_warmed in ((B, False), (A, True)):  # fresh head / the file's own head
        model = build_model(spec, 5, 1, 8, classes)
        opt = build_optimizer(model, OptimSpec(lr=1e-2), spec)
        Schedule(opt, ScheduleSpec(warmup_epochs=1.0), steps_per_epoch=10, epochs=5, mode="min")
        head = [g["lr"] for g in opt.param_groups if g["name"].startswith("head")]
        body = [g["lr"] for g in opt.param_groups if g["name"].startswith("backbone")]
        assert body == pytest.approx([1e-4] * len(body))  # 1e-3 × the first warmup step's 1/10
        assert head == pytest.approx([1e-3 if head_warmed else 1e-2] * len(head))
