"""Unbalanced classes: the training split's class counts at load and the warning past IMBALANCE_RATIO,
train.class_weights in the training loss (exact values; soft targets), train.sampler=balanced (even, seeded,
resumable, sharded), and val/balanced_acc (scikit-learn's value, a monitor and a sweep objective)."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image
from sklearn.metrics import balanced_accuracy_score

from core.balanced import balanced_order
from core.batches import DeviceBatches, HostBatches, Order, make_batches
from core.config import RunSpec, SpecError
from core.criterion import Criterion, build_criterion, class_weights
from core.data import Split, load_data
from core.events import MemorySink, StopFlag
from core.imbalance import IMBALANCE_RATIO, imbalance
from core.scores import balanced_accuracy
from core.spec_sections import LoaderSpec, TrainSpec
from core.train import build_trainer, run_training, seed_everything
from core.trainer import prepare
from sweep.spec import SweepSpec
from tests.core.test_loop import TINY, _stop_after_epoch

CPU = torch.device("cpu")
COUNTS = {"common": 36, "middle": 12, "rare": 6}  # 6× between the largest and the smallest class


@pytest.fixture(autouse=True)
def _one_thread():
    torch.set_num_threads(1)


def _skewed_folder(root: Path, counts: dict[str, int] = COUNTS) -> Path:
    """root/<class>/<i>.png: each class a noisy 8×8 image around its own colour, `counts` images per class."""
    rng = np.random.default_rng(0)
    for k, (name, n) in enumerate(counts.items()):
        (root / name).mkdir(parents=True, exist_ok=True)
        base = np.array([[200, 40, 40], [40, 200, 40], [40, 40, 200]][k % 3], dtype=float)
        for i in range(n):
            pixels = np.clip(base + rng.normal(0, 60, (8, 8, 3)), 0, 255).astype(np.uint8)
            Image.fromarray(pixels, "RGB").save(root / name / f"{i}.png")
    return root


def _folder_spec(root: Path, *overrides: str) -> RunSpec:
    data = {"name": "imagefolder", "path": str(root), "image_size": 8, "val_fraction": 0.25}
    return RunSpec.from_dict({**TINY, "data": data}, list(overrides))


# --- class counts and the warning ---------------------------------------------------------------------------
def test_class_counts_are_the_training_splits(tmp_path):
    spec = _folder_spec(_skewed_folder(tmp_path / "pets"))
    b = load_data(spec.data, spec.seed)
    assert b.info.class_names == ["common", "middle", "rare"]
    counts = torch.bincount(b.train.labels, minlength=3).tolist()
    assert b.info.class_counts == counts and counts[0] > counts[1] > counts[2] > 0
    assert sum(counts) == b.info.num_train < sum(COUNTS.values())  # the training split's, not the whole set's
    assert b.info.to_dict()["class_counts"] == counts  # recorded with the data (event, checkpoints)


def test_the_warning_names_the_classes_for_skewed_data_and_stays_silent_for_balanced(tmp_path):
    sink = MemorySink()
    spec = _folder_spec(_skewed_folder(tmp_path / "pets"), "train.epochs=1")
    big, _, small = load_data(spec.data, spec.seed).info.class_counts
    run_training(spec, tmp_path / "run", sink)
    found = [e for e in sink.events if e["data"].get("code") == "class_imbalance"]
    assert len(found) == 1 and found[0]["level"] == "warning" and found[0]["kind"] == "diagnosis"
    message, data = found[0]["message"], found[0]["data"]
    assert f"'common' has {big} training samples, 'rare' {small} ({round(big / small, 2):g}×)" in message
    assert "train.class_weights" in data["advice"] and "val/balanced_acc" in data["advice"]
    assert data["largest"] == ["common", big] and data["smallest"] == ["rare", small] and data["threshold"] == 3.0
    assert found[0]["step"] == 0

    balanced = MemorySink()
    run_training(RunSpec.from_dict(TINY, ["train.epochs=1"]), tmp_path / "balanced", balanced)
    assert "class_imbalance" not in balanced.codes()


def test_a_run_that_already_corrects_is_told_without_a_warning(tmp_path):
    sink = MemorySink()
    spec = _folder_spec(_skewed_folder(tmp_path / "pets"), "train.epochs=1", "train.sampler=balanced")
    run_training(spec, tmp_path / "run", sink)
    found = [e for e in sink.events if e["data"].get("code") == "class_imbalance"]
    assert found[0]["level"] == "info" and found[0]["message"].endswith("this run uses train.sampler=balanced")


def test_the_threshold_and_a_class_without_samples():
    names = ["a", "b", "c"]
    assert IMBALANCE_RATIO == 3.0
    assert imbalance(names, [30, 11, 20]) == {}  # 2.7×: under the threshold
    found = imbalance(names, [30, 10, 20])  # exactly 3×
    assert found["ratio"] == 3.0 and found["rare_classes"] == []  # b has 1/3, not under it
    found = imbalance(names, [30, 0, 9])
    assert found["ratio"] is None and found["smallest"] == ["b", 0] and found["rare_classes"] == [["b", 0], ["c", 9]]


# --- class weights ------------------------------------------------------------------------------------------
def test_inverse_frequency_weights_and_the_weighted_loss_by_hand():
    w = class_weights([3, 1], "inverse_frequency")
    assert w.tolist() == pytest.approx([4 / 6, 2.0])  # N / (C · n_c)
    assert class_weights([3, 1], "sqrt_inverse_frequency").tolist() == pytest.approx([(4 / 6) ** 0.5, 2**0.5])
    assert class_weights([5, 5, 5], "inverse_frequency").tolist() == [1.0, 1.0, 1.0]
    assert class_weights([3, 1], "none") is None
    logits = torch.tensor([[2.0, 0.0], [1.0, 0.0], [1.0, 1.0]])
    y = torch.tensor([0, 1, 0])
    nll = [math.log(1 + math.exp(-2.0)), math.log(1 + math.exp(1.0)), math.log(2.0)]  # −log p of the true class
    plain = sum(nll) / 3
    # divided by the batch size × the split's mean sample weight ((3 · 4/6 + 1 · 2) / 4 = 1), not by the batch's
    # summed weights: a global batch's loss is the same however it is cut into micro-batches or shards
    weighted = (4 / 6 * nll[0] + 2.0 * nll[1] + 4 / 6 * nll[2]) / 3
    assert Criterion(None, 0.0)(logits, y).item() == pytest.approx(plain, rel=1e-6)
    assert Criterion(w, 0.0)(logits, y).item() == pytest.approx(weighted, rel=1e-6)
    assert weighted > plain  # the rare class's sample, the worst predicted one here, counts three times more


@pytest.mark.parametrize("smoothing", [0.0, 0.2])
@pytest.mark.parametrize("weights", ["none", "inverse_frequency"])
def test_probability_targets_agree_with_class_indices(smoothing, weights):
    """mixup/cutmix's soft targets: a one-hot target is its index, a mix λ·a + (1 − λ)·b the weighted blend."""
    crit = build_criterion(TrainSpec(label_smoothing=smoothing, class_weights=weights), [6, 2, 1, 3], CPU)
    g = torch.Generator().manual_seed(0)
    logits, a, b = torch.randn(8, 4, generator=g), torch.randint(0, 4, (8,), generator=g), torch.arange(8) % 4
    one_hot = torch.nn.functional.one_hot(a, 4).float()
    assert crit(logits, one_hot).item() == pytest.approx(crit(logits, a).item(), rel=1e-6)
    lam = 0.7
    mixed = crit(logits, lam * one_hot + (1 - lam) * torch.nn.functional.one_hot(b, 4).float())
    if weights == "none":  # the plain mean: the blend of the two losses
        assert mixed.item() == pytest.approx(lam * crit(logits, a).item() + (1 - lam) * crit(logits, b).item())
    else:  # Σ w·t'·(−log p) / (N · mean sample weight, 1 for inverse frequency), written out
        w, logp = crit.weight, logits.log_softmax(1)
        t = lam * one_hot + (1 - lam) * torch.nn.functional.one_hot(b, 4).float()
        smoothed = t * (1 - smoothing) + smoothing / 4
        assert mixed.item() == pytest.approx(((-logp * smoothed * w).sum() / len(t)).item(), rel=1e-6)


