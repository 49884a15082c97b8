"""One run on two processes (DistributedDataParallel over gloo on the CPU) computes what one process computes
with the same global batch; only rank 0 writes; cancel, resume and a lost rank behave."""

from __future__ import annotations

import time
from pathlib import Path

import psutil
import pytest
import torch

from core.config import RunSpec
from core.distributed import RankLost
from core.events import MemorySink, NeverStop
from core.train import run_training

pytestmark = pytest.mark.timeout(300)

BASE = {
    "data": {"name": "digits"},  # 1,438 train (a last batch of 30), 359 validation samples (odd)
    "model": {"name": "mlp", "hidden": 32},
    "train": {"epochs": 2, "batch_size": 64, "log_every": 1, "diag_every": 5},
    "export": {"formats": []},
    "device": "cpu",
    "seed": 0,
    "deterministic": True,
}
STEPS_PER_EPOCH = 23
REL = 1e-5


def spec(*overrides: str) -> RunSpec:
    return RunSpec.from_dict(BASE, list(overrides))


def rank_processes() -> list[psutil.Process]:
    """This test process's spawned children (the run's ranks 1..N-1)."""
    out = []
    for p in psutil.Process().children(recursive=True):
        try:
            if "spawn_main" in " ".join(p.cmdline()):
                out.append(p)
        except psutil.Error:
            continue
    return out


def wait_until(condition, within_s: float = 60.0) -> bool:
    deadline = time.monotonic() + within_s
    while time.monotonic() < deadline:
        if condition():
            return True
        time.sleep(0.05)
    return condition()


def files(root: Path) -> set[str]:
    return {str(p.relative_to(root)) for p in root.rglob("*") if p.is_file()}


def curve(sink: MemorySink, key: str) -> list[tuple[int, float]]:
    return sink.series(key)


def assert_same_curve(a: list[tuple[int, float]], b: list[tuple[int, float]]) -> None:
    assert [s for s, _ in a] == [s for s, _ in b]
    assert [v for _, v in b] == pytest.approx([v for _, v in a], rel=REL)


@pytest.fixture(autouse=True)
def _one_thread():
    torch.set_num_threads(1)
    yield
    assert wait_until(lambda: not rank_processes(), 30), "rank processes were left behind"


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    """The same run on one process (batch 64) and on two (32 per rank)."""
    torch.set_num_threads(1)
    out = {}
    for gpus in (1, 2):
        d = tmp_path_factory.mktemp(f"gpus{gpus}")
        sink = MemorySink()
        out[gpus] = (run_training(spec(f"resources.gpus={gpus}"), d, sink), sink, d)
    return out


def test_two_processes_match_one_process_step_by_step(pair):
    (s1, m1, _), (s2, m2, _) = pair[1], pair[2]
    assert s1["status"] == s2["status"] == "completed"
    assert s2["global_step"] == s1["global_step"] == 2 * STEPS_PER_EPOCH
    assert_same_curve(curve(m1, "train/loss"), curve(m2, "train/loss"))
    for key in ("grad_norm", "train/epoch_loss", "train/acc", "lr"):
        assert_same_curve(curve(m1, key), curve(m2, key))
    assert s2["best"]["value"] == pytest.approx(s1["best"]["value"], rel=REL)


def test_validation_is_reduced_over_the_whole_split_not_rank_0s_shard(pair):
    """359 validation samples: 180 on rank 0, 179 on rank 1; loss, accuracy, per-class accuracy, top-5 and the
    confusion matrix are sums over both shards, equal to the single process's."""
    (_, m1, _), (_, m2, _) = pair[1], pair[2]
    keys = {k for _, _, v in m1.metric_rows for k in v if k.startswith("val/")}
    assert {"val/loss", "val/acc", "val/acc_top5", "val/acc_class/0"} <= keys
    for key in sorted(keys):
        assert_same_curve(curve(m1, key), curve(m2, key))
    ev1 = [e["data"] for e in m1.events if e["kind"] == "evaluation"]
    ev2 = [e["data"] for e in m2.events if e["kind"] == "evaluation"]
    assert [e["confusion"] for e in ev2] == [e["confusion"] for e in ev1]
    assert sum(map(sum, ev2[-1]["confusion"])) == 359
    gallery = [a for a in m2.artifacts if a["kind"] == "misclassified"]
    assert [a["meta"]["items"] for a in gallery] == [
        a["meta"]["items"] for a in m1.artifacts if a["kind"] == "misclassified"
    ]


