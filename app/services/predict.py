"""Predictions of a finished run's verified ONNX export on images a user hands the dashboard (the Run page's
Predict tab), as plain functions: no Streamlit, no torch.

The dashboard runs the model itself, in its own process, with ONNX Runtime on the CPU: the app never imports
torch, a worker round trip (queue, pick-up, result) would cost seconds where one small image takes milliseconds,
and the ONNX file is the one that was verified against the trained model and ships in the bundle. The image is
prepared by core/export_predict.py, the bundle's own predict.py, so the page and the shipped script agree exactly.

Every request is bounded before any pixel is decoded: at most MAX_FILES images of at most MAX_FILE_BYTES each, and
an image whose header declares more than MAX_IMAGE_PIXELS is refused from its header alone. Nothing a user hands
in is written anywhere: the bytes live in memory for the request.
"""

from __future__ import annotations

import os
import re
import shutil
import tempfile
import time
import warnings
import zipfile
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import IO, Any

import numpy as np
from sqlalchemy import Engine

from app.services.artifacts import artifact_problem, latest_by_kind, open_artifact
from core import export_predict
from core.names import IMAGE_EXTENSIONS, MAX_IMAGE_PIXELS, SUCCESS_STATUSES
from db.repo import ArtifactRecord

MAX_FILE_BYTES = 20 * 1024 * 1024  # one photo is a few MB; a larger file is not worth holding in memory
MAX_FILES = 16  # per request: each image is one model call, so a request stays within a few seconds
TOP_K = 5


@dataclass(frozen=True)
class Model:
    """A loaded ONNX export: its session and the preprocessing its metadata records."""

    session: Any  # onnxruntime.InferenceSession
    meta: dict[str, Any]


@dataclass(frozen=True)
class Prediction:
    """One image's answer: its top classes with their probabilities, the image the model saw (uint8, after the
    mode conversion, resize and centre crop: HW or HWC) and the server time it took; or why it was refused."""

    name: str
    top: list[tuple[str, float]]
    seen: np.ndarray | None
    latency_ms: float | None
    error: str | None = None


def verified_onnx(status: str, artifacts: list[ArtifactRecord]) -> tuple[ArtifactRecord | None, str | None]:
    """(the run's newest ONNX export, None) when the page may predict with it, else (None, why not)."""
    if status not in (*SUCCESS_STATUSES, "cancelled"):
        return None, f"The run is {status}: predictions use its ONNX export, made once the run has finished."
    onnx = latest_by_kind(artifacts).get("onnx")
    if onnx is None:
        return None, "This run has no ONNX export yet."
    meta = dict(onnx.meta or {})
    if not (meta.get("ok") and (meta.get("parity") or {}).get("passed")):
        return None, "This run's newest ONNX export was not verified against the trained model: it is not used."
    problem = artifact_problem(onnx)
    if problem is not None:
        return None, f"This run's ONNX export cannot be read here: {problem}."
    return onnx, None


def load_model(artifact_id: str, engine: Engine | None = None) -> Model:
    """The ONNX export of this artifact id, its bytes checked against the SHA-256 they were registered with
    (ArtifactChanged otherwise). The file is copied into a private temporary folder for export_predict.load_model
    (the bundle's loader), which reads the preprocessing from the file's metadata; the copy is gone on return.
    The session is run once on zeros, so that the first image's time is not its warm-up."""
    _, reader = open_artifact(artifact_id, engine)
    with tempfile.TemporaryDirectory(prefix="torchdeck-predict-") as tmp, reader:
        path = Path(tmp) / "model.onnx"
        with open(path, "wb") as out:
            shutil.copyfileobj(reader, out, 1 << 20)  # the reader raises at its end when the bytes changed
        session, meta = export_predict.load_model(path)
    size = meta["image_size"]  # one call at load: ONNX Runtime's first run allocates, the user's should not pay it
    export_predict.probabilities(session, np.zeros((1, meta["channels"], size, size), dtype=np.float32))
    return Model(session, meta)


def _size(stream: IO[bytes]) -> int:
    size = stream.seek(0, 2)
    stream.seek(0)
    return size


def _open(stream: IO[bytes]):
    """The image, opened lazily (only its header read), or ValueError saying why it is refused."""
    from PIL import Image, UnidentifiedImageError

    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", Image.DecompressionBombWarning)  # our own, lower limit is checked below
            img = Image.open(stream)
    except Image.DecompressionBombError as e:  # over twice PIL's own limit: refused by PIL from the header
        found = re.search(r"\((\d+) pixels\)", str(e))
        pixels = f"{int(found[1]):,} pixels" if found else "too many pixels"
        raise ValueError(f"refused: {pixels}, more than the {MAX_IMAGE_PIXELS / 1e6:.0f} MP accepted") from None
    except (UnidentifiedImageError, OSError, SyntaxError):
        raise ValueError("not an image this dashboard can read (PNG, JPEG, BMP, GIF, WebP, TIFF…)") from None
    w, h = img.size
    if w * h > MAX_IMAGE_PIXELS:
        img.close()
        raise ValueError(f"refused: {w}×{h} pixels, more than the {MAX_IMAGE_PIXELS / 1e6:.0f} MP accepted")
    return img


