"""Photos keep their aspect (shorter side resized, centre crop) and a pretrained backbone gets its weights'
preprocessing (input size, resize before the crop, mean/std, interpolation) unless the spec overrides it; the
choice is recorded in DataInfo, the checkpoints, the export metadata, and the bundle's predict.py applies it."""

from __future__ import annotations

import json
import urllib.error
import zipfile
from pathlib import Path

import numpy as np
import pytest
import torch
import torchvision
from PIL import Image, ImageDraw
from pydantic import ValidationError

from core.catalog import IMAGENET_MEAN, IMAGENET_STD, MODELS
from core.checkpoint import load_checkpoint
from core.config import RunSpec
from core.data import DataError, LazyImages, Preprocess, load_data
from core.decode import decode as _decode
from core.events import MemorySink
from core.export_report import export_meta
from core.models import build_model
from core.spec_sections import DataSpec, ModelSpec
from core.train import export_run, run_training
from tests._images import whole

CPU = torch.device("cpu")
TV_MODEL = "mobilenet_v3_small"  # the cheapest torchvision classifier at 224 px


@pytest.fixture(autouse=True)
def _one_thread():
    torch.set_num_threads(1)


def _disc(path: Path, w: int, h: int, radius: int, fill=(255, 255, 255)) -> None:
    """A filled circle centred on a black w × h picture."""
    im = Image.new("RGB", (w, h))
    ImageDraw.Draw(im).ellipse((w / 2 - radius, h / 2 - radius, w / 2 + radius, h / 2 + radius), fill=fill)
    im.save(path)


def _photos(root: Path, per_class: int = 5, w: int = 80, h: int = 60, seed: int = 0) -> Path:
    """Non-square RGB photos of two classes: a disc, or a horizontal bar, on noise."""
    rng = np.random.default_rng(seed)
    for label in ("bar", "disc"):
        (root / label).mkdir(parents=True)
        for i in range(per_class):
            arr = rng.integers(0, 60, (h, w, 3), dtype=np.uint8)
            im = Image.fromarray(arr)
            d = ImageDraw.Draw(im)
            if label == "disc":
                d.ellipse((w / 2 - h / 3, h / 3 - h / 6, w / 2 + h / 3, h / 2 + h / 3), fill=(250, 200, 40))
            else:
                d.rectangle((0, h / 2 - 4, w, h / 2 + 4), fill=(40, 200, 250))
            im.save(root / label / f"{i}.png")
    return root


def _extent(mask: np.ndarray) -> tuple[int, int, float, float]:
    """Width, height and centre (x, y) of the True pixels of a 2-D mask."""
    ys, xs = np.nonzero(mask)
    return xs.max() - xs.min() + 1, ys.max() - ys.min() + 1, (xs.max() + xs.min()) / 2, (ys.max() + ys.min()) / 2


@pytest.fixture
def planted(tmp_path, monkeypatch) -> Path:
    """ImageNet-shaped mobilenet_v3_small weights (seeded, not the real ones) planted in an empty $TORCH_HOME under
    the catalog's file name; any download fails as it would offline."""
    monkeypatch.setenv("TORCH_HOME", str(tmp_path / "torch"))

    def offline(url: str, *args: object, **kwargs: object) -> None:
        raise urllib.error.URLError(f"no network in tests: {url}")

    monkeypatch.setattr(torch.hub, "download_url_to_file", offline)
    torch.manual_seed(1234)
    checkpoints = tmp_path / "torch" / "hub" / "checkpoints"
    checkpoints.mkdir(parents=True)
    path = checkpoints / MODELS[TV_MODEL].weights.file
    torch.save(torchvision.models.get_model(TV_MODEL, weights=None).state_dict(), path)
    return path


# --- aspect kept --------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "cache_mb,disk_cache", [(2048, True), (0, True), (0, False)], ids=["in_memory", "image_cache", "per_item"]
)
def test_a_640x480_photo_keeps_its_aspect_a_circle_stays_a_circle(tmp_path, cache_mb, disk_cache):
    root = tmp_path / "shapes"
    for label in ("a", "b"):
        (root / label).mkdir(parents=True)
        for i in range(3):
            _disc(root / label / f"{i}.png", 640, 480, radius=200)
    spec = DataSpec(name="imagefolder", path=str(root), image_size=48, cache_mb=cache_mb, disk_cache=disk_cache)
    b = load_data(spec, seed=0)
    assert getattr(b.train.images, "held", False) == (cache_mb > 0)  # held in memory: the image cache's pages
    assert isinstance(b.train.images, LazyImages) == (not disk_cache)
    img = b.train.images[0].numpy()
    assert img.shape == (3, 48, 48)
    w, h, cx, cy = _extent(img[0] > 128)
    # 480 px → 48 px: the 400 px disc is 40 px across both ways (squashed to a square it was 30 × 40)
    assert abs(w - 40) <= 1 and abs(h - 40) <= 1 and abs(w - h) <= 1
    assert abs(cx - 23.5) <= 0.5 and abs(cy - 23.5) <= 0.5  # still in the middle: the crop is centred


