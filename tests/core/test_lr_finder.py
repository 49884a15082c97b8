"""The pre-flight LR range test (train.lr_finder): a sane suggestion on an easy problem, the run's model,
optimizer, batches and random streams untouched (a run trains identically with and without it), its curve
stored as an artifact and an event, and its spec checked."""

from __future__ import annotations

import json
import math
import random

import numpy as np
import pytest
import torch

from core.checkpoint import load_checkpoint
from core.config import RunSpec, SpecError
from core.events import MemorySink, NeverStop
from core.lr_finder import STOP_FACTOR, learning_rates, lr_range_test, smooth, suggest
from core.train import build_trainer, run_training, seed_everything
from tests.core.test_loop import TINY

CPU = torch.device("cpu")
FINDER = ["train.lr_finder.enabled=true", "train.lr_finder.steps=60"]


@pytest.fixture(autouse=True)
def _one_thread():
    torch.set_num_threads(1)


def _spec(*overrides: str) -> RunSpec:
    return RunSpec.from_dict(TINY, [*FINDER, *overrides])


def test_the_suggestion_is_a_tenth_of_the_lowest_smoothed_loss():
    lrs = learning_rates(1e-6, 1.0, 61)
    assert lrs[0] == pytest.approx(1e-6) and lrs[-1] == pytest.approx(1.0) and lrs[30] == pytest.approx(1e-3)
    # a loss falling until lr 1e-2 and exploding after it
    curve = [2.0 - 1.5 * min(1.0, max(0.0, (math.log10(lr) + 5) / 3)) + 40 * max(0.0, lr - 1e-2) for lr in lrs]
    found = suggest(lrs, smooth(curve, 0.0))  # unsmoothed: the exact minimum
    assert found["min_loss_lr"] == pytest.approx(1e-2) and found["suggested_lr"] == pytest.approx(1e-3)
    assert 1e-5 < found["steepest_lr"] < 1e-2
    assert suggest(lrs, smooth([1.0] * 61))["suggested_lr"] is None  # a flat curve suggests nothing


def test_the_smoothing_is_a_bias_corrected_moving_average():
    assert smooth([3.0, 3.0, 3.0]) == pytest.approx([3.0, 3.0, 3.0])
    assert smooth([1.0, 2.0], 0.5) == pytest.approx([1.0, (0.5 * 0.5 + 0.5 * 2.0) / (1 - 0.5**2)])


def test_an_easy_problem_gets_a_sane_learning_rate():
    spec = _spec("data.num_samples=192", "optim.name=adam")
    seed_everything(spec.seed, spec.deterministic)
    t = build_trainer(spec, None, MemorySink(), NeverStop(), CPU)
    result = lr_range_test(t)
    assert len(result["lrs"]) == len(result["losses"]) == len(result["smoothed"]) <= 60
    assert result["lrs"][0] == pytest.approx(1e-7)
    assert 1e-4 <= result["suggested_lr"] <= 1.0  # Adam on a small CNN: around 1e-3 to 1e-1
    assert result["suggested_lr"] == pytest.approx(result["min_loss_lr"] / 10)
    assert min(result["smoothed"]) < 0.8 * result["smoothed"][0]  # it learned on the way
    if result["stopped"] == "diverged":  # stopped once the loss blew up past the factor
        assert result["smoothed"][-1] > STOP_FACTOR * min(result["smoothed"]) * 0.99


def _snapshot(t) -> dict:
    return {
        "model": {k: v.clone() for k, v in t.model.state_dict().items()},
        "optimizer": json.dumps(t.optimizer.state_dict()["param_groups"], default=str),
        "state": len(t.optimizer.state),
        "grads": [p.grad for p in t.model.parameters()],
        "requires_grad": [p.requires_grad for p in t.model.parameters()],
        "training": t.model.training,
        "epoch": t.train_batches.epoch,
        "torch": torch.get_rng_state().clone(),
        "numpy": np.random.get_state()[1].copy(),
        "python": random.getstate(),
    }


def test_the_runs_model_optimizer_and_random_streams_are_untouched():
    spec = _spec("model.dropout=0.3", "data.augment.hflip=true")
    seed_everything(spec.seed, spec.deterministic)
    t = build_trainer(spec, None, MemorySink(), NeverStop(), CPU)
    t.model.eval()
    before = _snapshot(t)
    result = lr_range_test(t)
    after = _snapshot(t)
    assert len(result["losses"]) > 10
    for k in before["model"]:
        assert torch.equal(before["model"][k], after["model"][k]), k
    assert before["optimizer"] == after["optimizer"] and after["state"] == 0  # no step taken, rates as built
    assert after["grads"] == [None] * len(after["grads"])
    assert before["requires_grad"] == after["requires_grad"] and after["training"] is False
    assert after["epoch"] == before["epoch"]
    assert torch.equal(before["torch"], after["torch"])
    assert (before["numpy"] == after["numpy"]).all() and before["python"] == after["python"]


