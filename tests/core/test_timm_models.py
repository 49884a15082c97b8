"""timm as a model source (core/timm_models.py, core/catalog_timm.py): the curated catalog is what the installed
timm says (weights, preprocessing, stages, head, size); a timm model trains with its lower stages frozen; pretrained
weights are read offline from a planted Hugging Face cache or a weights file, with the weights' preprocessing
recorded; an unknown timm name is refused clearly; a tiny timm model exports with verified parity. Tiny, CPU."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import timm
import torch
from PIL import Image
from safetensors.torch import save_file

from core import catalog, model_size, timm_models
from core.catalog import MODELS
from core.checkpoint import load_checkpoint
from core.config import RunSpec, SpecError
from core.events import MemorySink
from core.export import export_model
from core.models import build_model
from core.optim import apply_transfer
from core.preflight import check_memory
from core.spec_sections import ModelSpec
from core.timm_models import timm_stages
from core.train import run_training

CURATED = [n for n, m in MODELS.items() if m.library == "timm"]
TINY = "timm/test_convnext"  # not in the catalog: timm's own 272k-parameter test model


@pytest.fixture(autouse=True)
def _hub(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Path:
    """An empty Hugging Face cache of this test's own, and no network for the hub client."""
    cache = tmp_path / "hf"
    monkeypatch.setenv("HF_HUB_CACHE", str(cache))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    torch.set_num_threads(2)
    return cache


def _plant(cache: Path, weights_name: str, state: dict[str, torch.Tensor]) -> Path:
    """A timm repository's model.safetensors as the hub leaves it in its cache (refs/main → snapshot)."""
    repo = cache / f"models--timm--{weights_name}"
    snapshot = repo / "snapshots" / "0123abcd"
    snapshot.mkdir(parents=True)
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text("0123abcd")
    save_file({k: v.contiguous() for k, v in state.items()}, snapshot / "model.safetensors")
    return snapshot / "model.safetensors"


def _timm_state(arch: str, seed: int = 7) -> dict[str, torch.Tensor]:
    """The weights of a randomly initialised timm model, with timm's own keys and ImageNet's 1000-class head."""
    torch.manual_seed(seed)
    return {k: v.clone() for k, v in timm.create_model(arch).state_dict().items()}


def _photos(root: Path, per_class: int = 6) -> Path:
    """Two classes of small landscape RGB photos (40×30), told apart by colour."""
    rng = np.random.default_rng(0)
    for c, tint in (("cat", (200, 60, 60)), ("dog", (60, 60, 200))):
        (root / c).mkdir(parents=True)
        for i in range(per_class):
            img = np.clip(np.array(tint) + rng.normal(0, 30, (30, 40, 3)), 0, 255).astype(np.uint8)
            Image.fromarray(img).save(root / c / f"{i}.png")
    return root


def _run_spec(folder: Path, model: dict, epochs: int = 1) -> RunSpec:
    return RunSpec.from_dict(
        {
            "data": {"name": "imagefolder", "path": str(folder), "image_size": 32, "val_fraction": 0.25},
            "model": model,
            "optim": {"name": "adam", "lr": 0.01},
            "train": {"epochs": epochs, "batch_size": 4, "log_every": 1, "early_stopping": {"enabled": False}},
            "export": {"formats": []},
            "device": "cpu",
            "seed": 0,
        }
    )


# --- the curated catalog is timm's own ----------------------------------------------------------------------


