"""The catalog's models built, pretrained and user weights, transfer modes, the optimizer's parameter
groups and gradient checkpointing. Real torchvision models on tiny inputs;
pretrained weights are planted where torchvision's weights API looks, never downloaded."""

from __future__ import annotations

import urllib.error
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
import torchvision
from safetensors.torch import save_file
from torch import nn

from core.catalog import MODEL_NAMES, MODELS
from core.models import build_model
from core.optim import apply_transfer, build_optimizer
from core.spec_sections import ModelSpec, OptimSpec


def _build(name: str, classes: int = 5, channels: int = 3, size: int = 32, seed: int = 0, **kw) -> nn.Module:
    torch.manual_seed(seed)
    return build_model(ModelSpec(name=name, **kw), classes, channels, size)


def _trainable(model: nn.Module) -> set[str]:
    return {n for n, p in model.named_parameters() if p.requires_grad}


# --- shapes, forward/backward ----------------------------------------


@pytest.mark.parametrize("name", MODEL_NAMES)
def test_every_model_trains_on_tiny_grayscale_and_rgb_inputs(name):
    for channels, size, dropout in ((1, 8, 0.0), (3, 16, 0.25)):
        model = _build(name, classes=3, channels=channels, size=size, dropout=dropout)
        out = model(torch.randn(2, channels, size, size))
        assert out.shape == (2, 3), f"{name} on {channels}×{size}×{size}"
        F.cross_entropy(out, torch.tensor([0, 2])).backward()
        for n, p in model.named_parameters():
            assert p.grad is not None and torch.isfinite(p.grad).all(), f"{name}: no usable gradient for {n}"
        head = model.net.get_submodule(model.head_path)
        assert isinstance(head, nn.Linear) and head.out_features == 3  # head sized to the task
        if dropout:
            assert any(isinstance(m, nn.Dropout) and m.p == dropout for m in model.modules()), "model.dropout ignored"


@pytest.mark.parametrize("name, widths", [("simple_cnn", (16, 32)), ("simple_cnn_wide", (32, 64))])
def test_simple_cnns_are_the_seed_architectures(name, widths):
    model = _build(name, classes=10, channels=3, size=32)
    c1, c2 = widths
    shapes = {k: tuple(v.shape) for k, v in model.state_dict().items()}
    assert shapes == {
        "net.conv1.0.weight": (c1, 3, 3, 3),
        "net.conv1.0.bias": (c1,),
        "net.conv2.0.weight": (c2, c1, 3, 3),
        "net.conv2.0.bias": (c2,),
        "net.fc1.1.weight": (128, c2 * 8 * 8),
        "net.fc1.1.bias": (128,),  # 32×32 pooled twice: 8×8
        "net.fc2.weight": (10, 128),
        "net.fc2.bias": (10,),
    }
    convs = [m for m in model.modules() if isinstance(m, nn.Conv2d)]
    pools = [m for m in model.modules() if isinstance(m, nn.MaxPool2d)]
    assert all(c.padding == (1, 1) for c in convs) and [p.kernel_size for p in pools] == [2, 2]


# --- torchvision pretrained weights ----------------------------------------------------------


@pytest.fixture
def torch_hub(tmp_path, monkeypatch):
    """An empty $TORCH_HOME, and a download function that fails like an offline machine (and records)."""
    monkeypatch.setenv("TORCH_HOME", str(tmp_path / "torch"))
    calls: list[tuple[str, Path]] = []

    def offline(url: str, dst: str, *args, **kwargs) -> None:
        calls.append((url, Path(dst)))
        raise urllib.error.URLError("no network in tests")

    monkeypatch.setattr(torch.hub, "download_url_to_file", offline)
    return tmp_path / "torch" / "hub" / "checkpoints", calls


@pytest.mark.parametrize("name", ["resnet18", "mobilenet_v3_small"])
def test_pretrained_weights_are_read_from_the_torch_hub_cache(torch_hub, name):
    checkpoints, calls = torch_hub
    url = torchvision.models.get_model_weights(name).DEFAULT.url
    torch.manual_seed(1234)
    planted = torchvision.models.get_model(name, weights=None).state_dict()
    checkpoints.mkdir(parents=True)
    torch.save(planted, checkpoints / Path(url).name)
    model = _build(name, classes=5, pretrained=True, seed=99)  # a different seed: nothing matches by chance
    assert calls == []  # read from the cache, no download attempted
    got, head = model.net.state_dict(), MODELS[name].head + "."
    backbone = [k for k in planted if not k.startswith(head)]
    assert backbone and all(torch.equal(got[k], planted[k]) for k in backbone)
    assert got[head + "weight"].shape[0] == 5 and planted[head + "weight"].shape[0] == 1000  # head replaced