def test_a_left_right_split_stays_at_the_centre_and_a_wide_margin_is_cropped_away(tmp_path):
    """A 640×480 picture: black left half, white right half, and a red 60 px stripe at its left edge that a
    centre crop of the 480 × 480 middle removes (squashing would have kept it)."""
    im = Image.new("RGB", (640, 480), (0, 0, 0))
    draw = ImageDraw.Draw(im)
    draw.rectangle((320, 0, 639, 479), fill=(255, 255, 255))
    draw.rectangle((0, 0, 59, 479), fill=(255, 0, 0))
    buf = tmp_path / "split.png"
    im.save(buf)
    arr = _decode(buf.read_bytes(), "RGB", 32).astype(int)
    assert arr.shape == (3, 32, 32)
    green = arr[1].mean(axis=0)  # per column: only the white half has green
    assert (green[17:] > 250).all() and (green[:15] < 5).all()  # the split is at column 16 of 32
    assert abs(green[15] + green[16] - 255) < 40  # the two columns astride it share the edge
    assert not ((arr[0] > 128) & (arr[1] < 64)).any()  # no red: the stripe was outside the centre square


# --- pretrained means its preprocessing ---------------------------------------------------------------------------


def _tv_spec(root: Path, out_formats: list[str] | None = None, **data: object) -> RunSpec:
    return RunSpec.from_dict(
        {
            "data": {"name": "imagefolder", "path": str(root), "val_fraction": 0.4, **data},
            "model": {"name": TV_MODEL, "pretrained": True, "transfer": "feature_extract"},
            "train": {"epochs": 1, "batch_size": 4, "log_every": 1, "early_stopping": {"enabled": False}},
            "export": {"formats": out_formats or []},
            "device": "cpu",
            "seed": 0,
        }
    )


def test_planted_torchvision_weights_bring_224_crops_and_imagenet_statistics_recorded(tmp_path, planted):
    root = _photos(tmp_path / "photos", per_class=4)
    spec = _tv_spec(root)
    sink = MemorySink()
    summary = run_training(spec, tmp_path / "run", sink)
    assert summary["status"] == "completed", summary
    resize = MODELS[TV_MODEL].weights.preprocessing.resize_size  # 256 for torchvision's mobilenet_v3_small
    shape = next(e["data"] for e in sink.events if e["data"].get("code") == "shape_check")
    assert shape["input_shape"] == [3, 224, 224]  # the weights' crop, not the imagefolder default of 64
    data_event = next(e["data"] for e in sink.events if e["data"].get("code") == "data")
    rec = data_event["preprocessing"]
    assert data_event["image_size"] == 224 and rec["resize"] == resize and rec["crop"] == "centre"
    assert rec["source"] == "weights" and "IMAGENET1K_V1" in rec["weights"] and rec["stats_from"] == "weights"
    assert data_event["mean"] == pytest.approx(IMAGENET_MEAN) and data_event["std"] == pytest.approx(IMAGENET_STD)
    info = load_checkpoint(tmp_path / "run" / "checkpoints" / "last.pt")["data_info"]
    assert info["preprocessing"] == rec and info["image_size"] == 224  # the checkpoint carries it


def test_source_dataset_and_overrides_replace_the_weights_choices(tmp_path, planted):
    root = _photos(tmp_path / "photos", per_class=3)
    model = ModelSpec(name=TV_MODEL, pretrained=True)
    own = load_data(_tv_spec(root, preprocess={"source": "dataset"}).data, 0, model).info
    assert own.image_size == 64 and own.preprocessing["resize"] == 64 and own.preprocessing["source"] == "dataset"
    assert own.mean != pytest.approx(IMAGENET_MEAN)  # the training split's
    mine = {"mean": [0.5], "std": [0.25], "resize_ratio": 1.5, "interpolation": "bicubic"}
    b = load_data(_tv_spec(root, image_size=32, preprocess=mine).data, 0, model)
    rec = b.info.preprocessing
    assert b.info.mean == [0.5] * 3 and b.info.std == [0.25] * 3 and rec["stats_from"] == "spec"
    assert (b.info.image_size, rec["resize"], rec["interpolation"]) == (32, 48, "bicubic")
    assert rec["source"] == "weights" and "data.preprocess.mean/std" in rec["overridden"]
    assert tuple(b.train.images.shape[1:]) == (3, 48, 48)
    x = Preprocess(b.info, None, CPU)(whole(b.val.images))
    assert tuple(x.shape[1:]) == (3, 32, 32)
    raw = whole(b.val.images)[:, :, 8:40, 8:40].float() / 255  # the centre 32 px of the stored 48
    assert torch.allclose(x, (raw - 0.5) / 0.25, atol=1e-5)