@pytest.mark.parametrize("name", CURATED)
def test_the_curated_catalog_is_what_timm_says(name: str) -> None:
    """Default weights, their preprocessing (as timm's own eval transform builds it), stages, head and size."""
    entry, arch = MODELS[name], catalog.timm_arch(name)
    cfg = timm.models.get_pretrained_cfg(arch)
    assert entry.weights.name == f"{arch}.{cfg.tag}" and cfg.hf_hub_id == f"timm/{entry.weights.name}"
    resize, crop, _, normalize = timm.data.create_transform(
        **timm.data.resolve_data_config({}, pretrained_cfg=cfg.to_dict())
    ).transforms
    p = entry.weights.preprocessing
    assert (resize.size, tuple(crop.size)) == (p.resize_size, (p.input_size, p.input_size))
    assert resize.interpolation.value == p.interpolation
    assert torch.allclose(normalize.mean, torch.tensor(p.mean)) and torch.allclose(normalize.std, torch.tensor(p.std))
    assert timm_models.preprocessing(name) == p
    net = timm.create_model(arch, num_classes=1).train()
    assert timm_models.head_path(net) == entry.head
    assert timm_stages(net, entry.head) == entry.stages
    head = net.get_submodule(entry.head)
    assert head.in_features == entry.footprint.head_features
    assert sum(p.numel() for p in net.parameters()) - (head.in_features + 1) == entry.footprint.backbone_parameters
    at_112 = build_model(ModelSpec(name=name), 1, 3, 112).train()  # a ViT: its own 224 px resampled to 112
    measured = timm_models._saved_bytes(at_112, torch.randn(2, 3, 112, 112)) / (2 * 112 * 112)
    assert 0.9 * measured <= entry.footprint.activation_bytes_per_pixel <= 1.1 * measured


def test_the_form_offers_the_curated_timm_models_by_family() -> None:
    """The New run form's model list is the catalog's: timm's after torchvision's, each family's together."""
    from app.present import form_rules
    from app.present.form_schema import form_fields

    options = next(f for f in form_fields() if f.path == "model.name").options
    timm_options = [o for o in options if o.startswith(catalog.TIMM_PREFIX)]
    assert timm_options == CURATED and options[-len(CURATED) :] == tuple(CURATED)
    families = [MODELS[n].label for n in timm_options]
    assert {"ConvNeXt-V2", "EfficientNetV2", "RegNetY", "ViT", "MobileNetV4"} <= set(families)
    assert all(families.index(f) == i or families[i - 1] == f for i, f in enumerate(families))  # grouped
    assert all(n in catalog.PRETRAINED_MODELS for n in timm_options)
    assert form_rules.option_label("model.name", "timm/convnextv2_atto") == "timm/convnextv2_atto · ConvNeXt-V2"
    assert form_rules.option_label("model.name", "resnet18") == "resnet18"
    # a spec's own timm model (YAML, a clone) stays its model in the form rather than becoming the first choice
    assert form_rules.choice_options("model.name", options, TINY) == [*options, TINY]
    assert form_rules.choice_options("model.name", options, "resnet18") == list(options)
    for name in (TINY, "timm/convnextv2_atto"):
        values = {"model.name": name, "model.transfer": "finetune_last_n"}
        assert form_rules.relevant("model.pretrained", values) and form_rules.relevant("model.last_n", values)


# --- training: the lower stages stay frozen -----------------------------------------------------------------


def test_a_timm_model_trains_from_a_weights_file_with_its_lower_stages_frozen(tmp_path: Path) -> None:
    """finetune_last_n=1 on a RegNetY (batch norms in every stage) from a planted .safetensors of timm's keys:
    the top stage and the head learn; the lower stages' weights and norm statistics are the file's."""
    state = _timm_state("regnety_002")
    weights = tmp_path / "regnety_002.safetensors"
    save_file({k: v.contiguous() for k, v in state.items()}, weights)
    spec = _run_spec(
        _photos(tmp_path / "photos"),
        {"name": "timm/regnety_002", "weights_file": str(weights), "transfer": "finetune_last_n", "last_n": 1},
    )
    summary = run_training(spec, tmp_path / "run", MemorySink())
    assert summary["status"] == "completed", summary.get("error")
    trained = load_checkpoint(tmp_path / "run" / "checkpoints" / "last.pt")["model"]
    for key, before in state.items():
        if key.startswith("head."):
            continue  # the file's 1000-class head does not fit 2 classes: a fresh one
        changed = not torch.equal(trained[f"net.{key}"], before)
        assert changed == key.startswith("s4.") or not before.is_floating_point(), key
    assert any(not torch.equal(trained[f"net.{k}"], v) for k, v in state.items() if k.startswith("s4."))


# --- pretrained weights, offline ----------------------------------------------------------------------------


