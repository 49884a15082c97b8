"""Classify images with the exported ONNX model: python predict.py IMAGE [IMAGE ...]

Shipped as predict.py in torchdeck's bundle.zip. Needs only numpy, Pillow and onnxruntime.
The preprocessing (channels, the shorter side's resize and its interpolation, the centre crop's size,
mean/std) is read from the ONNX file's metadata, so the model file alone is enough; export.json beside it
is the fallback for files without metadata.
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
            "resize": int(props.get("resize", props["image_size"])),
            "interpolation": props.get("interpolation", "bilinear"),
        }
    else:  # an ONNX file whose metadata was stripped: use the export report shipped beside it
        report = json.loads((model_path.parent / "export.json").read_text())
        inp = report["input"]
        meta = {
            "class_names": report["class_names"],
            **{k: inp[k] for k in ("channels", "image_size", "mean", "std")},
            "resize": int(inp.get("resize", inp["image_size"])),
            "interpolation": inp.get("interpolation", "bilinear"),
        }
    return session, meta


def _centre(img, size: int):
    """The centred size × size square (offsets rounded as torchvision's center_crop)."""
    w, h = img.size
    left, top = int(round((w - size) / 2.0)), int(round((h - size) / 2.0))
    return img.crop((left, top, left + size, top + size))


def resize_and_crop(img, resize: int, size: int, interpolation: str):
    """The training preprocessing's geometry: the shorter side resized to `resize` (aspect kept, the longer side
    truncated as torchvision's Resize), the centred resize × resize square, then its centred size × size crop."""
    from PIL import Image

    w, h = img.size
    if (w, h) != (resize, resize):
        nw, nh = (resize, max(resize, int(resize * h / w))) if w <= h else (max(resize, int(resize * w / h)), resize)
        img = _centre(img.resize((nw, nh), getattr(Image.Resampling, interpolation.upper())), resize)
    return _centre(img, size) if size != resize else img


ALPHA_MODES = ("RGBA", "LA", "PA", "P", "La", "RGBa")


def to_channels(img, channels: int):
    """The image in the training's mode (core/decode.py's decode): transparent pixels on white for an RGB model,
    16-bit and float grayscale scaled to 8 bits (PIL's own convert clips them to white), then L or RGB."""
    from PIL import Image

    mode = "L" if channels == 1 else "RGB"
    if img.mode in ALPHA_MODES and mode == "RGB":
        img = img.convert("RGBA")
        img = Image.alpha_composite(Image.new("RGBA", img.size, (255, 255, 255, 255)), img)
    elif img.mode.startswith("I") or img.mode == "F":  # 32-bit, 16-bit and float grayscale
        arr = np.asarray(img, dtype=np.float64)
        if img.mode == "F":
            arr = arr * 255.0 if arr.size and arr.max() <= 1.0 else arr
        elif arr.size and arr.max() > 255:  # 16-bit data: 0..65535
            arr = arr / 257.0
        img = Image.fromarray(np.clip(arr.round(), 0, 255).astype(np.uint8), mode="L")
    return img.convert(mode)


def seen_and_input(img, meta: dict) -> tuple[np.ndarray, np.ndarray]:
    """(what the model sees: the uint8 image after the mode conversion, resize and centre crop, HW or HWC;
    the normalised float32 input, NCHW with N = 1) of an opened PIL image."""
    size = meta["image_size"]
    img = to_channels(img, meta["channels"])
    img = resize_and_crop(img, meta.get("resize", size), size, meta.get("interpolation", "bilinear"))
    seen = np.asarray(img, dtype=np.uint8)
    x = seen.astype(np.float32) / 255.0
    x = x[None] if x.ndim == 2 else x.transpose(2, 0, 1)  # HW or HWC → CHW
    mean = np.asarray(meta["mean"], dtype=np.float32)[:, None, None]
    std = np.asarray(meta["std"], dtype=np.float32)[:, None, None]
    return seen, ((x - mean) / std)[None].astype(np.float32)


def preprocess(image_path: Path, meta: dict) -> np.ndarray:
    """The training preprocessing: channels as recorded, shorter-side resize and centre crop, pixel/255,
    (x - mean) / std, NCHW."""
    from PIL import Image

    with Image.open(image_path) as img:
        return seen_and_input(img, meta)[1]


def probabilities(session, x: np.ndarray) -> np.ndarray:
    """Softmax of the model's logits for the NCHW batch `x`, one row per image."""
    logits = session.run(None, {session.get_inputs()[0].name: x})[0]
    p = np.exp(logits - logits.max(axis=1, keepdims=True))  # shifted so exp cannot overflow
    return p / p.sum(axis=1, keepdims=True)


def classify(session, meta: dict, image_path: Path) -> tuple[str, float]:
    p = probabilities(session, preprocess(image_path, meta))[0]
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