def predict(model: Model, name: str, stream: IO[bytes]) -> Prediction:
    """One image file's prediction; a file that is too large, not an image or unreadable is refused with why
    (never raised). The latency is the server's time from the file's bytes to the probabilities."""
    size = _size(stream)
    if size > MAX_FILE_BYTES:
        return _refused(name, f"refused: {size / 2**20:.1f} MB, more than the {MAX_FILE_BYTES / 2**20:.0f} MB accepted")
    t0 = time.perf_counter()
    try:
        with _open(stream) as img:
            seen, x = export_predict.seen_and_input(img, model.meta)
    except ValueError as e:
        return _refused(name, str(e))
    except Exception as e:  # noqa: BLE001 - a truncated or corrupt file: its decoder's own words
        return _refused(name, f"cannot be decoded: {str(e)[:200] or type(e).__name__}")
    p = export_predict.probabilities(model.session, x)[0]
    ms = (time.perf_counter() - t0) * 1000
    names = model.meta["class_names"]
    order = np.argsort(-p, kind="stable")[: min(TOP_K, len(names))]
    return Prediction(name, [(str(names[k]), float(p[k])) for k in order], seen, ms)


def predict_many(model: Model, files: list[tuple[str, IO[bytes]]]) -> list[Prediction]:
    """Each file's prediction, the first MAX_FILES of them; those beyond are refused, each saying so."""
    out = [predict(model, name, stream) for name, stream in files[:MAX_FILES]]
    return out + [_refused(n, f"not read: at most {MAX_FILES} images per request") for n, _ in files[MAX_FILES:]]


def _refused(name: str, why: str) -> Prediction:
    return Prediction(name, [], None, None, why)


def digits_samples(count: int, seed: int) -> list[tuple[str, bytes, str]]:
    """`count` images of scikit-learn's digits (the builtin dataset) as PNG files, as training reads them (the
    0..16 values scaled to 0..255, white ink on black): (name, PNG bytes, true class), chosen by `seed`."""
    import io

    from PIL import Image
    from sklearn.datasets import load_digits

    d = load_digits()
    picked = np.random.default_rng(seed).choice(len(d.target), size=min(count, len(d.target)), replace=False)
    out = []
    for i in picked:
        buf = io.BytesIO()
        pixels = (np.clip(d.images[i] / 16.0, 0, 1) * 255).round().astype(np.uint8)  # core/data.py's _to_uint8
        Image.fromarray(pixels, mode="L").save(buf, format="PNG")
        out.append((f"digits #{int(i)}", buf.getvalue(), str(d.target[i])))
    return out


SPLIT_FOLDERS = ("test", "val", "train")  # a folder laid out in splits: its images are taken from the first found


def folder_samples(path: str, count: int, seed: int) -> list[tuple[str, bytes, str]]:
    """`count` images of an image folder or zip (<root>/<class>/<image>, or <root>/{train,val,test}/<class>/…: from
    test/, else val/, else train/) as (name, bytes, true class), chosen by `seed`: a class at random, then one of its
    images at random, so a large folder is never listed whole. OSError/ValueError when it cannot be read here."""
    root = Path(path).expanduser()
    rng = np.random.default_rng(seed)
    if zipfile.is_zipfile(root):
        return _zip_samples(root, count, rng)
    top = sorted(e.name for e in os.scandir(root) if e.is_dir() and not e.name.startswith("."))
    split = next((s for s in SPLIT_FOLDERS if s in top), None)
    if split is not None:
        root = root / split
        top = sorted(e.name for e in os.scandir(root) if e.is_dir() and not e.name.startswith("."))
    if not top:
        raise ValueError(f"{path} has no class folders")
    out: list[tuple[str, bytes, str]] = []
    for _ in range(count * 4):  # a class without images is skipped; a few tries, not a walk of everything
        if len(out) == count:
            break
        label = top[int(rng.integers(len(top)))]
        files = sorted(
            e.name
            for e in os.scandir(root / label)
            if e.is_file() and Path(e.name).suffix.lower() in IMAGE_EXTENSIONS and e.stat().st_size <= MAX_FILE_BYTES
        )
        if files:
            name = files[int(rng.integers(len(files)))]
            out.append((f"{label}/{name}", (root / label / name).read_bytes(), label))
    return out


def _zip_samples(root: Path, count: int, rng: np.random.Generator) -> list[tuple[str, bytes, str]]:
    with zipfile.ZipFile(root) as zf:
        members = [
            i
            for i in zf.infolist()
            if not i.is_dir()
            and Path(i.filename).suffix.lower() in IMAGE_EXTENSIONS
            and i.file_size <= MAX_FILE_BYTES
            and not any(p.startswith(".") or p == "__MACOSX" for p in PurePosixPath(i.filename).parts)
        ]
        parts = [PurePosixPath(i.filename).parts for i in members]
        for split in SPLIT_FOLDERS:  # a split layout, possibly under one wrapping folder
            chosen = [m for m, p in zip(members, parts, strict=True) if len(p) >= 3 and split in p[:-2]]
            if chosen:
                members = chosen
                break
        if not members:
            raise ValueError(f"{root} holds no images")
        picked = rng.choice(len(members), size=min(count, len(members)), replace=False)
        return [
            (members[i].filename, zf.read(members[i]), PurePosixPath(members[i].filename).parts[-2]) for i in picked
        ]