def test_a_run_with_class_weights_logs_the_weighted_loss_of_its_first_batch(tmp_path):
    spec = _folder_spec(
        _skewed_folder(tmp_path / "pets"), "train.class_weights=inverse_frequency", "train.steps_per_epoch=1"
    )
    seed_everything(spec.seed, spec.deterministic)
    t = build_trainer(spec, tmp_path / "probe", MemorySink(), StopFlag(), CPU)
    t.train_batches.set_epoch(1)
    x, y = next(iter(t.train_batches))
    t.model.train()
    logp = t.model(prepare(t.pre_train, x)).log_softmax(1).gather(1, y[:, None]).flatten()
    n = torch.bincount(t.data.train.labels, minlength=3).float()
    w = (n.sum() / (3 * n))[y]  # N / (C · n_c)
    expected = (-(logp * w).sum() / len(y)).item()  # inverse frequency: the split's mean sample weight is 1
    sink = MemorySink()
    run_training(spec, tmp_path / "run", sink)
    first = sink.series("train/loss")[0][1]
    assert first == pytest.approx(expected, rel=1e-5)
    assert first != pytest.approx((-logp.mean()).item(), rel=1e-3)  # not the unweighted mean
    assert sink.series("val/loss")  # validation is measured unweighted, beside it


# --- the balanced sampler -----------------------------------------------------------------------------------
def test_balanced_order_draws_every_class_equally_often():
    labels = torch.tensor([0] * 90 + [1] * 7 + [2] * 3)
    order = balanced_order(labels, torch.Generator().manual_seed(1))
    assert len(order) == 100
    drawn = torch.bincount(labels[order], minlength=3).tolist()
    assert sorted(drawn) == [33, 33, 34]
    uses = torch.bincount(order, minlength=100)
    assert set(uses[90:97].tolist()) <= {4, 5} and set(uses[97:].tolist()) <= {11, 12}  # rare samples repeat evenly
    assert uses[:90].max() == 1  # the common class: a subset, no sample twice