def test_missing_pretrained_weights_offline_say_which_file_goes_where(torch_hub):
    checkpoints, calls = torch_hub
    with pytest.raises(RuntimeError) as e:
        _build("resnet18", pretrained=True)
    msg = str(e.value)
    assert "resnet18-f37072fd.pth" in msg and "$TORCH_HOME/hub/checkpoints" in msg and str(checkpoints) in msg
    assert "model.pretrained=false" in msg
    # the one download attempt targeted exactly the file the message names (no other network use)
    assert [dst for _, dst in calls] == [checkpoints / "resnet18-f37072fd.pth"]


# --- user weights files ------------------------------------------------------------------------------


def _save(state: dict, path: Path) -> Path:
    save_file(state, str(path)) if path.suffix == ".safetensors" else torch.save(state, path)
    return path


@pytest.mark.parametrize("kind", ["safetensors", "pt", "bare_keys", "torchdeck_checkpoint"])
def test_weights_file_loads_exactly(tmp_path, kind):
    src = _build("simple_cnn", classes=10, size=16, seed=1)
    state = src.state_dict()
    if kind == "bare_keys":  # a plain nn.Module's state_dict, without the Classifier's "net." prefix
        state = src.net.state_dict()
    if kind == "torchdeck_checkpoint":
        state = {"model": state, "epoch": 3}
    path = _save(state, tmp_path / ("w.safetensors" if kind == "safetensors" else "w.pt"))
    model = _build("simple_cnn", classes=10, size=16, seed=2, weights_file=str(path))
    assert model.weights_report == {"missing": [], "unexpected": [], "shape_mismatch": []}
    for k, v in src.state_dict().items():
        assert torch.equal(model.state_dict()[k], v), k


def test_weights_file_mismatches_are_reported_and_the_rest_loads(tmp_path):
    state = _build("simple_cnn", classes=10, size=16, seed=1).state_dict()
    state["net.extra.weight"] = torch.ones(3)
    model = _build("simple_cnn", classes=4, size=16, seed=2, weights_file=str(_save(state, tmp_path / "w.pt")))
    report = model.weights_report
    assert report["shape_mismatch"] == ["net.fc2.weight", "net.fc2.bias"]  # 10-class head into a 4-class task
    assert report["unexpected"] == ["net.extra.weight"]
    assert report["missing"] == ["net.fc2.weight", "net.fc2.bias"]
    assert torch.equal(model.state_dict()["net.conv2.0.weight"], state["net.conv2.0.weight"])
    assert model.net.fc2.weight.shape == (4, 128)


@pytest.mark.parametrize("other", ["simple_cnn_wide", "mlp"])
def test_weights_from_another_architecture_are_refused(tmp_path, other):
    path = _save(_build(other, classes=10, size=16).state_dict(), tmp_path / f"{other}.safetensors")
    with pytest.raises(ValueError, match="different architecture") as e:
        _build("simple_cnn", classes=10, size=16, weights_file=str(path))
    assert str(path) in str(e.value) and "simple_cnn" in str(e.value)


def test_non_weight_files_are_refused_without_running_their_code(tmp_path):
    pickled = tmp_path / "whole_model.pt"
    torch.save(_build("mlp", size=8), pickled)  # a pickled nn.Module, not a state_dict
    with pytest.raises(ValueError, match="pickled objects are refused"):
        _build("mlp", size=8, weights_file=str(pickled))
    listed = _save([torch.zeros(2)], tmp_path / "list.pt")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="does not hold a state_dict"):
        _build("mlp", size=8, weights_file=str(listed))
    fake = tmp_path / "fake.safetensors"
    fake.write_bytes(b"garbage")
    with pytest.raises(ValueError, match=r"not a readable \.safetensors"):
        _build("mlp", size=8, weights_file=str(fake))
    with pytest.raises(FileNotFoundError, match="weights_file not found"):
        _build("mlp", size=8, weights_file=str(tmp_path / "absent.pt"))


# --- transfer learning ------------------------------------------------------------------


@pytest.fixture(scope="module")
def resnet():
    return _build("resnet18", classes=5)


def _xfer(name: str = "resnet18", **kw) -> ModelSpec:
    return ModelSpec(name=name, pretrained=True, **kw)  # freezing needs weights; which ones does not matter here


def test_feature_extract_trains_only_the_head(resnet):
    spec = _xfer(transfer="feature_extract")
    assert apply_transfer(resnet, spec, epoch=1) == ["head"]
    assert _trainable(resnet) == {"net.fc.weight", "net.fc.bias"}
    before = {n: p.detach().clone() for n, p in resnet.named_parameters()}
    opt = build_optimizer(resnet, OptimSpec(name="sgd", lr=0.5), spec)
    resnet.eval()  # BatchNorm statistics stay put; the step is what is under test
    F.cross_entropy(resnet(torch.randn(4, 3, 32, 32)), torch.tensor([0, 1, 2, 3])).backward()
    opt.step()
    moved = {n for n, p in resnet.named_parameters() if not torch.equal(p, before[n])}
    assert moved == {"net.fc.weight", "net.fc.bias"}
    opt.zero_grad(set_to_none=True)


