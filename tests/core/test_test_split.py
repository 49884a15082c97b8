"""The held-out test split: where it comes from (a torchvision set's official test split, an image folder's test/
folder, another folder, a stratified fraction), seeded and disjoint from training and validation; scored once at the
end with the weights the export uses, stored once (a resumed run never scores it again); refused wherever a metric
selects something."""

from __future__ import annotations

import re
import struct
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image
from pydantic import ValidationError

from core import test_scores
from core.checkpoint import load_checkpoint
from core.config import RunSpec
from core.data import DataError, Preprocess, load_data
from core.events import MemorySink
from core.models import build_model
from core.spec_sections import DataSpec
from core.splits import carve_test
from core.train import run_training
from sweep.spec import SweepSpec
from tests._images import whole

CPU = torch.device("cpu")


@pytest.fixture(autouse=True)
def _one_thread():
    torch.set_num_threads(1)


# --- sources -------------------------------------------------------------------------------------------------


def _idx(path: Path, magic: int, array: np.ndarray) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(struct.pack(">I", magic) + b"".join(struct.pack(">I", d) for d in array.shape) + array.tobytes())


def _fake_mnist(root: Path, n_train: int, n_test: int) -> tuple[np.ndarray, np.ndarray]:
    """MNIST's four raw files with made-up digits: image i of a split is filled with one value that tells which
    split and which sample it is. Returns the test images and labels."""
    raw = root / "MNIST" / "raw"
    out = {}
    for prefix, n, base in (("train", n_train, 0), ("t10k", n_test, 200)):
        images = np.zeros((n, 28, 28), dtype=np.uint8) + (base + np.arange(n, dtype=np.uint8))[:, None, None]
        labels = (np.arange(n) % 10).astype(np.uint8)
        _idx(raw / f"{prefix}-images-idx3-ubyte", 2051, images)
        _idx(raw / f"{prefix}-labels-idx1-ubyte", 2049, labels)
        out[prefix] = images, labels
    return out["t10k"]


def test_a_torchvision_set_is_tested_on_its_official_test_split(tmp_path):
    test_images, test_labels = _fake_mnist(tmp_path, n_train=40, n_test=12)
    b = load_data(DataSpec(name="mnist", path=str(tmp_path)), seed=0)
    assert (b.info.test_source, b.info.num_test) == ("official", 12)
    assert torch.equal(b.test.images[:, 0], torch.from_numpy(test_images))  # the t10k file, sample for sample
    assert torch.equal(b.test.labels, torch.from_numpy(test_labels).long())
    assert b.info.num_train + b.info.num_val == 40  # training and validation come from the training file only
    assert int(torch.cat([b.train.images, b.val.images]).max()) < 200
    limited = load_data(DataSpec(name="mnist", path=str(tmp_path), limit=10), seed=0)
    assert limited.info.num_test == 10  # data.limit caps the test split too (quick trials)
    none = load_data(DataSpec(name="mnist", path=str(tmp_path), test_split="none"), seed=0)
    assert none.test is None and (none.info.test_source, none.info.num_test) == ("none", 0)