def test_bad_mean_std_are_refused_naming_the_field(tmp_path):
    for bad, where in (
        ({"mean": [0.5]}, "data.preprocess.std"),
        ({"mean": [0.5, 0.5], "std": [0.2, 0.2]}, "1 value"),
        ({"mean": [0.5, 0.5, 0.5], "std": [0.2, 0.0, 0.2]}, "> 0"),
        ({"mean": [0.5], "std": [0.2, 0.2, 0.2]}, "same number"),
    ):
        with pytest.raises(ValidationError, match="preprocess") as e:
            DataSpec(name="digits", preprocess=bad)
        assert where in str(e.value), (bad, str(e.value))
    with pytest.raises(ValidationError, match="data.normalize"):
        DataSpec(name="digits", normalize=False, preprocess={"mean": [0.5], "std": [0.2]})
    with pytest.raises(ValidationError, match="data.channels"):
        DataSpec(name="synthetic", channels=1, preprocess={"mean": [0.5] * 3, "std": [0.2] * 3})
    # digits are grayscale: three values cannot be theirs
    with pytest.raises(DataError, match=r"data\.preprocess\.mean has 3 values .* 1 channel"):
        load_data(DataSpec(name="digits", preprocess={"mean": [0.5] * 3, "std": [0.2] * 3}), 0)
    with pytest.raises(DataError, match="data.preprocess.source is weights"):
        load_data(DataSpec(name="digits", preprocess={"source": "weights"}), 0, ModelSpec(name="simple_cnn"))


def test_small_sets_without_weights_keep_their_own_size_and_statistics():
    b = load_data(DataSpec(name="digits"), 0, ModelSpec(name="simple_cnn"))
    assert b.info.image_size == 8 and b.info.preprocessing["resize"] == 8
    assert b.info.preprocessing["stats_from"] == "training split" and tuple(b.train.images.shape[1:]) == (1, 8, 8)


def test_a_set_too_big_to_store_resized_is_resized_per_batch_on_the_device(planted):
    spec = DataSpec(name="synthetic", num_samples=40, size=16, num_classes=2, cache_mb=0)
    b = load_data(spec, 0, ModelSpec(name=TV_MODEL, pretrained=True))
    assert tuple(b.train.images.shape[1:]) == (3, 16, 16)  # kept at its own side: 0 MB to store it larger
    x = Preprocess(b.info, None, CPU)(b.val.images[:2])
    assert tuple(x.shape[1:]) == (3, 224, 224)


# --- the checkpoint's own, the export and predict.py --------------------------------------------------------------


@pytest.fixture(scope="module")
def trained(tmp_path_factory) -> dict:
    """A tiny run on non-square photos with a resize margin and bicubic interpolation, exported to ONNX."""
    torch.set_num_threads(1)
    tmp = tmp_path_factory.mktemp("photos_run")
    root = _photos(tmp / "photos", per_class=6, w=72, h=40)
    spec = RunSpec.from_dict(
        {
            "data": {
                "name": "imagefolder",
                "path": str(root),
                "image_size": 16,
                "val_fraction": 0.34,
                "preprocess": {"resize_ratio": 1.25, "interpolation": "bicubic"},
            },
            "model": {"name": "simple_cnn", "hidden": 16},
            "train": {"epochs": 3, "batch_size": 4, "log_every": 1, "early_stopping": {"enabled": False}},
            "export": {"formats": ["onnx"], "parity_samples": 4},
            "device": "cpu",
            "seed": 0,
        }
    )
    summary = run_training(spec, tmp / "run", MemorySink())
    assert summary["status"] == "completed", summary
    return {"spec": spec, "run": tmp / "run", "root": root, "tmp": tmp}


def test_predict_py_gives_the_models_class_for_a_non_square_photo(trained, tmp_path):
    import importlib.util

    with zipfile.ZipFile(trained["run"] / "export" / "bundle.zip") as zf:
        zf.extractall(tmp_path / "bundle")
    report = json.loads((tmp_path / "bundle" / "export.json").read_text())
    assert (report["input"]["image_size"], report["input"]["resize"]) == (16, 20)
    assert report["input"]["interpolation"] == "bicubic" and report["input"]["preprocessing"]["source"] == "dataset"
    loader = importlib.util.spec_from_file_location("bundle_predict", tmp_path / "bundle" / "predict.py")
    predict = importlib.util.module_from_spec(loader)
    loader.loader.exec_module(predict)
    session, meta = predict.load_model(tmp_path / "bundle" / "model.onnx")
    assert (meta["resize"], meta["interpolation"]) == (20, "bicubic")
    ck = load_checkpoint(trained["run"] / "checkpoints" / "best.pt")
    spec = trained["spec"]
    data = load_data(spec.data, spec.seed, spec.model)
    model = build_model(spec.model, data.info.num_classes, data.info.channels, data.info.image_size)
    model.load_state_dict(ck["model"])
    model.eval()
    for label in ("bar", "disc"):
        photo = trained["root"] / label / "0.png"  # 72 × 40: wider than high
        x = Preprocess(data.info, None, CPU)(torch.from_numpy(_decode(photo.read_bytes(), "RGB", 20, "bicubic"))[None])
        np.testing.assert_allclose(predict.preprocess(photo, meta), x.numpy(), atol=1e-6)
        with torch.no_grad():
            want = data.info.class_names[int(model(x).argmax(1))]
        assert predict.classify(session, meta, photo)[0] == want