def test_only_rank_0_writes(pair):
    """Each metric point once per step, the same events as one process plus the distributed one, and the
    run folder holds exactly the files of a single-process run."""
    (_, m1, d1), (_, m2, d2) = pair[1], pair[2]
    steps = [s for s, _ in curve(m2, "train/loss")]
    assert steps == list(range(1, 2 * STEPS_PER_EPOCH + 1))
    assert len(m2.metric_rows) == len(m1.metric_rows)
    assert files(d2) == files(d1)
    assert {"spec.yaml", "summary.json", "samples.png", "checkpoints/last.pt", "checkpoints/best.pt"} <= files(d2)
    assert [c for c in m2.codes() if c != "distributed"] == m1.codes()
    assert "ranks_terminated" not in m2.codes()  # rank 1 left by itself


def test_the_distributed_event_says_the_batch_per_rank_and_in_total(pair):
    (_, m2, _) = pair[2]
    (ev,) = [e for e in m2.events if e["kind"] == "distributed"]
    assert ev["data"] == {
        "code": "distributed",
        "world_size": 2,
        "backend": "gloo",
        "per_rank_batch": 32,
        "global_batch": 64,
        "accumulate": 1,
        "lr": 1e-3,
        "device": "cpu",
        "threads_per_rank": 1,
    }
    assert "32 per rank × 2 = 64 total" in ev["message"]
    assert not [e for e in pair[1][1].events if e["kind"] == "distributed"]


class StopAfter:
    """Says stop on its k-th question (the loop asks once per optimizer step and once per epoch end)."""

    def __init__(self, k: int):
        self.k, self.calls = k, 0

    def should_stop(self) -> bool:
        self.calls += 1
        return self.calls >= self.k


def test_cancel_stops_every_rank_at_the_same_step_then_resume_is_exact(pair, tmp_path):
    (_, m_full, _) = pair[2]
    cancelled = MemorySink()
    # questions 1..23 are epoch 1's steps, 24 its end, 25.. epoch 2's steps: stop after step 27
    s = run_training(spec("resources.gpus=2"), tmp_path, cancelled, StopAfter(28))
    assert s["status"] == "cancelled" and s["global_step"] == 27
    assert "ranks_terminated" not in cancelled.codes()  # rank 1 stopped by itself, at the same step
    assert wait_until(lambda: not rank_processes(), 30)
    resumed = MemorySink()
    s = run_training(spec("resources.gpus=2"), tmp_path, resumed, NeverStop(), resume=True)
    assert s["status"] == "completed" and "resumed" in resumed.codes()
    tail = [(step, v) for step, v in curve(m_full, "train/loss") if step > STEPS_PER_EPOCH]
    assert_same_curve(tail, curve(resumed, "train/loss"))
    assert_same_curve(curve(m_full, "val/loss")[1:], curve(resumed, "val/loss"))
    assert_same_curve(curve(m_full, "val/acc")[1:], curve(resumed, "val/acc"))


class KillRank1:
    """Kills the run's other process with SIGKILL when asked for the 3rd time (after step 3)."""

    def __init__(self):
        self.calls, self.killed = 0, []

    def should_stop(self) -> bool:
        self.calls += 1
        if self.calls == 3:
            for p in rank_processes():
                self.killed.append(p.pid)
                p.kill()
        return False


def test_a_killed_rank_raises_rank_lost_within_bounded_time(tmp_path):
    control = KillRank1()
    t0 = time.monotonic()
    with pytest.raises(RankLost) as info:
        run_training(spec("resources.gpus=2", "train.epochs=5"), tmp_path, MemorySink(), control)
    assert time.monotonic() - t0 < 120
    assert control.killed, "rank 1 was never seen"
    assert info.value.rank == 1 and info.value.exitcode == -9
    assert not (tmp_path / "summary.json").exists()  # not a failed run: it is to be resumed
    assert wait_until(lambda: not rank_processes(), 30)