def _png(path: Path, color: tuple[int, int, int]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    Image.new("RGB", (6, 6), color).save(path)


def _classes(root: Path, n: int, green: int) -> None:
    """root/red/*.png and root/blue/*.png; sample i's green channel is green + i (which file it was shows)."""
    for name, red in (("red", 220), ("blue", 20)):
        for i in range(n):
            _png(root / name / f"{i}.png", (red, green + i, 255 - red))


def test_an_image_folder_with_a_test_folder_is_tested_on_it(tmp_path):
    _classes(tmp_path / "photos" / "train", 8, green=0)
    _classes(tmp_path / "photos" / "test", 3, green=100)
    b = load_data(DataSpec(name="imagefolder", path=str(tmp_path / "photos"), image_size=6), seed=0)
    assert b.info.class_names == ["blue", "red"]  # train/ and test/ are not classes
    assert (b.info.test_source, b.info.num_test, b.info.num_train + b.info.num_val) == ("folder", 6, 16)
    assert sorted(whole(b.test.images)[:, 1, 0, 0].tolist()) == [100, 100, 101, 101, 102, 102]
    assert b.test.labels.tolist() == [0, 0, 0, 1, 1, 1]
    assert int(torch.cat([whole(b.train.images), whole(b.val.images)])[:, 1].max()) < 100
    # with a val/ folder too, validation is that folder: nothing of train/ is held out for it
    _classes(tmp_path / "photos" / "val", 2, green=50)
    b = load_data(DataSpec(name="imagefolder", path=str(tmp_path / "photos"), image_size=6), seed=0)
    assert (b.info.num_train, b.info.num_val, b.info.num_test) == (16, 4, 6)
    assert sorted(whole(b.val.images)[:, 1, 0, 0].unique().tolist()) == [50, 51]


def test_a_test_folder_or_test_path_with_other_classes_is_refused(tmp_path):
    _classes(tmp_path / "photos" / "train", 4, green=0)
    _png(tmp_path / "photos" / "test" / "red" / "0.png", (220, 0, 35))
    _png(tmp_path / "photos" / "test" / "green" / "0.png", (0, 220, 0))
    with pytest.raises(
        DataError, match=r"test/ folder must have the training split's classes: missing blue; extra green"
    ):
        load_data(DataSpec(name="imagefolder", path=str(tmp_path / "photos"), image_size=6), seed=0)
    _classes(tmp_path / "other", 2, green=150)
    b = load_data(
        DataSpec(name="imagefolder", path=str(tmp_path / "photos" / "train"), test_path=str(tmp_path / "other")),
        seed=0,
    )
    assert (b.info.test_source, b.info.num_test) == ("path", 4)
    odd = tmp_path / "photos" / "test"  # red and green
    with pytest.raises(DataError, match="data.test_path must have the training split's classes: missing blue"):
        load_data(DataSpec(name="imagefolder", path=str(tmp_path / "photos" / "train"), test_path=str(odd)), seed=0)


def _unique_folder(root: Path, per_class: int) -> Path:
    """Three classes whose every image has a colour of its own: (class, index) can be read back from a pixel."""
    for c in range(3):
        for i in range(per_class):
            _png(root / f"c{c}" / f"{i:02d}.png", (80 * c, 5 * i, 7))
    return root


def _ids(split) -> list[tuple[int, int]]:
    return [(int(x[0, 0, 0]) // 80, int(x[1, 0, 0]) // 5) for x in split.images]


def test_a_test_fraction_is_stratified_seeded_and_disjoint_from_training_and_validation(tmp_path):
    root = _unique_folder(tmp_path / "f", per_class=20)
    spec = DataSpec(name="imagefolder", path=str(root), image_size=4, val_fraction=0.25, test_fraction=0.2)
    a, again, other = load_data(spec, seed=1), load_data(spec, seed=1), load_data(spec, seed=2)
    train, val, test = _ids(a.train), _ids(a.val), _ids(a.test)
    assert a.info.test_source == "fraction" and len(set(train + val + test)) == 60 == len(train + val + test)
    assert [sum(c == k for c, _ in test) for k in range(3)] == [4, 4, 4]  # 20 % of each class
    assert [sum(c == k for c, _ in val) for k in range(3)] == [5, 5, 5]  # val_fraction stays a share of all samples
    assert _ids(again.test) == test and _ids(again.val) == val
    assert _ids(other.test) != test
    # the default for a folder without test/ is 10 %; none holds nothing out
    assert load_data(DataSpec(name="imagefolder", path=str(root), image_size=4), seed=1).info.num_test == 6
    assert load_data(DataSpec(name="imagefolder", path=str(root), test_split="none"), seed=1).test is None


def test_carving_keeps_a_sample_to_train_on_and_one_to_validate_in_every_class():
    labels = torch.tensor([0] * 2 + [1] * 3 + [2] * 50)
    rest, test = carve_test(labels, 0.5, seed=0)
    assert np.bincount(labels[test].numpy(), minlength=3).tolist() == [0, 1, 25]
    assert set(rest).isdisjoint(test) and len(rest) + len(test) == 55


def test_digits_has_no_test_split_unless_asked():
    assert load_data(DataSpec(name="digits"), seed=0).test is None
    b = load_data(DataSpec(name="digits", test_split="fraction"), seed=0)
    assert b.info.num_test == 179 and b.info.num_train + b.info.num_val + b.info.num_test == 1797


@pytest.mark.parametrize(
    "fields, message",
    [
        ({"name": "digits", "test_split": "official"}, "data.test_split=official: digits has no official test split"),
        ({"name": "digits", "test_fraction": 0.5, "val_fraction": 0.5}, "data.val_fraction (0.5) + data.test_fraction"),
        ({"name": "mnist", "test_fraction": 0.1}, "data.test_fraction is set but mnist uses the official test split"),
        ({"name": "digits", "test_path": "/x"}, "data.test_path is an image folder with the same classes"),
        ({"name": "synthetic", "test_split": "path"}, "data.test_split=path needs data.test_path"),
        ({"name": "digits", "test_split": "fraction", "test_fraction": 0}, "holds nothing out: use none"),
        ({"name": "digits", "test_split": "folder"}, "data.test_split=folder reads an imagefolder's test/ folder"),
    ],
)
def test_bad_test_split_settings_are_refused_with_the_field(fields, message):
    with pytest.raises(ValidationError, match=re.escape(message)):
        DataSpec(**fields)


# --- selection never sees it -----------------------------------------------------------------------------------


@pytest.mark.parametrize("metric", ["test/acc", "test/loss", "test/f1_macro"])
def test_a_test_metric_is_refused_as_monitor_and_as_sweep_objective(metric):
    with pytest.raises(ValidationError, match=f"train.early_stopping.monitor={metric}: the test split's scores"):
        RunSpec.model_validate({"train": {"early_stopping": {"monitor": metric}}})
    space = {"optim.lr": {"choice": [0.1, 0.01]}}
    with pytest.raises(ValidationError, match=f"objective.metric={metric}: .*nothing that selects"):
        SweepSpec.model_validate({"space": space, "objective": {"metric": metric}})
    with pytest.raises(ValidationError, match="pruning"):  # a sweep without objective optimises the monitor
        SweepSpec.model_validate({"space": space, "base": {"train": {"early_stopping": {"monitor": metric}}}})


# --- scored once, at the end, with the export's weights -------------------------------------------------------

TINY = {
    "data": {"name": "synthetic", "num_classes": 7, "num_samples": 140, "size": 8, "channels": 1, "test_fraction": 0.2},
    "model": {"name": "simple_cnn", "hidden": 16},
    "train": {"epochs": 3, "batch_size": 16},
    "optim": {"lr": 0.05},
    "export": {"formats": [], "checkpoint": "best"},
    "device": "cpu",
    "seed": 0,
    "deterministic": True,
}


def _by_hand(spec: RunSpec, weights: dict) -> float:
    """test/acc recomputed from a checkpoint file, outside the run."""
    data = load_data(spec.data, spec.seed)
    model = build_model(spec.model, data.info.num_classes, data.info.channels, data.info.image_size)
    model.load_state_dict(weights)
    model.eval()
    with torch.no_grad():
        logits = model(Preprocess(data.info, None, CPU)(data.test.images))
    return (logits.argmax(1) == data.test.labels).float().mean().item()


def test_the_test_split_is_scored_once_at_the_end_with_the_exported_weights(tmp_path):
    spec = RunSpec.from_dict(TINY)
    sink = MemorySink()
    summary = run_training(spec, tmp_path, sink)
    rows = [(step, values) for step, _, values in sink.metric_rows if any(k.startswith("test/") for k in values)]
    assert len(rows) == 1  # one set of scores, after the last epoch
    step, scores = rows[0]
    assert step == summary["global_step"]
    assert set(scores) == {"test/loss", "test/acc", "test/acc_top5", "test/f1_macro"}
    assert summary["test"] == scores
    best = load_checkpoint(tmp_path / "checkpoints" / "best.pt")
    assert scores["test/acc"] == pytest.approx(_by_hand(spec, best["model"]))
    [event] = [e for e in sink.events if e["kind"] == "test"]
    data = event["data"]
    assert data["weights"] == {"checkpoint": "best", "epoch": best["epoch"]} and data["samples"] == 28
    confusion = np.array(data["confusion"])
    assert confusion.sum() == 28 and np.trace(confusion) == round(28 * scores["test/acc"])
    assert len(data["f1"]) == len(data["precision"]) == 7 and sum(data["support"]) == 28
    # the scores are no part of any epoch's record: nothing that selects ever saw them
    assert not any(k.startswith("test/") for k in summary["final"])


def test_a_resumed_run_sends_the_recorded_scores_instead_of_scoring_again(tmp_path, monkeypatch):
    spec = RunSpec.from_dict(TINY)
    first = MemorySink()
    run_training(spec, tmp_path, first)
    assert "test_scores" in load_checkpoint(tmp_path / "checkpoints" / "last.pt")

    def never(*_):
        raise AssertionError("the test split was scored a second time")

    monkeypatch.setattr(test_scores, "measure", never)
    again = MemorySink()
    summary = run_training(spec, tmp_path, again, resume=True)
    assert summary["status"] == "completed" and "test_failed" not in again.codes()
    assert again.series("test/acc") == first.series("test/acc")
    assert [e["data"] for e in again.events if e["kind"] == "test"] == [
        e["data"] for e in first.events if e["kind"] == "test"
    ]


def test_test_scores_are_stored_once_in_the_database_across_attempts(tmp_path):
    from db.engine import make_engine
    from db.migrate import upgrade
    from db.repo import claim_run, create_run, get_run, list_events
    from worker.settings import WorkerSettings
    from worker.sink import DbSink

    url = f"sqlite:///{tmp_path / 'db.sqlite'}"
    upgrade(url)
    engine = make_engine(url)
    spec = RunSpec.from_dict(TINY)
    run = claim_run(engine, create_run(engine, spec.model_dump(mode="json"), name="held-out").id, "w1")
    try:
        for attempt in (1, 2):
            sink = DbSink(engine, run.id, "w1", WorkerSettings(flush_s=0.05, heartbeat_s=0.5), attempt=attempt)
            try:
                run_training(spec, tmp_path / "run", sink, resume=attempt == 2)
                assert sink.flush(60)
            finally:
                sink.close()
        stored = get_run(engine, run.id).metrics
        assert stored["test/acc"].count == 1 and stored["test/loss"].count == 1
        assert [e.code for e in list_events(engine, run.id) if e.kind == "test"] == ["test_scores"]
    finally:
        engine.dispose()


@pytest.mark.timeout(300)
def test_on_two_processes_rank_0_scores_the_whole_test_split_once(tmp_path):
    """DDP over gloo on the CPU: the test scores are rank 0's alone, over the whole split, equal to one process's."""
    base = {
        "data": {"name": "digits", "test_fraction": 0.1},
        "model": {"name": "mlp", "hidden": 32},
        "train": {"epochs": 2, "batch_size": 64},
        "export": {"formats": []},
        "device": "cpu",
        "seed": 0,
        "deterministic": True,
    }
    one, two = MemorySink(), MemorySink()
    run_training(RunSpec.from_dict(base), tmp_path / "one", one)
    summary = run_training(RunSpec.from_dict(base, ["resources.gpus=2"]), tmp_path / "two", two)
    assert summary["status"] == "completed"
    [event] = [e for e in two.events if e["kind"] == "test"]
    assert event["data"]["samples"] == 179 and sum(event["data"]["support"]) == 179
    assert len(two.series("test/acc")) == 1
    alone = {k: v for _, _, row in one.metric_rows for k, v in row.items() if k.startswith("test/")}
    assert summary["test"] == pytest.approx(alone, rel=1e-4)


def test_a_large_val_fraction_is_fine_with_a_test_folder_and_refused_at_load_when_the_default_is_carved(tmp_path):
    """The imagefolder's default 10 % test share applies only without a test/ folder: the schema cannot know the
    layout, so it accepts val_fraction 0.9 and the load refuses it when the default would be carved."""
    with_test = tmp_path / "with_test"
    for part in ("train", "test"):
        _classes(with_test / part, 6, 0)
    spec = DataSpec(name="imagefolder", path=str(with_test), val_fraction=0.9, image_size=8)
    data = load_data(spec, seed=0)
    assert data.info.test_source == "folder" and len(data.train) >= 2
    plain = tmp_path / "plain"
    _classes(plain, 10, 0)
    with pytest.raises(DataError, match=r"data.val_fraction \(0.9\) \+ data.test_fraction \(0.1\)"):
        load_data(DataSpec(name="imagefolder", path=str(plain), val_fraction=0.9, image_size=8), seed=0)