def test_finetune_last_n_trains_the_top_stages_and_the_head(resnet):
    assert apply_transfer(resnet, _xfer(transfer="finetune_last_n", last_n=2), epoch=1) == ["layer3", "layer4", "head"]
    assert {n.split(".")[1] for n in _trainable(resnet)} == {"layer3", "layer4", "fc"}
    mobilenet = _build("mobilenet_v3_small")
    assert apply_transfer(mobilenet, _xfer("mobilenet_v3_small", transfer="finetune_last_n", last_n=1), 1) == [
        "features.12",
        "head",
    ]
    tops = {".".join(n.split(".")[1:3]) for n in _trainable(mobilenet)}
    assert tops == {"features.12", "classifier.3"}


def test_progressive_unfreezing_trains_everything_from_its_epoch(resnet):
    spec = _xfer(transfer="feature_extract", unfreeze_at_epoch=3)
    everything = {n for n, _ in resnet.named_parameters()}
    for epoch, want in (
        (1, {"net.fc.weight", "net.fc.bias"}),
        (2, {"net.fc.weight", "net.fc.bias"}),
        (3, everything),
        (4, everything),
    ):
        apply_transfer(resnet, spec, epoch)
        assert _trainable(resnet) == want, f"epoch {epoch}"


def test_scratch_and_finetune_train_everything(resnet):
    for transfer in ("scratch", "finetune"):
        names = apply_transfer(resnet, ModelSpec(name="resnet18", transfer=transfer), epoch=1)
        assert names == ["stem", "layer1", "layer2", "layer3", "layer4", "head"]
        assert all(p.requires_grad for p in resnet.parameters())


def test_optimizer_groups_backbone_lr_and_no_decay_on_norms_and_biases(resnet):
    lr, wd = 1e-3, 0.05
    spec = _xfer(transfer="finetune", backbone_lr_mult=0.1)
    opt = build_optimizer(resnet, OptimSpec(name="adamw", lr=lr, weight_decay=wd), spec)
    lr_of = {id(p): g["lr"] for g in opt.param_groups for p in g["params"]}
    wd_of = {id(p): g["weight_decay"] for g in opt.param_groups for p in g["params"]}
    assert len(lr_of) == sum(len(g["params"]) for g in opt.param_groups) == len(list(resnet.parameters()))
    head = {id(p) for p in resnet.head_parameters()}
    norms = {id(p) for m in resnet.modules() if isinstance(m, nn.BatchNorm2d) for p in m.parameters()}
    for n, p in resnet.named_parameters():
        assert lr_of[id(p)] == pytest.approx(lr if id(p) in head else lr * 0.1), n
        no_decay = id(p) in norms or n.endswith("bias")
        assert wd_of[id(p)] == (0.0 if no_decay else wd), n
    scratch = build_optimizer(resnet, OptimSpec(name="adamw", lr=lr), ModelSpec(name="resnet18"))
    assert {g["lr"] for g in scratch.param_groups} == {lr}  # no transfer: one learning rate


# --- gradient checkpointing --------------------------------------------------------------------


@pytest.mark.parametrize(
    "name, stage", [("simple_cnn", "conv2"), ("resnet18", "layer2"), ("regnet_y_400mf", "trunk_output.block2")]
)
def test_gradient_checkpointing_gives_the_same_step(name, stage):
    plain, ckpt = _build(name), _build(name, seed=1, gradient_checkpointing=True)
    assert list(ckpt.state_dict()) == list(plain.state_dict())  # same keys: weights move between the two
    ckpt.load_state_dict(plain.state_dict())
    calls = []
    conv = next(m for m in dict(ckpt.stages())[stage][0].modules() if isinstance(m, nn.Conv2d))
    conv.register_forward_hook(lambda *_: calls.append(1))
    x, y = torch.randn(4, 3, 32, 32), torch.tensor([0, 1, 2, 3])
    for model in (plain, ckpt):
        model.train()
        F.cross_entropy(model(x), y).backward()
    assert len(calls) == 2  # the stage really ran again in backward (activations were not kept)
    for (n, p), q in zip(plain.named_parameters(), ckpt.parameters(), strict=True):
        assert torch.allclose(p.grad, q.grad, atol=1e-6, rtol=1e-5), n
    for k, v in plain.state_dict().items():  # BatchNorm statistics updated once per step, not twice
        assert torch.equal(ckpt.state_dict()[k], v), k
    assert [n for n, _ in ckpt.stages()] == [n for n, _ in plain.stages()]
