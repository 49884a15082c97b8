"""The loop's side of a sweep's pruning: a control's judge is asked after each epoch's checkpoint but the
last, a reason ends the run `pruned`, and a resumed run is asked first about the epoch it resumes after."""

from __future__ import annotations

import pytest
import torch

from core.config import RunSpec
from core.events import MemorySink, StopFlag
from core.train import run_training
from tests.core.test_loop import TINY


@pytest.fixture(autouse=True)
def _one_thread():
    torch.set_num_threads(1)


class Judge(StopFlag):
    """Prunes at `at` with a reason; records every epoch it was asked about."""

    def __init__(self, at: int | None) -> None:
        super().__init__()
        self.at, self.asked = at, []

    def judge_epoch(self, epoch: int) -> str | None:
        self.asked.append(epoch)
        return "val/acc 0.20 below the median 0.80 of 3 completed trials at epoch 2" if epoch == self.at else None


def spec(epochs: int) -> RunSpec:
    return RunSpec.from_dict(TINY, [f"train.epochs={epochs}"])


def test_a_reason_ends_the_run_pruned_after_that_epoch(tmp_path):
    sink, judge = MemorySink(), Judge(at=2)
    summary = run_training(spec(4), tmp_path, sink, control=judge)
    assert summary["status"] == "pruned" and summary["epochs_run"] == 2
    assert judge.asked == [1, 2]
    assert [v for _, v in sink.series("val/acc")] and len(sink.series("val/acc")) == 2
    pruned = [e for e in sink.events if e["data"].get("reason")]
    assert pruned and pruned[0]["message"].startswith("pruned: val/acc 0.20 below the median")
    assert (tmp_path / "checkpoints" / "last.pt").is_file()  # the epoch it was judged on is kept


def test_the_last_epoch_is_never_judged(tmp_path):
    judge = Judge(at=3)
    summary = run_training(spec(3), tmp_path, MemorySink(), control=judge)
    assert summary["status"] == "completed" and judge.asked == [1, 2]


def test_a_resumed_run_is_asked_first_about_the_epoch_it_resumes_after(tmp_path):
    first = StopFlag()

    class StopAfterTwo(MemorySink):
        def metrics(self, step, epoch, values):
            super().metrics(step, epoch, values)
            if "val/acc" in values and epoch == 2:
                first.set()

    run_training(spec(4), tmp_path, StopAfterTwo(), control=first)
    judge = Judge(at=2)  # the verdict stored for epoch 2 before the crash: prune
    resumed = run_training(spec(4), tmp_path, MemorySink(), control=judge, resume=True)
    assert judge.asked == [2] and resumed["status"] == "pruned" and resumed["epochs_run"] == 2
