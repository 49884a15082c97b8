"""A real, small digits classifier and its verified ONNX export, registered as a finished run's artifact the way a
worker registers it (the Predict tab's tests and benchmark), and the reference answer a user's own script gets:
onnxruntime on the file with the bundle's preprocessing (core/export_predict.py)."""

from __future__ import annotations

import hashlib
import io
from pathlib import Path

import numpy as np
from sqlalchemy import Engine

from core.export_predict import load_model, preprocess
from db import repo


def train_and_export(out: Path, epochs: int = 6) -> dict:
    """simple_cnn trained for a couple of seconds on the real digits (8×8), exported to ONNX only under `out`;
    the export's report (export.json's content)."""
    import torch
    import torch.nn.functional as F

    from core.config import RunSpec
    from core.data import Preprocess, load_data
    from core.export import export_model
    from core.export_report import export_meta
    from core.models import build_model
    from core.spec_sections import DataSpec, ModelSpec

    torch.manual_seed(0)
    spec = RunSpec(data=DataSpec(name="digits"), model=ModelSpec(name="simple_cnn", hidden=32))
    data = load_data(spec.data, seed=spec.seed)
    pre = Preprocess(data.info, None, torch.device("cpu"))
    model = build_model(spec.model, data.info.num_classes, data.info.channels, data.info.image_size)
    opt = torch.optim.Adam(model.parameters(), lr=3e-3)
    x, y = pre(data.train.images), data.train.labels
    for _ in range(epochs):
        for idx in torch.randperm(len(y)).split(64):
            opt.zero_grad(set_to_none=True)
            F.cross_entropy(model(x[idx]), y[idx]).backward()
            opt.step()
    meta = {**export_meta(data.info, spec.spec_hash()), "arch": "simple_cnn"}
    return export_model(model.eval(), pre(data.val.images)[:64], out, ["onnx"], meta)


def register(engine: Engine, run_id: str, run_root: Path, report: dict, export_dir: Path) -> repo.ArtifactRecord:
    """The export's model.onnx copied under the run root's folder for this run and registered as its "onnx"
    artifact with the report's entry as meta, as worker/run_writer.py does."""
    folder = run_root / run_id / "export"
    folder.mkdir(parents=True, exist_ok=True)
    data = (export_dir / "model.onnx").read_bytes()
    (folder / "model.onnx").write_bytes(data)
    return repo.add_artifact(
        engine,
        run_id,
        "onnx",
        (folder / "model.onnx").resolve().as_uri(),
        size=len(data),
        sha256=hashlib.sha256(data).hexdigest(),
        meta=report["formats"]["onnx"],
    )


def reference(model_path: Path, image: bytes) -> tuple[str, np.ndarray]:
    """(the top class, the probabilities) a user's own script computes: onnxruntime on the file, the image
    prepared by the bundle's preprocess."""
    session, meta = load_model(model_path)
    logits = session.run(None, {session.get_inputs()[0].name: preprocess(io.BytesIO(image), meta)})[0][0]
    p = np.exp(logits - logits.max())
    p /= p.sum()
    return meta["class_names"][int(p.argmax())], p


def digit_png(index: int) -> bytes:
    """Digit `index` of scikit-learn's load_digits as the 8-bit grayscale PNG training reads (0..16 → 0..255)."""
    from PIL import Image
    from sklearn.datasets import load_digits

    pixels = (np.clip(load_digits().images[index] / 16.0, 0, 1) * 255).round().astype(np.uint8)
    buf = io.BytesIO()
    Image.fromarray(pixels, mode="L").save(buf, format="PNG")
    return buf.getvalue()
