"""Verified exports : real exports of tiny models, reloaded and compared with eager.

Every registered model family goes through all three exporters; the special cases are real models
that break an exporter the way user models do: a branch on input data (untraceable, must be
scripted), an operator ONNX has no translation for (median pooling), and noise left on at inference
(an export that cannot match). The deployment bundle's predict.py runs as a separate, torch-free
process on a PNG of a real digit.
"""

from __future__ import annotations

import json
import subprocess
import sys
import zipfile
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from torch import nn

from core import export_checks
from core.catalog import MODELS
from core.config import RunSpec
from core.data import Preprocess, load_data
from core.export import export_model
from core.models import build_model
from core.names import EXPORT_FORMATS as FORMATS
from core.spec_sections import DataSpec, ModelSpec

BIG = {"resnet50", "convnext_tiny", "efficientnet_b0", "mobilenet_v3_large"}  # slowest to export on CPU
BIG |= {n for n, m in MODELS.items() if m.library == "timm"}  # 20-50 s each for the three formats on a busy CPU
# timm's curated models: the first of each family (a family shares its blocks, so its export path), to keep the
# suite short; tests/core/test_timm_models.py builds and checks every curated entry.
_TIMM_FAMILIES = {m.family: n for n, m in reversed(MODELS.items()) if m.library == "timm"}
EXPORTED = [n for n, m in MODELS.items() if m.library != "timm" or _TIMM_FAMILIES[m.family] == n]


@pytest.fixture(autouse=True)
def quick_latency(monkeypatch: pytest.MonkeyPatch) -> None:
    # Latency is measured the same way with one timed call: the tests check the figures are there,
    # benchmarks/bench_export.py measures them properly.
    monkeypatch.setattr(export_checks, "LATENCY_REPEATS", 1)
    monkeypatch.setattr(export_checks, "LATENCY_WARMUP", 0)


def _meta(channels: int, size: int, classes: int = 3, arch: str = "test") -> dict:
    return {
        "class_names": [f"class_{i}" for i in range(classes)],
        "channels": channels,
        "image_size": size,
        "mean": [0.5] * channels,
        "std": [0.25] * channels,
        "spec_hash": "0" * 64,
        "arch": arch,
        "versions": {"torchdeck": "test"},
    }


def _batch(n: int, channels: int, size: int, seed: int = 0) -> torch.Tensor:
    return torch.randn(n, channels, size, size, generator=torch.Generator().manual_seed(seed))


def _assert_verified(report: dict, out: Path, fmt: str) -> None:
    entry = report["formats"][fmt]
    assert entry["ok"], entry.get("error")
    parity = entry["parity"]
    assert parity["passed"] and parity["max_abs_diff"] <= report["atol"] and parity["top1_agreement"] == 100.0
    assert set(parity["max_abs_diff_by_batch"]) == {str(n) for n in report["check_batches"]}
    assert (out / entry["file"]).stat().st_size == entry["size_bytes"] > 0
    assert set(entry["latency_ms"]) == {"b1", "b32"} and all(v > 0 for v in entry["latency_ms"].values())


# --- every registered model, every format ---------------------------------------------------------------


@pytest.mark.parametrize("name", [pytest.param(n, marks=pytest.mark.slow) if n in BIG else n for n in EXPORTED])
def test_every_registered_model_exports_to_every_format_within_tolerance(name: str, tmp_path: Path) -> None:
    torch.manual_seed(0)
    channels, size = (1, 8) if MODELS[name].library == "torchdeck" else (3, 16)  # grayscale digits / small RGB
    model = build_model(ModelSpec(name=name, hidden=32), num_classes=3, in_channels=channels, image_size=size)
    model.train()  # the export must switch to eval() itself and give the mode back
    report = export_model(model, _batch(10, channels, size), tmp_path, list(FORMATS), _meta(channels, size, arch=name))
    assert model.training
    for fmt in FORMATS:
        _assert_verified(report, tmp_path, fmt)
    assert report["all_ok"] and report["check_batches"] == [1, 7, 10]
    # A timm ViT at another size than its own resamples its position embedding in Python: a trace would freeze the
    # size, so the export scripts it and says why.
    scripted = MODELS[name].family == "vit"
    assert report["formats"]["torchscript"]["method"] == ("script" if scripted else "trace")
    assert not scripted or "TracerWarning" in report["formats"]["torchscript"]["reason"]
    assert report["formats"]["onnx"]["exporter"] == "dynamo" and report["formats"]["onnx"]["opset"] >= 18
    assert json.loads((tmp_path / "export.json").read_text()) == report
    with zipfile.ZipFile(tmp_path / "bundle.zip") as zf:
        assert sorted(zf.namelist()) == ["export.json", "model.onnx", "model.pt2", "model.ts", "predict.py"]