def test_a_checkpoint_as_weights_file_carries_its_own_preprocessing(trained):
    best = trained["run"] / "checkpoints" / "best.pt"
    recorded = load_checkpoint(best)["data_info"]
    data = DataSpec(name="imagefolder", path=str(trained["root"]), val_fraction=0.34)  # no size: the file's
    b = load_data(data, 0, ModelSpec(name="simple_cnn", hidden=16, weights_file=str(best)))
    rec = b.info.preprocessing
    assert rec["source"] == "checkpoint" and rec["stats_from"] == "checkpoint"
    assert rec["weights"] == "torchdeck checkpoint run/checkpoints/best.pt"  # its folders, not the whole path
    assert (b.info.image_size, rec["resize"], rec["interpolation"]) == (16, 20, "bicubic")
    assert b.info.mean == recorded["mean"] and b.info.std == recorded["std"]
    # the same file with the dataset's own preprocessing asked for: the imagefolder default and its statistics
    own = load_data(
        data.model_copy(update={"preprocess": data.preprocess.model_copy(update={"source": "dataset"})}),
        0,
        ModelSpec(name="simple_cnn", hidden=16, weights_file=str(best)),
    )
    assert own.info.image_size == 64 and own.info.preprocessing["source"] == "dataset"


def test_an_export_from_the_checkpoint_keeps_the_recorded_preprocessing(trained, tmp_path):
    export_run(trained["run"], "best", ["onnx"], out=tmp_path / "again")
    report = json.loads((tmp_path / "again" / "export.json").read_text())
    first = json.loads((trained["run"] / "export" / "export.json").read_text())
    assert report["formats"]["onnx"]["ok"]
    for key in ("image_size", "resize", "interpolation", "mean", "std", "preprocessing"):
        assert report["input"][key] == first["input"][key], key


def test_export_meta_names_the_resize_and_whose_preprocessing(trained):
    info = load_data(trained["spec"].data, 0).info
    meta = export_meta(info, "hash")
    assert (meta["resize"], meta["interpolation"], meta["image_size"]) == (20, "bicubic", 16)
    assert meta["preprocessing"]["source"] == "dataset"


def test_the_memory_and_size_estimates_know_the_weights_input_size():
    from core import model_size, preflight

    data = {"name": "synthetic", "num_samples": 100, "size": 32, "channels": 3}
    plain = RunSpec.from_dict({"data": data, "model": {"name": TV_MODEL}})
    tuned = RunSpec.from_dict({"data": data, "model": {"name": TV_MODEL, "pretrained": True}})
    assert model_size.task_of(plain).size == 32
    task = model_size.task_of(tuned)
    assert (task.size, task.size_field) == (224, "data.image_size")  # the lever a message names
    resize = MODELS[TV_MODEL].weights.preprocessing.resize_size
    # stored at the resize side (it fits data.cache_mb), plus the float copy of the 224 px crops
    assert preflight.data_memory_bytes(tuned) == 100 * 3 * (resize**2 + 224**2 * 4)
    assert preflight.data_memory_bytes(plain) == 100 * 3 * 32**2 * 5


def test_a_timm_model_the_catalog_does_not_list_brings_its_pretrained_cfg():
    timm = pytest.importorskip("timm")
    cfg = timm.models.get_pretrained_cfg("resnet10t")  # read from timm's registry: no weights are needed for it
    spec = DataSpec(name="synthetic", num_samples=20, size=16, num_classes=2)
    b = load_data(spec, 0, ModelSpec(name="timm/resnet10t", pretrained=True))
    rec = b.info.preprocessing
    assert b.info.image_size == cfg.input_size[-1] and rec["interpolation"] == cfg.interpolation
    assert rec["resize"] == int(cfg.input_size[-1] / cfg.crop_pct) and b.info.mean == pytest.approx(list(cfg.mean))
    assert rec["source"] == "weights" and rec["weights"] == "timm/resnet10t pretrained"