def test_the_balanced_order_is_seeded_by_seed_and_epoch_alone():
    split = Split(torch.zeros(40, 1, 2, 2, dtype=torch.uint8), torch.tensor([0] * 34 + [1] * 6))
    order = Order(batch_size=8, shuffle=True, device=CPU, seed=3, balanced=True)

    def epoch(k: int, batches=None) -> list[list[int]]:
        b = batches or DeviceBatches(split, order)
        b.set_epoch(k)
        return [y.tolist() for _, y in b]

    assert epoch(2) == epoch(2, DeviceBatches(split, order))  # a resumed run draws epoch 2's batches again
    assert epoch(2) != epoch(3)
    every = [c for batch in epoch(2) for c in batch]
    assert every.count(0) == every.count(1) == 20
    host = HostBatches(split, order, LoaderSpec(num_workers=0))
    host.set_epoch(5)
    first = [y.tolist() for _, y in host]
    host.set_epoch(5)
    assert [y.tolist() for _, y in host] == first and sum(map(len, first)) == 40
    assert sum(c == 1 for batch in first for c in batch) == 20


@pytest.mark.parametrize("host", [False, True], ids=["device", "host"])
def test_ranks_take_shards_of_one_balanced_order(host):
    """Several processes: rank r's batch k and the other ranks' batch k together are one global batch, the
    single process's batch k when the split is held on the device."""
    split = Split(torch.arange(30, dtype=torch.uint8).view(30, 1, 1, 1), torch.tensor([0] * 24 + [1] * 6))
    loader = LoaderSpec(num_workers=0, device_cache_mb=0 if host else 1024)

    def batches(rank: int, world: int) -> list[list[int]]:
        b = make_batches(split, 8 // world, True, CPU, 7, loader, rank, world, balanced=True)
        b.set_epoch(1)
        return [x.flatten().tolist() for x, _ in b]

    ranks = [batches(0, 2), batches(1, 2)]
    assert len(ranks[0]) == len(ranks[1]) == 4
    union = [sorted(a + b) for a, b in zip(*ranks, strict=True)]
    samples = [i for batch in union for i in batch]
    assert len(samples) == 30 and sum(i >= 24 for i in samples) == 15  # one balanced epoch between them
    if not host:
        assert union == [sorted(b) for b in batches(0, 1)]


def test_a_balanced_run_resumes_exactly(tmp_path):
    root = _skewed_folder(tmp_path / "pets")
    over = ("train.sampler=balanced", "train.epochs=3", "data.augment.hflip=true")
    full = MemorySink()
    run_training(_folder_spec(root, *over), tmp_path / "full", full)
    part, flag = MemorySink(), StopFlag()
    _stop_after_epoch(1, part, flag)
    first = run_training(_folder_spec(root, *over), tmp_path / "part", part, control=flag)
    assert first["status"] == "cancelled"
    rest = MemorySink()
    run_training(_folder_spec(root, *over), tmp_path / "part", rest, resume=True)
    assert rest.series("train/loss") == [(s, v) for s, v in full.series("train/loss") if s > first["global_step"]]
    t = build_trainer(_folder_spec(root, *over), tmp_path / "probe", MemorySink(), StopFlag(), CPU)
    t.train_batches.set_epoch(2)
    drawn = torch.bincount(torch.cat([y for _, y in t.train_batches]), minlength=3).tolist()
    assert max(drawn) - min(drawn) <= 1  # the run's batches draw the classes evenly


def test_sampler_and_class_weights_together_are_refused_by_name():
    with pytest.raises(SpecError, match="train.sampler=balanced and train.class_weights=inverse_frequency"):
        RunSpec.from_dict(TINY, ["train.sampler=balanced", "train.class_weights=inverse_frequency"])
    with pytest.raises(SpecError, match="train.class_weights"):
        RunSpec.from_dict(TINY, ["train.class_weights=inverse"])


# --- val/balanced_acc ---------------------------------------------------------------------------------------
def test_balanced_accuracy_of_a_known_confusion():
    # rows: true class; 90 of class 0 all right, 10 of class 1 of which 2 right
    assert balanced_accuracy([90, 2], [90, 10]) == pytest.approx((1.0 + 0.2) / 2)
    assert balanced_accuracy([90, 0], [90, 10]) == 0.5  # "always class 0": 90% accuracy, 50% balanced
    assert balanced_accuracy([3, 0, 1], [4, 0, 2]) == pytest.approx((0.75 + 0.5) / 2)  # absent class left out


@pytest.mark.parametrize("seed", range(3))
def test_balanced_accuracy_is_scikit_learns(seed):
    rng = np.random.default_rng(seed)
    truth = rng.integers(0, 4, 80)
    pred = np.where(rng.random(80) < 0.5, truth, rng.integers(0, 5, 80))  # class 4 predicted, never true
    cm = np.zeros((5, 5), dtype=int)
    np.add.at(cm, (truth, pred), 1)
    with pytest.warns(UserWarning, match="y_pred contains classes not in y_true"):
        want = balanced_accuracy_score(truth, pred)
    assert balanced_accuracy(np.diag(cm).tolist(), cm.sum(1).tolist()) == pytest.approx(want)


def test_val_balanced_acc_is_measured_each_epoch_and_drives_early_stopping(tmp_path):
    spec = RunSpec.from_dict(TINY, ["train.epochs=3", "train.early_stopping.monitor=val/balanced_acc"])
    assert spec.train.early_stopping.resolved_mode == "max"
    sink = MemorySink()
    summary = run_training(spec, tmp_path, sink)
    epochs = [values for _, _, values in sink.metric_rows if "val/loss" in values]
    evaluations = [e["data"] for e in sink.events if e["data"].get("code") == "evaluation"]
    for values, ev in zip(epochs, evaluations, strict=True):
        recalls = [r for r, s in zip(ev["recall"], ev["support"], strict=True) if s]
        assert values["val/balanced_acc"] == pytest.approx(sum(recalls) / len(recalls), abs=1e-3)
    values = [v["val/balanced_acc"] for v in epochs]
    best = max(range(len(values)), key=lambda i: (values[i], -i))
    assert summary["best"] == {"metric": "val/balanced_acc", "value": values[best], "epoch": best + 1}


def test_val_balanced_acc_is_a_sweep_objective_higher_is_better():
    base = RunSpec.from_dict(TINY)
    spec = SweepSpec.from_yaml(
        "space: {optim.lr: {choice: [0.1, 0.01]}}\nobjective: {metric: val/balanced_acc}", base=base
    )
    assert (spec.metric, spec.mode, spec.stored_metric) == ("val/balanced_acc", "max", "val/balanced_acc")


def test_the_new_run_pages_preflight_reports_unbalanced_classes(tmp_path):
    from worker.preflight import run

    spec_path = tmp_path / "spec.yaml"
    spec_path.write_text(_folder_spec(_skewed_folder(tmp_path / "pets")).to_yaml())
    result = run(spec_path, tmp_path / "out")
    assert result["ok"] and result["imbalance"]["largest"][0] == "common" and not result["imbalance"]["corrected"]
    assert result["imbalance"]["message"].startswith("unbalanced classes: 'common' has")
    spec_path.write_text(RunSpec.from_dict(TINY).to_yaml())
    assert "imbalance" not in run(spec_path, tmp_path / "out2")


def test_a_weighted_global_batch_has_the_same_loss_however_it_is_cut():
    """Two halves' losses (accumulation, or two ranks' shards) average to the whole batch's loss."""
    crit = build_criterion(TrainSpec(class_weights="sqrt_inverse_frequency"), [9, 1, 2], CPU)
    g = torch.Generator().manual_seed(1)
    logits, y = torch.randn(8, 3, generator=g), torch.tensor([0, 0, 0, 0, 0, 0, 1, 2])  # the rare ones in one half
    halves = (crit(logits[:4], y[:4]) + crit(logits[4:], y[4:])) / 2
    assert halves.item() == pytest.approx(crit(logits, y).item(), rel=1e-6)