def test_pretrained_timm_weights_load_offline_from_the_hub_cache_with_their_preprocessing(
    tmp_path: Path, _hub: Path
) -> None:
    """A planted cache entry is what model.pretrained reads (nothing downloads); the run normalises with the
    weights' mean/std and resizes as they were trained (ViT: 0.5/0.5, 248 → 224)."""
    name = "timm/vit_tiny_patch16_224"
    state = _timm_state("vit_tiny_patch16_224")
    _plant(_hub, MODELS[name].weights.name, state)
    spec = _run_spec(_photos(tmp_path / "photos"), {"name": name, "pretrained": True, "transfer": "feature_extract"})
    sink = MemorySink()
    summary = run_training(spec, tmp_path / "run", sink)
    assert summary["status"] == "completed", summary.get("error")
    ck = load_checkpoint(tmp_path / "run" / "checkpoints" / "last.pt")
    backbone = {k: v for k, v in state.items() if not k.startswith("head.")}
    assert all(torch.equal(ck["model"][f"net.{k}"], v) for k, v in backbone.items())  # frozen: the file's own
    info = ck["data_info"]
    p = MODELS[name].weights.preprocessing
    assert (info["mean"], info["std"]) == (list(p.mean), list(p.std))
    assert info["preprocessing"]["resize"] == round(32 * p.resize_size / p.input_size)
    assert info["preprocessing"]["interpolation"] == p.interpolation


def test_any_pretrained_timm_model_loads_offline_with_timms_preprocessing(tmp_path: Path, _hub: Path) -> None:
    """A timm model the catalog does not list: its weights from the planted cache, its preprocessing read from
    timm's pretrained_cfg by the run (160-px crops of a 168-px resize, mean/std 0.5), its input size overridden."""
    state = _timm_state("test_convnext")
    _plant(_hub, "test_convnext.r160_in1k", state)
    spec = _run_spec(_photos(tmp_path / "photos"), {"name": TINY, "pretrained": True, "transfer": "feature_extract"})
    summary = run_training(spec, tmp_path / "run", MemorySink())
    assert summary["status"] == "completed", summary.get("error")
    ck = load_checkpoint(tmp_path / "run" / "checkpoints" / "last.pt")
    assert all(torch.equal(ck["model"][f"net.{k}"], v) for k, v in state.items() if not k.startswith("head.fc."))
    info = ck["data_info"]
    assert (info["mean"], info["std"]) == ([0.5] * 3, [0.5] * 3)
    assert info["preprocessing"]["resize"] == round(32 * 168 / 160) and info["image_size"] == 32


def test_missing_pretrained_timm_weights_say_where_to_put_them(_hub: Path) -> None:
    with pytest.raises(FileNotFoundError) as e:
        build_model(ModelSpec(name="timm/regnety_002", pretrained=True), 3, 3, 32)
    msg = str(e.value)
    assert str(_hub) in msg and "models--timm--regnety_002.pycls_in1k" in msg and "model.weights_file" in msg
    assert not any(_hub.glob("**/*.safetensors"))  # nothing was downloaded


# --- any timm name in YAML; an unknown one refused ----------------------------------------------------------


def test_an_unknown_timm_name_is_refused_clearly_before_any_data_is_read(tmp_path, monkeypatch) -> None:
    with pytest.raises(SpecError) as e:
        RunSpec.from_dict({"model": {"name": "timm/ConvNeXt V2"}})
    assert "model.name" in dict(e.value.errors) and "timm.list_models()" in dict(e.value.errors)["model.name"]
    spec = RunSpec.from_dict({"data": {"name": "digits"}, "model": {"name": "timm/convnextv2_attto"}})
    assert spec.model.name == "timm/convnextv2_attto"  # the schema cannot ask timm: the worker does
    from worker import preflight

    def no_data(*_: object) -> None:
        raise AssertionError("the data was read before the model name was checked")

    monkeypatch.setattr("core.data.load_data", no_data)
    (tmp_path / "spec.yaml").write_text(spec.to_yaml())
    with pytest.raises(ValueError) as e:
        preflight.run(tmp_path / "spec.yaml", tmp_path)
    assert "unknown timm model 'convnextv2_attto'" in str(e.value) and "timm/convnextv2_atto" in str(e.value)
    summary = run_training(spec, tmp_path / "run", MemorySink())
    assert summary["status"] == "failed" and "unknown timm model 'convnextv2_attto'" in summary["error"]