def test_accumulation_and_the_dataloader_path_match_one_process(tmp_path):
    """accumulate=2 (no_sync on the first micro-step), clipping, the DataLoader path (device cache off), and
    801 train samples at batch 32: the last global batch holds 1 sample, so rank 1's share of it is empty."""
    overrides = (
        "data.limit=1001",
        "train.batch_size=32",
        "train.accumulate=2",
        "loader.device_cache_mb=0",
        "train.epochs=2",
    )
    runs = []
    for gpus in (1, 2):
        sink = MemorySink()
        s = run_training(spec(*overrides, f"resources.gpus={gpus}"), tmp_path / str(gpus), sink)
        assert s["status"] == "completed"
        runs.append(sink)
    for key in ("train/loss", "grad_norm", "train/epoch_loss", "train/acc", "val/loss", "val/acc"):
        assert_same_curve(curve(runs[0], key), curve(runs[1], key))
    assert len(curve(runs[1], "train/loss")) == 2 * 13  # 26 micro-batches an epoch, an optimizer step per two


class PruneAt(NeverStop):
    """A sweep's pruner (on rank 0 only) that prunes the trial after epoch `at`."""

    def __init__(self, at: int):
        self.at, self.asked = at, []

    def judge_epoch(self, epoch: int) -> str | None:
        self.asked.append(epoch)
        return "trailing the median" if epoch == self.at else None


@pytest.mark.parametrize("case", ["pruned", "early_stopped"])
def test_pruning_and_early_stopping_end_every_rank_after_the_same_epoch(tmp_path, case):
    """Rank 0's verdict is broadcast: the run ends after epoch 1 (pruned) or 2 (early stopped, patience 1 and
    an improvement threshold no epoch meets), and rank 1 leaves by itself (no rank is terminated)."""
    control = PruneAt(1) if case == "pruned" else NeverStop()
    overrides = [
        "resources.gpus=2",
        "train.epochs=4",
        "train.early_stopping.patience=1",
        "train.early_stopping.min_delta=100",
    ]
    sink = MemorySink()
    s = run_training(spec(*overrides), tmp_path, sink, control)
    epochs = 1 if case == "pruned" else 2
    assert s["status"] == case and s["epochs_run"] == epochs and s["global_step"] == epochs * STEPS_PER_EPOCH
    assert "ranks_terminated" not in sink.codes()
    if case == "pruned":
        assert control.asked == [1]


def test_divergence_ends_every_rank_at_the_same_step(tmp_path):
    """All ranks check the same combined loss, so they all stop at step 2; the run ends diverged, not lost."""
    sink = MemorySink()
    s = run_training(
        spec("resources.gpus=2", "optim.name=sgd", "optim.lr=1000", "train.grad_clip.mode=none"), tmp_path, sink
    )
    assert s["status"] == "diverged" and s["global_step"] == 2
    assert "non_finite_loss" in sink.codes()


def test_progressive_unfreezing_rebuilds_ddp_and_still_matches_one_process(pair, tmp_path):
    """From a checkpoint, head only in epoch 1, the whole model from epoch 2: DDP is rebuilt for the newly trained
    layers (else their gradients would not be averaged and the ranks would drift apart)."""
    weights = pair[1][2] / "checkpoints" / "best.pt"
    overrides = (f"model.weights_file={weights}", "model.transfer=feature_extract", "model.unfreeze_at_epoch=2")
    runs = []
    for gpus in (1, 2):
        sink = MemorySink()
        s = run_training(spec(*overrides, f"resources.gpus={gpus}"), tmp_path / str(gpus), sink)
        assert s["status"] == "completed" and "unfreeze" in sink.codes()
        runs.append(sink)
    for key in ("train/loss", "grad_norm", "val/loss", "val/acc"):
        assert_same_curve(curve(runs[0], key), curve(runs[1], key))