def test_a_run_trains_identically_with_and_without_it(tmp_path):
    over = ("model.dropout=0.3", "data.augment.hflip=true", "data.augment.random_crop=true")
    plain, tested = MemorySink(), MemorySink()
    a = run_training(RunSpec.from_dict(TINY, list(over)), tmp_path / "plain", plain)
    b = run_training(_spec(*over), tmp_path / "tested", tested)
    assert a["status"] == b["status"] == "completed"
    assert "lr_finder" in tested.codes() and "lr_finder" not in plain.codes()
    assert plain.series("train/loss") == tested.series("train/loss")
    assert plain.series("val/loss") == tested.series("val/loss")
    last = [load_checkpoint(p / "checkpoints" / "last.pt")["model"] for p in (tmp_path / "plain", tmp_path / "tested")]
    assert all(torch.equal(last[0][k], last[1][k]) for k in last[0])


def test_the_curve_is_stored_and_the_suggestion_sent_before_training(tmp_path):
    sink = MemorySink()
    run_training(_spec("train.epochs=1"), tmp_path, sink)
    events = [e for e in sink.events if e["data"].get("code") == "lr_finder"]
    assert len(events) == 1 and events[0]["kind"] == "preflight" and events[0]["step"] == 0
    data = events[0]["data"]
    assert events[0]["level"] == "info" and f"suggested optim.lr {data['suggested_lr']:.2g}" in events[0]["message"]
    assert "this run uses 0.001" in events[0]["message"] and data["optim_lr"] == 1e-3
    assert data["method"].startswith("a tenth of the learning rate")
    started = sink.codes().index("started")
    assert sink.codes().index("lr_finder") < started  # pre-flight: before the first step
    (artifact,) = [a for a in sink.artifacts if a["kind"] == "lr_finder"]
    stored = json.loads((tmp_path / "lr_finder.json").read_text())
    assert artifact["path"] == str(tmp_path / "lr_finder.json") and stored["lrs"] == data["lrs"]
    assert stored["suggested_lr"] == data["suggested_lr"] == artifact["meta"]["suggested_lr"]


def test_a_loss_that_cannot_fall_suggests_nothing_and_says_so(tmp_path):
    sink = MemorySink()  # rates far too small to move the loss
    run_training(
        _spec("train.epochs=1", "train.lr_finder.start_lr=1e-9", "train.lr_finder.end_lr=1e-8"), tmp_path, sink
    )
    (event,) = [e for e in sink.events if e["data"].get("code") == "lr_finder"]
    assert event["level"] == "warning" and event["data"]["suggested_lr"] is None
    assert "no learning rate suggested" in event["message"]


def test_the_range_must_rise_and_is_refused_by_name():
    with pytest.raises(SpecError, match="train.lr_finder.end_lr .* must be above train.lr_finder.start_lr"):
        _spec("train.lr_finder.start_lr=0.1", "train.lr_finder.end_lr=0.01")
    with pytest.raises(SpecError, match="train.lr_finder.steps"):
        _spec("train.lr_finder.steps=3")
    assert RunSpec.from_dict(TINY).train.lr_finder.enabled is False  # off unless asked


@pytest.mark.timeout(300)
def test_on_two_processes_rank_0_tests_alone_and_a_balanced_run_matches_one_process(tmp_path):
    """resources.gpus=2 (gloo on the CPU): the test runs on rank 0 with the global batch while the other rank
    waits (no collective of the run is called), and train.sampler=balanced shards one order between the ranks."""
    from tests.core.test_ddp import BASE, assert_same_curve, rank_processes, wait_until

    over = [*FINDER, "train.sampler=balanced", "data.limit=400", "train.epochs=1", "train.lr_finder.steps=20"]
    runs = []
    for gpus in (1, 2):
        sink = MemorySink()
        s = run_training(RunSpec.from_dict(BASE, [*over, f"resources.gpus={gpus}"]), tmp_path / str(gpus), sink)
        assert s["status"] == "completed", s["error"]
        runs.append(sink)
    finder = [next(e["data"] for e in sink.events if e["data"].get("code") == "lr_finder") for sink in runs]
    assert finder[1]["losses"] == pytest.approx(finder[0]["losses"], rel=1e-4)
    for key in ("train/loss", "val/loss"):
        assert_same_curve(runs[0].series(key), runs[1].series(key))
    assert wait_until(lambda: not rank_processes(), 30)