def test_any_timm_model_builds_with_timms_stages_and_is_sized_by_the_pre_flight() -> None:
    spec = RunSpec.from_dict(
        {"data": {"name": "synthetic", "size": 32, "num_classes": 4}, "model": {"name": TINY}, "device": "cpu"}
    )
    assert not model_size.sized(TINY) and model_size.refusal(spec) is None
    model = build_model(spec.model, 4, 3, 32)
    assert [n for n, _ in model.stages()] == ["stages.0", "stages.1", "stages.2", "stages.3", "head"]
    assert model.head_path == "head.fc" and model(torch.randn(2, 3, 32, 32)).shape == (2, 4)
    footprint = timm_models.footprint(TINY)
    assert model_size.estimate(spec, footprint).parameters == sum(p.numel() for p in model.parameters())
    check_memory(spec)  # measures it (on the meta device) rather than failing for want of a catalog entry
    last = ModelSpec(name=TINY, pretrained=True, transfer="finetune_last_n", last_n=2)
    assert apply_transfer(model, last, 1) == ["stages.2", "stages.3", "head"]
    frozen = [p for n, p in model.net.named_parameters() if n.startswith(("stem.", "stages.0.", "stages.1."))]
    assert frozen and not any(p.requires_grad for p in frozen)
    tagged = ModelSpec(name=f"{TINY}.r160_in1k")
    assert build_model(tagged, 4, 3, 32)(torch.randn(1, 3, 32, 32)).shape == (1, 4)
    assert timm_models.preprocessing(tagged.name).input_size == 160


def test_gradient_checkpointing_wraps_timms_stages_and_changes_nothing_else() -> None:
    """The same weights (the same state_dict keys) give the same logits and gradients, stage by stage recomputed."""
    torch.manual_seed(0)
    plain = build_model(ModelSpec(name=TINY), 3, 3, 32)
    torch.manual_seed(0)
    saving = build_model(ModelSpec(name=TINY, gradient_checkpointing=True), 3, 3, 32)
    assert list(saving.state_dict()) == list(plain.state_dict())
    saving.load_state_dict(plain.state_dict())
    wrapped = {n for n, m in saving.net.named_modules() if type(m).__name__ == "_Checkpointed"}
    assert wrapped == {"stages.1", "stages.2"}  # the stages of one module (stages.0 holds the stem, 3 a norm too)
    x = torch.randn(4, 3, 32, 32)
    for m in (plain, saving):
        m.train()
        m(x).square().sum().backward()
    for (n, a), (_, b) in zip(plain.named_parameters(), saving.named_parameters()):
        assert torch.allclose(a.grad, b.grad, atol=1e-5), n


def test_a_timm_vit_takes_small_images_and_refuses_a_missing_tag() -> None:
    model = build_model(ModelSpec(name="timm/test_vit"), 3, 1, 32)  # grayscale 32 px into a 160-px ViT
    assert model(torch.randn(2, 1, 32, 32)).shape == (2, 3)
    with pytest.raises(ValueError, match="r160_in1k"):
        timm_models.check_name("timm/test_vit.no_such_tag")


# --- exports ------------------------------------------------------------------------------------------------


def test_a_tiny_timm_model_exports_to_torchscript_and_onnx_with_verified_parity(tmp_path: Path) -> None:
    torch.manual_seed(0)
    model = build_model(ModelSpec(name=TINY, dropout=0.1), 3, 3, 32)
    meta = {
        "class_names": ["a", "b", "c"],
        "channels": 3,
        "image_size": 32,
        "mean": [0.5] * 3,
        "std": [0.25] * 3,
        "spec_hash": "0" * 64,
        "arch": TINY,
        "versions": {"torchdeck": "test"},
    }
    report = export_model(model, torch.randn(10, 3, 32, 32), tmp_path, ["torchscript", "onnx"], meta)
    for fmt in ("torchscript", "onnx"):
        entry = report["formats"][fmt]
        assert entry["ok"] and entry["parity"]["passed"], entry.get("error")
        assert entry["parity"]["top1_agreement"] == 100.0 and (tmp_path / entry["file"]).stat().st_size > 0
    assert report["formats"]["torchscript"]["method"] == "trace" and report["all_ok"]
