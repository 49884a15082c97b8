"""The troubleshooting table as events: each finding once, with a code and advice."""

from __future__ import annotations

import pytest

from core.diagnosis import Diagnoser
from core.events import MemorySink
from core.optim import lr_factor
from core.spec_sections import ScheduleSpec


def _epoch(tl, ta, vl, va, wait=0.0):
    return {"train/epoch_loss": tl, "train/acc": ta, "val/loss": vl, "val/acc": va, "data_wait_epoch": wait}


def test_exploding_gradient_named_by_layer_once():
    sink = MemorySink()
    d = Diagnoser(sink)
    for step in (50, 100):
        d.layer_norms(step, {"conv1": 0.5, "conv2": 0.7, "fc1": 5e4, "head": 0.3})
    found = [e for e in sink.events if e["data"]["code"] == "exploding_gradients"]
    assert len(found) == 1 and found[0]["data"]["where"] == "fc1" and "clip" in found[0]["data"]["advice"]


def test_vanishing_gradient_below_1e_10():
    sink = MemorySink()
    Diagnoser(sink).layer_norms(10, {"conv1": 1e-12, "head": 0.2})
    assert [e["data"]["where"] for e in sink.events] == ["conv1"]
    assert sink.events[0]["data"]["code"] == "vanishing_gradients"


def test_healthy_norms_say_nothing():
    sink = MemorySink()
    Diagnoser(sink).layer_norms(10, {"a": 0.1, "b": 2.0, "c": 0.8})
    assert sink.events == []


def test_loss_not_decreasing_after_three_epochs():
    sink = MemorySink()
    d = Diagnoser(sink)
    for e in range(1, 4):
        d.epoch(e, _epoch(2.30, 0.1, 2.30, 0.1), 10 * e)
    assert sink.codes() == ["loss_not_decreasing"]
    assert "label" in sink.events[0]["data"]["advice"]


def test_overfitting_when_gap_keeps_growing():
    sink = MemorySink()
    d = Diagnoser(sink)
    for e, (ta, va, vl) in enumerate([(0.80, 0.78, 0.50), (0.92, 0.79, 0.55), (0.99, 0.78, 0.70)], 1):
        d.epoch(e, _epoch(1.0 / e, ta, vl, va), 10 * e)
    assert "overfitting" in sink.codes()


def test_data_bound_epoch():
    sink = MemorySink()
    Diagnoser(sink).epoch(1, _epoch(1.0, 0.5, 1.0, 0.5, wait=0.8), 10)
    assert sink.codes() == ["data_bound"] and "num_workers" in sink.events[0]["data"]["advice"]


@pytest.mark.parametrize(
    ("name", "checks"),
    [
        ("none", [(0, 1.0), (99, 1.0)]),
        ("step", [(0, 1.0), (19, 1.0), (20, 0.1), (40, 0.01)]),  # step_size 2 epochs × 10 steps
        ("multistep", [(0, 1.0), (30, 0.1), (50, 0.01)]),
        ("cosine", [(0, 1.0), (50, 0.5), (100, 0.0)]),
    ],
)
def test_schedules_closed_form(name, checks):
    spec = ScheduleSpec(name=name, step_size=2, milestones=[3, 5])
    for step, want in checks:
        assert lr_factor(spec, step, 10, 100) == pytest.approx(want, abs=1e-9), (name, step)


def test_warmup_then_cosine_and_onecycle_peak():
    warm = ScheduleSpec(name="cosine", warmup_epochs=1)
    assert lr_factor(warm, 0, 10, 100) == pytest.approx(0.1) and lr_factor(warm, 9, 10, 100) == pytest.approx(1.0)
    one = ScheduleSpec(name="onecycle", pct_start=0.3)
    lrs = [lr_factor(one, s, 10, 100) for s in range(100)]
    assert max(lrs) == pytest.approx(1.0, abs=1e-3) and lrs.index(max(lrs)) in range(29, 31)
    assert lrs[0] < 0.05 and lrs[-1] < 0.01
