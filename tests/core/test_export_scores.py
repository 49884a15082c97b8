"""A finished run's ONNX export scored on another dataset (core/export_scores.py): a real digits model, its file
scored on an image folder of digit PNGs gives the accuracy a user's own onnxruntime loop gets; a dataset with a
class the model does not know is refused by name; one lacking some of the model's classes is scored."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from core.catalog import FOLDER_DATASET
from core.data import DataError
from core.export_scores import class_map, evaluate_onnx
from core.spec_sections import DataSpec
from tests._onnx_digits import digit_png, reference, train_and_export

PICKED = range(0, 1797, 6)  # 300 real digits, every class


@pytest.fixture(scope="module")
def exported(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("digits_onnx")
    train_and_export(out)
    return out / "model.onnx"


def digit_folder(root: Path, names: dict[int, str] | None = None, skip: set[int] = frozenset()) -> Path:
    """The picked digits as PNGs in class folders named as the model's classes (or `names`)."""
    from sklearn.datasets import load_digits

    target = load_digits().target
    for i in PICKED:
        if int(target[i]) in skip:
            continue
        folder = root / (names or {}).get(int(target[i]), str(target[i]))
        folder.mkdir(parents=True, exist_ok=True)
        (folder / f"{i:04d}.png").write_bytes(digit_png(i))
    return root


def test_scores_equal_a_users_own_onnxruntime_loop(exported, tmp_path):
    folder = digit_folder(tmp_path / "site_b")
    result = evaluate_onnx(exported, DataSpec(name=FOLDER_DATASET, path=str(folder)))
    truth, probs = [], []
    for png in sorted(folder.glob("*/*.png")):
        _, p = reference(exported, png.read_bytes())
        truth.append(int(png.parent.name))
        probs.append(p)
    probs, truth = np.asarray(probs), np.asarray(truth)
    m = result["metrics"]
    assert result["images"] == len(truth) == len(PICKED)
    assert m["acc"] == pytest.approx(float((probs.argmax(1) == truth).mean()), abs=1e-9)
    assert m["acc"] > 0.8  # a real model: well above chance on digits it may not have seen
    assert m["loss"] == pytest.approx(float(-np.log(probs[np.arange(len(truth)), truth]).mean()), rel=1e-4)
    top5 = np.argsort(-probs, axis=1)[:, :5]
    assert m["acc_top5"] == pytest.approx(float((top5 == truth[:, None]).any(1).mean()))
    cm = np.asarray(result["details"]["confusion"])
    assert cm.sum() == len(truth) and np.trace(cm) == round(m["acc"] * len(truth))
    assert result["details"]["support"] == np.bincount(truth, minlength=10).tolist()
    assert 0 < m["f1_macro"] <= 1 and len(result["fingerprint"]) == 64


def test_a_class_the_model_does_not_know_is_refused_by_name(exported, tmp_path):
    folder = digit_folder(tmp_path / "renamed", names={3: "three"})
    with pytest.raises(DataError, match=r"1 class\(es\) the model does not know: 'three'"):
        evaluate_onnx(exported, DataSpec(name=FOLDER_DATASET, path=str(folder)))
    assert class_map(["7", "1"], [str(i) for i in range(10)]) == [7, 1]


def test_classes_of_the_model_absent_from_the_dataset_are_fine(exported, tmp_path):
    folder = digit_folder(tmp_path / "few", skip=set(range(4, 10)))
    result = evaluate_onnx(exported, DataSpec(name=FOLDER_DATASET, path=str(folder)))
    support = result["details"]["support"]
    assert support[4:] == [0] * 6 and sum(support) == result["images"] > 0
    assert result["details"]["class_names"] == [str(i) for i in range(10)]
