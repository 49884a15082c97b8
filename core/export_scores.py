"""A finished run's ONNX export scored on another registered dataset (a newer test set, another site's photos): the
Run page's "Evaluate", done by a jobs worker (worker/evaluate_job.py).

The file alone says how its images are prepared: the ONNX metadata records the class names, the channels, the
stored side and its interpolation, the input side and the mean/std (core/export_predict.py reads them, as the
bundle's predict.py does). The dataset is loaded whole at that stored side (core/data.load_every), then centre
cropped and normalised by the training core's own Preprocess, so an image scored here is prepared as the run's
test split was. ONNX Runtime runs on the CPU: the jobs workers own no GPU.

The dataset's classes are matched to the model's by name: a class the model does not know is refused (its images
have no right answer); the model's classes that the dataset lacks are fine (their support is 0).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import torch

from core.data import DataError, DataInfo, Preprocess, load_every
from core.insight import confusion_scores, top_confusions
from core.names import MAX_CONFUSION_CLASSES
from core.scores import macro_f1
from core.spec_sections import DataSpec

BATCH = 256  # images per ONNX Runtime call: large enough to amortise the call, small enough for any host


def class_map(dataset: list[str], model: list[str]) -> list[int]:
    """The model's index of each of the dataset's classes, by name; DataError naming the classes it does not know."""
    index = {name: i for i, name in enumerate(model)}
    unknown = [c for c in dataset if c not in index]
    if unknown:
        shown = ", ".join(repr(c) for c in unknown[:10]) + (
            f" and {len(unknown) - 10} more" if len(unknown) > 10 else ""
        )
        raise DataError(
            f"the dataset has {len(unknown)} class(es) the model does not know: {shown} "
            f"(the model's classes: {', '.join(model[:20])}{', …' if len(model) > 20 else ''}); "
            "name its class folders as the model's classes"
        )
    return [index[c] for c in dataset]


def _as_channels(x: torch.Tensor, channels: int) -> torch.Tensor:
    """A uint8 batch with the model's channels: grey repeated into RGB, RGB to grey with PIL's L weights."""
    if x.shape[1] == channels:
        return x
    if x.shape[1] == 1:
        return x.expand(-1, channels, -1, -1)
    weights = torch.tensor([0.299, 0.587, 0.114]).view(1, 3, 1, 1)
    return (x[:, :3].float() * weights).sum(1, keepdim=True).round().clamp(0, 255).to(torch.uint8)


def _info(meta: dict[str, Any]) -> DataInfo:
    """What Preprocess needs, from the ONNX metadata."""
    return DataInfo(
        name="",
        class_names=list(meta["class_names"]),
        channels=int(meta["channels"]),
        image_size=int(meta["image_size"]),
        mean=list(meta["mean"]),
        std=list(meta["std"]),
        num_train=0,
        num_val=0,
        preprocessing={"resize": int(meta["resize"]), "interpolation": meta["interpolation"]},
    )


def _batch(images, idx: range) -> torch.Tensor:
    if isinstance(images, torch.Tensor):
        return images[idx.start : idx.stop]
    return torch.stack([torch.as_tensor(images[i]) for i in idx])


def logits_of(session: Any, meta: dict[str, Any], images) -> np.ndarray:
    """The model's logits for every image (uint8, N × C × H × W or a lazily decoded set), prepared as its run's test
    split was."""
    pre, name = Preprocess(_info(meta), None, torch.device("cpu")), session.get_inputs()[0].name
    out = []
    for start in range(0, len(images), BATCH):
        x = _as_channels(_batch(images, range(start, min(start + BATCH, len(images)))), int(meta["channels"]))
        with torch.inference_mode():
            xs = pre(x).numpy().astype(np.float32, copy=False)
        out.append(session.run(None, {name: xs})[0])
    return np.concatenate(out) if out else np.zeros((0, len(meta["class_names"])), np.float32)


def scores(logits: np.ndarray, labels: np.ndarray, class_names: list[str]) -> dict[str, Any]:
    """{"metrics": acc, acc_top5 (more than 5 classes), f1_macro, loss (cross-entropy); "details": per-class
    precision/recall/F1/support, the confusion matrix (or its most confused pairs) and the class names}."""
    c, n = len(class_names), len(labels)
    shifted = logits - logits.max(axis=1, keepdims=True)
    log_p = shifted - np.log(np.exp(shifted).sum(axis=1, keepdims=True))
    predicted = logits.argmax(axis=1)
    cm = torch.as_tensor(np.bincount(labels * c + predicted, minlength=c * c).reshape(c, c))
    metrics = {
        "acc": float((predicted == labels).mean()) if n else 0.0,
        "f1_macro": macro_f1(cm.diag().tolist(), cm.sum(1).tolist(), cm.sum(0).tolist()),
        "loss": float(-log_p[np.arange(n), labels].mean()) if n else 0.0,
    }
    if c > 5:
        top5 = np.argsort(-logits, axis=1)[:, :5]
        metrics["acc_top5"] = float((top5 == labels[:, None]).any(axis=1).mean()) if n else 0.0
    details: dict[str, Any] = {"class_names": class_names, **confusion_scores(cm)}
    if c <= MAX_CONFUSION_CLASSES:
        details["confusion"] = cm.tolist()
    else:
        details["top_confusions"] = top_confusions(cm, class_names)
    return {"metrics": metrics, "details": details}


def evaluate_onnx(model_path: Path, data: DataSpec) -> dict[str, Any]:
    """Score the ONNX file on every image of `data`: {"metrics", "details", "images", "skipped", "fingerprint"}.
    DataError when the dataset cannot be read or has a class the model does not know."""
    from core.export_predict import load_model

    session, meta = load_model(model_path)
    mode = "L" if int(meta["channels"]) == 1 else "RGB"
    names = list(meta["class_names"])
    side, interpolation = int(meta["resize"]), meta["interpolation"]
    loaded, fingerprint = load_every(data, side, interpolation, mode, check=lambda classes: class_map(classes, names))
    images, labels, classes, skipped = loaded
    mapped = np.asarray(class_map(classes, names), dtype=np.int64)[labels.numpy()]
    result = scores(logits_of(session, meta, images), mapped, names)
    return {**result, "images": len(mapped), "skipped": list(skipped)[:20], "fingerprint": fingerprint}
