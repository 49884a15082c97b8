"""Classify images with the exported ONNX model: python predict.py IMAGE [IMAGE ...]

Shipped as predict.py in torchdeck's bundle.zip. Needs only numpy, Pillow and onnxruntime.
The preprocessing (channels, size, mean/std) is read from the ONNX file's metadata, so the
model file alone is enough; export.json beside it is the fallback for files without metadata.
Prints "<class> <probability>" per image (prefixed with the file name when there are several).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np


def load_model(model_path: Path):  # -> (onnxruntime.InferenceSession, dict)
    import onnxruntime as ort  # imported here so that --help works without it

    session = ort.InferenceSession(str(model_path), providers=["CPUExecutionProvider"])
    props = session.get_modelmeta().custom_metadata_map
    if all(k in props for k in ("class_names", "channels", "image_size", "mean", "std")):
        meta = {
            "class_names": json.loads(props["class_names"]),
            "channels": int(props["channels"]),
            "image_size": int(props["image_size"]),
            "mean": json.loads(props["mean"]),
            "std": json.loads(props["std"]),
        }
    else:  # an ONNX file whose metadata was stripped: use the export report shipped beside it
        report = json.loads((model_path.parent / "export.json").read_text())
        meta = {
            "class_names": report["class_names"],
            **{k: report["input"][k] for k in ("channels", "image_size", "mean", "std")},
        }
    return session, meta


def preprocess(image_path: Path, meta: dict) -> np.ndarray:
    """The training preprocessing: channels and size as recorded, pixel/255, (x - mean) / std, NCHW."""
    from PIL import Image

    size = meta["image_size"]
    with Image.open(image_path) as img:
        img = img.convert("L" if meta["channels"] == 1 else "RGB")
        if img.size != (size, size):
            img = img.resize((size, size), Image.BILINEAR)
        x = np.asarray(img, dtype=np.float32) / 255.0
    x = x[None] if x.ndim == 2 else x.transpose(2, 0, 1)  # HW or HWC → CHW
    mean = np.asarray(meta["mean"], dtype=np.float32)[:, None, None]
    std = np.asarray(meta["std"], dtype=np.float32)[:, None, None]
    return ((x - mean) / std)[None].astype(np.float32)


def classify(session, meta: dict, image_path: Path) -> tuple[str, float]:
    logits = session.run(None, {session.get_inputs()[0].name: preprocess(image_path, meta)})[0][0]
    p = np.exp(logits - logits.max())  # softmax, shifted so exp cannot overflow
    p /= p.sum()
    k = int(p.argmax())
    return meta["class_names"][k], float(p[k])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Classify images with the exported ONNX model.")
    parser.add_argument("images", nargs="+", type=Path, help="image files (any format Pillow reads)")
    parser.add_argument(
        "--model",
        type=Path,
        default=Path(__file__).with_name("model.onnx"),
        help="default: model.onnx beside this script",
    )
    args = parser.parse_args(argv)
    session, meta = load_model(args.model)
    for path in args.images:
        name, prob = classify(session, meta, path)
        print(f"{path}: {name} {prob:.4f}" if len(args.images) > 1 else f"{name} {prob:.4f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
