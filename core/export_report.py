"""What an export says about itself: export.json's head (input, output, preprocessing, versions, which
weights), the metadata embedded in each model file, and the bundle (verified files, export.json and, with
an ONNX file, predict.py). core.export produces and verifies the files; this module describes them."""

from __future__ import annotations

import json
import platform
import zipfile
from datetime import UTC, datetime
from importlib import metadata as importlib_metadata
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from core.names import EXPORT_FILES, EXPORT_FORMATS

if TYPE_CHECKING:
    from core.data import DataInfo

CHECK_BATCHES = (1, 7)  # besides the full batch: batch 1 and an odd size expose a specialised batch dim
META_KEYS = ("class_names", "channels", "image_size", "mean", "std")  # what predict.py cannot work without
INPUT_NAME, OUTPUT_NAME = "input", "logits"


def _versions(extra: dict[str, str] | None) -> dict[str, str]:
    """The caller's versions (training time) updated with the ones that wrote these files."""
    out = {**(extra or {}), "python": platform.python_version()}
    for pkg in ("torch", "torchvision", "onnx", "onnxruntime", "onnxscript", "numpy"):
        try:
            out[pkg] = importlib_metadata.version(pkg)
        except importlib_metadata.PackageNotFoundError:
            pass
    return out


def embedded(report: dict[str, Any]) -> dict[str, str]:
    """Flat string metadata for ONNX metadata_props and the TorchScript / pt2 extra files: enough to
    preprocess an image and name the class without export.json."""
    inp = report["input"]
    as_json = {
        "class_names": report["class_names"],
        "input_shape": inp["shape"],
        "mean": inp["mean"],
        "std": inp["std"],
        "versions": report["versions"],
        "preprocessing": inp.get("preprocessing", {}),
    }
    as_text = {
        "channels": inp["channels"],
        "image_size": inp["image_size"],
        "resize": inp.get("resize", inp["image_size"]),
        "interpolation": inp.get("interpolation", "bilinear"),
        "preprocess": inp["preprocess"],
        "spec_hash": report["spec_hash"] or "",
        "arch": report["arch"] or "",
    }
    return {**{k: json.dumps(v) for k, v in as_json.items()}, **{k: str(v) for k, v in as_text.items()}}


def export_meta(info: DataInfo, spec_hash: str) -> dict[str, Any]:
    """export_model's `meta` for a model trained on data `info` with the run spec of this hash: what an image is
    preprocessed with (META_KEYS, the data's own; the resize before the centre crop, its interpolation and the
    record of whose preprocessing it is) and the spec it comes from. The caller adds the model's arch."""
    pre = info.preprocessing or {}
    return {
        **{key: getattr(info, key) for key in META_KEYS},
        "resize": int(pre.get("resize", info.image_size)),
        "interpolation": str(pre.get("interpolation", "bilinear")),
        "preprocessing": dict(pre),
        "spec_hash": spec_hash,
    }


def check_args(inputs: torch.Tensor, formats: list[str], meta: dict[str, Any]) -> None:
    missing = [k for k in META_KEYS if k not in meta]
    if missing:
        raise ValueError(f"meta lacks {missing}: the bundle needs them to preprocess images")
    unknown = [f for f in formats if f not in EXPORT_FORMATS]
    if unknown:
        raise ValueError(f"unknown export formats {unknown}; known formats: {', '.join(EXPORT_FORMATS)}")
    want = (meta["channels"], meta["image_size"], meta["image_size"])
    if inputs.dtype != torch.float32 or inputs.dim() != 4 or tuple(inputs.shape[1:]) != want or inputs.shape[0] < 1:
        raise ValueError(
            f"inputs must be a normalised float32 batch (N, {want[0]}, {want[1]}, {want[2]}), "
            f"got {inputs.dtype} {tuple(inputs.shape)}"
        )


def report_head(inputs: torch.Tensor, formats: list[str], meta: dict[str, Any], atol: float) -> dict[str, Any]:
    c, s = int(meta["channels"]), int(meta["image_size"])
    resize, interpolation = int(meta.get("resize", s)), str(meta.get("interpolation", "bilinear"))
    return {
        "created": datetime.now(UTC).isoformat(timespec="seconds"),
        "arch": meta.get("arch"),
        "spec_hash": meta.get("spec_hash"),
        "weights": dict(meta.get("weights") or {}),  # which checkpoint and epoch the exported model holds
        "class_names": list(meta["class_names"]),
        "input": {
            "name": INPUT_NAME,
            "shape": ["batch", c, s, s],
            "dtype": "float32",
            "channels": c,
            "image_size": s,
            "mean": list(meta["mean"]),
            "std": list(meta["std"]),
            "resize": resize,
            "interpolation": interpolation,
            "preprocessing": dict(meta.get("preprocessing") or {}),  # whose it is (the weights', the dataset's)
            "preprocess": f"{'grayscale (L)' if c == 1 else 'RGB'}, shorter side resized to {resize} {interpolation}, "
            f"centre crop {resize}x{resize} then {s}x{s}, x = (pixel/255 - mean) / std per channel, NCHW float32",
        },
        "output": {
            "name": OUTPUT_NAME,
            "shape": ["batch", len(meta["class_names"])],
            "kind": "logits (softmax for probabilities)",
        },
        "versions": _versions(meta.get("versions")),
        "threads": torch.get_num_threads(),  # torch's intra-op threads; onnxruntime is given the same number
        "requested_formats": list(formats),
        "parity_samples": int(inputs.shape[0]),
        "check_batches": sorted({*CHECK_BATCHES, int(inputs.shape[0])}),
        "atol": atol,
    }


def bundle_members(report: dict[str, Any]) -> list[str]:
    """The verified model files, export.json, and predict.py when the ONNX file it runs is among them."""
    files = [e["file"] for e in report["formats"].values() if e["ok"]]
    return files + ["export.json"] + (["predict.py"] if "model.onnx" in files else [])


def write_bundle(out_dir: Path, members: list[str]) -> None:
    with zipfile.ZipFile(out_dir / "bundle.zip", "w") as zf:
        for name in members:
            src = Path(__file__).with_name("export_predict.py") if name == "predict.py" else out_dir / name
            # Float weights do not compress: deflating model files would only cost seconds per 100 MB.
            zf.write(
                src, name, compress_type=zipfile.ZIP_STORED if name in EXPORT_FILES.values() else zipfile.ZIP_DEFLATED
            )