# --- TorchScript: trace or script ----------------------------------------------------------------------------


class DynamicDepthNet(nn.Module):
    """The seeds' example of data-dependent control flow: extra layers only for some inputs."""

    def __init__(self) -> None:
        super().__init__()
        self.stem = nn.Conv2d(1, 4, 3, padding=1)
        self.extra = nn.Sequential(nn.Conv2d(4, 4, 3, padding=1), nn.ReLU(), nn.Conv2d(4, 4, 3, padding=1))
        self.head = nn.Linear(4 * 8 * 8, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.stem(x)
        if x.sum() > 0:  # a trace would freeze whichever branch the example batch took
            x = self.extra(x) + 1.0
        return self.head(x.flatten(1))


def test_data_dependent_branch_is_detected_and_scripted(tmp_path: Path) -> None:
    torch.manual_seed(0)
    model = DynamicDepthNet()
    report = export_model(model, _batch(12, 1, 8), tmp_path, list(FORMATS), _meta(1, 8))
    ts = report["formats"]["torchscript"]
    _assert_verified(report, tmp_path, "torchscript")
    assert ts["method"] == "script" and "TracerWarning" in ts["reason"]
    assert any("deprecated" in n for n in ts["notes"])  # torch 2.14's TorchScript FutureWarning, reported
    # The scripted file takes both branches, like the eager model.
    loaded = torch.jit.load(str(tmp_path / "model.ts"))
    with torch.no_grad():
        pair = [sign * 100 * torch.ones(3, 1, 8, 8) for sign in (1.0, -1.0)]  # large: the sign decides the branch
        assert {bool(model.stem(x).sum() > 0) for x in pair} == {True, False}
        for x in pair:
            torch.testing.assert_close(loaded(x), model(x), atol=1e-4, rtol=1e-5)
    # torch.export refuses the branch; the legacy ONNX trace would freeze it: both are refused, with reasons.
    assert not report["formats"]["pt2"]["ok"] and "data-dependent" in report["formats"]["pt2"]["error"]
    assert not report["formats"]["onnx"]["ok"] and "branch" in report["formats"]["onnx"]["error"]
    assert not (tmp_path / "model.onnx").exists() and not (tmp_path / "model.pt2").exists()


# --- a format that cannot be produced, or cannot match --------------------------------------------------------


class MedianPoolNet(nn.Module):
    """3×3 median filtering (a denoising layer): aten::median has no ONNX translation in torch 2.14."""

    def __init__(self) -> None:
        super().__init__()
        self.head = nn.Linear(8 * 8, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        patches = F.unfold(x, 3, padding=1)  # (N, 9, 64) for one channel
        return self.head(patches.median(dim=1).values)


def test_operator_onnx_cannot_export_fails_only_that_format(tmp_path: Path) -> None:
    report = export_model(MedianPoolNet(), _batch(8, 1, 8), tmp_path, list(FORMATS), _meta(1, 8))
    onnx_entry = report["formats"]["onnx"]
    assert onnx_entry["ok"] is False
    assert "median" in onnx_entry["error"] and "not supported" in onnx_entry["error"]  # names the operator
    assert "dynamo exporter" in onnx_entry["error"] and "legacy exporter" in onnx_entry["error"]
    _assert_verified(report, tmp_path, "torchscript")
    _assert_verified(report, tmp_path, "pt2")
    assert not report["all_ok"] and not (tmp_path / "model.onnx").exists()
    with zipfile.ZipFile(tmp_path / "bundle.zip") as zf:  # predict.py needs the ONNX file: not shipped
        assert sorted(zf.namelist()) == ["export.json", "model.pt2", "model.ts"]


class PrototypeNet(nn.Module):
    """A prototype (metric-learning) head: logits are minus the distances to learned class prototypes.
    torch.cdist has no translation in the torch.export-based ONNX exporter; the legacy exporter has one."""

    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Sequential(nn.Flatten(), nn.Linear(8 * 8, 16))
        self.prototypes = nn.Parameter(torch.randn(3, 16))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return -torch.cdist(self.embed(x), self.prototypes)


def test_onnx_falls_back_to_the_legacy_exporter_and_says_why(tmp_path: Path) -> None:
    torch.manual_seed(0)
    report = export_model(PrototypeNet(), _batch(9, 1, 8), tmp_path, ["onnx"], _meta(1, 8))
    _assert_verified(report, tmp_path, "onnx")  # batch 1, 7 and 9 through onnxruntime, within atol
    entry = report["formats"]["onnx"]
    assert entry["exporter"] == "legacy" and "cdist" in entry["fallback_reason"]


class NoisyAtInference(nn.Module):
    """Noise injection that forgets to check self.training: no export can reproduce eager outputs."""

    def __init__(self) -> None:
        super().__init__()
        self.head = nn.Linear(8 * 8, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head((x + 0.1 * torch.randn_like(x)).flatten(1))


def test_export_that_does_not_match_eager_is_marked_failed_and_not_shipped(tmp_path: Path) -> None:
    report = export_model(NoisyAtInference(), _batch(8, 1, 8), tmp_path, ["onnx", "pt2"], _meta(1, 8))
    for fmt in ("onnx", "pt2"):
        entry = report["formats"][fmt]
        assert entry["ok"] is False and entry["error"].startswith("parity failed")
        assert entry["parity"]["passed"] is False and entry["parity"]["max_abs_diff"] > 1e-4
    assert not (tmp_path / "model.onnx").exists() and not (tmp_path / "model.pt2").exists()
    assert "latency_ms" in report and set(report["latency_ms"]) == {"eager"}


# --- the argument checks and re-exports ---------------------------------------------------------------------------


def test_wrong_inputs_or_meta_are_refused_with_what_is_expected(tmp_path: Path) -> None:
    model = build_model(ModelSpec(name="mlp", hidden=16), 3, 1, 8)
    with pytest.raises(ValueError, match=r"\(N, 1, 8, 8\)"):
        export_model(model, _batch(4, 1, 8).to(torch.uint8), tmp_path, ["onnx"], _meta(1, 8))
    with pytest.raises(ValueError, match="known formats: torchscript, onnx, pt2"):
        export_model(model, _batch(4, 1, 8), tmp_path, ["tflite"], _meta(1, 8))
    with pytest.raises(ValueError, match="class_names"):
        export_model(model, _batch(4, 1, 8), tmp_path, ["onnx"], {"channels": 1, "image_size": 8})


def test_reexport_removes_files_of_formats_no_longer_produced(tmp_path: Path) -> None:
    model = build_model(ModelSpec(name="mlp", hidden=16), 3, 1, 8)
    export_model(
        model, _batch(1, 1, 8), tmp_path, ["torchscript", "pt2"], _meta(1, 8)
    )  # one sample: still batch-dynamic
    assert (tmp_path / "model.ts").exists()
    report = export_model(model, _batch(1, 1, 8), tmp_path, ["pt2"], _meta(1, 8))
    _assert_verified(report, tmp_path, "pt2")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["bundle.zip", "export.json", "model.pt2"]


# --- a trained digits model: the deployable bundle ------------------------------------------------------------------


@pytest.fixture(scope="module")
def digits_export(tmp_path_factory: pytest.TempPathFactory) -> dict:
    """simple_cnn trained for a few seconds on the real digits, exported with its validation batch."""
    torch.manual_seed(0)
    spec = RunSpec(data=DataSpec(name="digits"), model=ModelSpec(name="simple_cnn", hidden=64))
    data = load_data(spec.data, seed=spec.seed)
    info, pre = data.info, Preprocess(data.info, None, torch.device("cpu"))
    model = build_model(spec.model, info.num_classes, info.channels, info.image_size)
    opt = torch.optim.Adam(model.parameters(), lr=3e-3)
    x_train, y_train = pre(data.train.images), data.train.labels
    for _ in range(6):
        for idx in torch.randperm(len(y_train)).split(64):
            opt.zero_grad(set_to_none=True)
            F.cross_entropy(model(x_train[idx]), y_train[idx]).backward()
            opt.step()
    model.eval()
    x_val = pre(data.val.images)
    with torch.no_grad():
        acc = (model(x_val).argmax(1) == data.val.labels).float().mean().item()
    assert acc > 0.9, f"the tiny digits model should learn (val acc {acc:.3f})"
    meta = {
        "class_names": info.class_names,
        "channels": info.channels,
        "image_size": info.image_size,
        "mean": info.mean,
        "std": info.std,
        "spec_hash": spec.spec_hash(),
        "arch": "simple_cnn",
    }
    out = tmp_path_factory.mktemp("digits_export")
    messages: list[str] = []
    report = export_model(
        model, x_val[:256], out, list(FORMATS), meta, opset=spec.export.opset, progress=messages.append
    )
    return {
        "report": report,
        "out": out,
        "model": model,
        "data": data,
        "x_val": x_val,
        "meta": meta,
        "messages": messages,
    }


def test_digits_export_is_verified_on_the_real_validation_batch(digits_export: dict) -> None:
    report, out = digits_export["report"], digits_export["out"]
    assert report["all_ok"] and report["parity_samples"] == 256 and report["check_batches"] == [1, 7, 256]
    for fmt in FORMATS:
        _assert_verified(report, out, fmt)
    assert set(report["latency_ms"]) == {"eager", *FORMATS}
    assert report["spec_hash"] == digits_export["meta"]["spec_hash"] and report["class_names"] == [
        str(i) for i in range(10)
    ]
    assert any(m.startswith("onnx: ok") for m in digits_export["messages"])
    assert report["versions"]["torch"] == torch.__version__.split("+")[0]


def test_onnx_file_has_a_dynamic_batch_and_runs_batch_1_and_7(digits_export: dict) -> None:
    import onnx
    import onnxruntime as ort

    out, model, x_val = digits_export["out"], digits_export["model"], digits_export["x_val"]
    proto = onnx.load(str(out / "model.onnx"))
    batch_dim = proto.graph.input[0].type.tensor_type.shape.dim[0]
    assert batch_dim.dim_param and not batch_dim.HasField("dim_value")
    session = ort.InferenceSession(str(out / "model.onnx"), providers=["CPUExecutionProvider"])
    for n in (1, 7):
        (logits,) = session.run(None, {"input": x_val[:n].numpy()})
        with torch.no_grad():
            np.testing.assert_allclose(logits, model(x_val[:n]).numpy(), atol=1e-4, rtol=0)


def test_preprocessing_and_identity_are_embedded_in_the_model_files(digits_export: dict) -> None:
    import onnx

    out, meta = digits_export["out"], digits_export["meta"]
    props = {p.key: p.value for p in onnx.load(str(out / "model.onnx")).metadata_props}
    assert json.loads(props["class_names"]) == meta["class_names"]
    assert json.loads(props["mean"]) == meta["mean"] and json.loads(props["std"]) == meta["std"]
    assert props["channels"] == "1" and props["image_size"] == "8" and props["spec_hash"] == meta["spec_hash"]
    assert json.loads(props["input_shape"]) == ["batch", 1, 8, 8]
    assert json.loads(props["versions"])["onnxruntime"]
    extra = {"torchdeck.json": ""}
    torch.jit.load(str(out / "model.ts"), _extra_files=extra)
    assert json.loads(extra["torchdeck.json"]) == props
    extra = {"torchdeck.json": ""}
    program = torch.export.load(str(out / "model.pt2"), extra_files=extra)
    assert json.loads(extra["torchdeck.json"]) == props
    assert program.example_inputs is None  # the validation batch used to export is not shipped inside


def test_bundle_predict_py_classifies_a_digit_png_without_torch(digits_export: dict, tmp_path: Path) -> None:
    from PIL import Image

    data, model, x_val = digits_export["data"], digits_export["model"], digits_export["x_val"]
    with torch.no_grad():
        probs = model(x_val).softmax(1)
    right = (probs.argmax(1) == data.val.labels).nonzero().flatten().tolist()
    i = next(j for j in right if int(data.val.labels[j]) in (3, 8))  # a digit that is easy to confuse
    # The val images are the digits' 0..16 values as round(v / 16 * 255): saved as an 8-bit grayscale PNG.
    Image.fromarray(data.val.images[i, 0].numpy(), mode="L").save(tmp_path / "digit.png")
    with zipfile.ZipFile(digits_export["out"] / "bundle.zip") as zf:
        zf.extractall(tmp_path / "bundle")
    # torch made unimportable: predict.py must stand on numpy, Pillow and onnxruntime alone.
    runner = (
        "import runpy, sys; sys.modules['torch'] = None; sys.argv = sys.argv[1:]; "
        "runpy.run_path(sys.argv[0], run_name='__main__')"
    )
    done = subprocess.run(
        [sys.executable, "-c", runner, str(tmp_path / "bundle" / "predict.py"), str(tmp_path / "digit.png")],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=tmp_path,
    )
    assert done.returncode == 0, done.stderr
    label, prob = done.stdout.split()
    assert label == str(int(data.val.labels[i]))
    assert float(prob) == pytest.approx(probs[i].max().item(), abs=1e-3)
