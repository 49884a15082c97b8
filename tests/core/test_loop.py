"""The training loop: exact values, step order, accumulation, early stopping, resume, divergence, cancel."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch

from core.checkpoint import EarlyStopping, load_checkpoint
from core.config import RunSpec
from core.engine import train_one_epoch
from core.events import MemorySink, NeverStop, StopFlag
from core.train import build_trainer, run_training, seed_everything

TINY = {
    "data": {"name": "synthetic", "num_classes": 3, "num_samples": 96, "size": 8, "channels": 1},
    "model": {"name": "simple_cnn", "hidden": 16},
    "train": {"epochs": 2, "batch_size": 16, "log_every": 1, "diag_every": 2},
    "export": {"formats": []},
    "device": "cpu",
    "seed": 0,
    "deterministic": True,
}


def tiny(*overrides: str) -> RunSpec:
    return RunSpec.from_dict(TINY, list(overrides))


@pytest.fixture(autouse=True)
def _one_thread():
    torch.set_num_threads(1)


def test_exact_loss_regression(tmp_path):
    """Pinned per-step losses of a tiny seeded run: any change to data, init, order or maths shows here."""
    sink = MemorySink()
    summary = run_training(tiny(), tmp_path, sink)
    assert summary["status"] == "completed"
    losses = [v for _, v in sink.series("train/loss")]
    assert losses == pytest.approx(
        [1.1335217, 1.1391544, 1.0692283, 1.0665864, 1.0683430, 1.0559490, 1.0528111, 1.0453899, 1.0331004, 1.0202916],
        rel=1e-5,
    )
    assert summary["best"] == {"metric": "val/loss", "value": pytest.approx(1.0181226, rel=1e-5), "epoch": 2}


def test_metrics_cover_steps_layers_and_epochs(tmp_path):
    sink = MemorySink()
    run_training(tiny("data.num_classes=7", "data.num_samples=140"), tmp_path, sink)
    keys = {k for _, _, v in sink.metric_rows for k in v}
    for k in (
        "train/loss",
        "lr",
        "grad_norm",
        "throughput",
        "data_wait",
        "train/acc",
        "val/loss",
        "val/acc",
        "val/acc_top5",
        "epoch_time_s",
        "mem/peak_mb",
        "grad_norm/conv1",
        "grad_norm/head",
        "update_ratio/fc1",
        "val/acc_class/class_6",
    ):
        assert k in keys, k
    evals = [e for e in sink.events if e["kind"] == "evaluation"]
    assert len(evals) == 2
    cm = evals[-1]["data"]["confusion"]
    assert len(cm) == 7 and sum(map(sum, cm)) == 28  # every validation sample counted once
    assert all(0.0 <= v <= 1.0 for v in evals[-1]["data"]["per_class_acc"])
    assert sink.progress_calls[-1] == (sink.metric_rows[-1][0], sink.progress_calls[-1][1])


def test_amp_step_order_scale_backward_unscale_clip_step_update_zero(tmp_path, monkeypatch):
    """The order that torchvision's reference script once got wrong: clip must see unscaled gradients."""
    spec = tiny("train.precision=bf16", "train.steps_per_epoch=1", "train.log_every=1")
    t = build_trainer(spec, tmp_path, MemorySink(), NeverStop(), torch.device("cpu"))
    calls: list[str] = []
    scaler = torch.amp.GradScaler("cpu", enabled=True, init_scale=2.0**16)
    t.amp.scaler = scaler

    def spy(name, fn):
        def wrapper(*a, **k):
            calls.append(name)
            return fn(*a, **k)

        return wrapper

    for name in ("scale", "unscale_", "step", "update"):
        monkeypatch.setattr(scaler, name, spy(name, getattr(scaler, name)))
    seen_norms = []
    real_clip = torch.nn.utils.clip_grad_norm_

    def clip(params, max_norm, *a, **k):
        calls.append("clip")
        n = real_clip(params, max_norm, *a, **k)
        seen_norms.append(float(n))
        return n

    monkeypatch.setattr(torch.nn.utils, "clip_grad_norm_", clip)
    monkeypatch.setattr(t.optimizer, "zero_grad", spy("zero_grad", t.optimizer.zero_grad))
    t.model.net.fc2.register_full_backward_hook(lambda *a: calls.append("backward"))
    train_one_epoch(t, 1)
    assert calls == ["scale", "backward", "unscale_", "clip", "step", "update", "zero_grad"]
    assert seen_norms[0] < 100, "clip saw scaled gradients (×65536)"
    assert all(p.grad is None for p in t.model.parameters()), "gradients are zeroed (set_to_none) after the step"


def test_accumulation_equals_one_big_batch(tmp_path):
    """2 micro-batches of 8 with accumulate=2 give the same update as one batch of 16."""
    states = []
    for bs, acc in ((16, 1), (8, 2)):
        spec = tiny(
            f"train.batch_size={bs}",
            f"train.accumulate={acc}",
            "train.steps_per_epoch=1",
            "optim.name=sgd",
            "optim.lr=0.5",
            "optim.momentum=0.0",
        )
        seed_everything(0, True)  # same initial weights for both
        t = build_trainer(spec, tmp_path / str(bs), MemorySink(), NeverStop(), torch.device("cpu"))
        train_one_epoch(t, 1)
        assert t.global_step == 1
        states.append({k: v.clone() for k, v in t.model.state_dict().items()})
    for k in states[0]:
        torch.testing.assert_close(states[0][k], states[1][k], rtol=1e-5, atol=1e-6)


def test_early_stopping_keeps_and_restores_best(tmp_path):
    es = EarlyStopping("max", patience=2, min_delta=0.01)
    assert es.update(0.5, 1) and not es.update(0.505, 2) and not es.should_stop
    assert not es.update(0.4, 3) and es.should_stop and es.best_epoch == 1
    # Integration: nothing can improve by 10 → stops after `patience` epochs, best is epoch 1.
    sink = MemorySink()
    summary = run_training(
        tiny("train.epochs=6", "train.early_stopping.patience=2", "train.early_stopping.min_delta=10"), tmp_path, sink
    )
    assert summary["status"] == "early_stopped" and summary["epochs_run"] == 3
    assert summary["best"]["epoch"] == 1
    assert load_checkpoint(tmp_path / "checkpoints" / "best.pt")["epoch"] == 1
    assert load_checkpoint(tmp_path / "checkpoints" / "last.pt")["epoch"] == 3
    assert "early_stopped" in sink.codes()


def _stop_after_epoch(k: int, sink: MemorySink, flag: StopFlag):
    original = sink.metrics

    def metrics(step, epoch, values):
        original(step, epoch, values)
        if "val/acc" in values and epoch == k:
            flag.set()

    sink.metrics = metrics  # type: ignore[method-assign]


def test_resume_after_epoch_k_matches_uninterrupted_run(tmp_path):
    """model, optimizer, schedule, early stopping, RNG (dropout, augmentation) all resume exactly."""
    over = (
        "train.epochs=4",
        "model.dropout=0.3",
        "data.augment.hflip=true",
        "data.augment.random_crop=true",
        "schedule.name=cosine",
        "optim.name=adamw",
        "optim.weight_decay=0.01",
    )
    full = MemorySink()
    ref = run_training(tiny(*over), tmp_path / "full", full)
    part, flag = MemorySink(), StopFlag()
    _stop_after_epoch(2, part, flag)
    first = run_training(tiny(*over), tmp_path / "part", part, control=flag)
    assert first["status"] == "cancelled" and first["epochs_run"] == 2
    rest = MemorySink()
    resumed = run_training(tiny(*over), tmp_path / "part", rest, resume=True)
    assert resumed["status"] == "completed" and resumed["epochs_run"] == 4
    assert "resumed" in rest.codes()
    assert rest.series("train/loss") == [(s, v) for s, v in full.series("train/loss") if s > first["global_step"]]
    assert rest.series("val/loss") == full.series("val/loss")[2:]
    assert resumed["final"]["val/acc"] == ref["final"]["val/acc"]
    assert resumed["best"] == ref["best"]


def test_divergence_ends_run_with_advice(tmp_path):
    sink = MemorySink()
    summary = run_training(
        tiny("optim.name=sgd", "optim.lr=1e3", "train.grad_clip.mode=none", "train.epochs=3"), tmp_path, sink
    )
    assert summary["status"] == "diverged"
    diag = [e for e in sink.events if e["data"].get("code") == "non_finite_loss"]
    assert diag and "learning rate" in diag[0]["data"]["advice"]
    assert "first_bad_op" in diag[0]["data"]
    assert not (tmp_path / "export").exists()


def test_cancel_stops_between_steps_and_keeps_checkpoint(tmp_path):
    flag, sink = StopFlag(), MemorySink()
    _stop_after_epoch(1, sink, flag)
    summary = run_training(tiny("train.epochs=5"), tmp_path, sink, control=flag)
    assert summary["status"] == "cancelled" and summary["epochs_run"] == 1
    assert load_checkpoint(tmp_path / "checkpoints" / "last.pt")["epoch"] == 1
    immediate = StopFlag()
    immediate.set()
    s2 = run_training(tiny(), tmp_path / "now", MemorySink(), control=immediate)
    assert s2["status"] == "cancelled" and s2["global_step"] == 1


def test_checkpoint_holds_everything_to_resume(tmp_path):
    run_training(tiny(), tmp_path, MemorySink())
    ck = load_checkpoint(tmp_path / "checkpoints" / "last.pt")
    for key in (
        "model",
        "optimizer",
        "schedule",
        "scaler",
        "early_stopping",
        "epoch",
        "global_step",
        "rng",
        "spec",
        "data_info",
        "versions",
    ):
        assert key in ck, key
    assert ck["versions"]["torch"] == torch.__version__
    assert RunSpec.model_validate(ck["spec"]) == tiny()
    assert ck["data_info"]["mean"] and ck["data_info"]["class_names"] == ["class_0", "class_1", "class_2"]


def test_preflight_writes_labelled_sample_grid_and_overfit_verdict(tmp_path):
    from PIL import Image

    sink = MemorySink()
    run_training(tiny("train.overfit_check=true", "train.epochs=1"), tmp_path, sink)
    grid = [a for a in sink.artifacts if a["kind"] == "sample_grid"]
    assert grid and Image.open(grid[0]["path"]).size[0] > 0
    verdict = [e for e in sink.events if e["data"].get("code") == "overfit_check"]
    assert verdict and verdict[0]["data"]["passed"] is True
    assert "shape_check" in sink.codes()


def test_shape_mismatch_fails_with_expected_vs_actual(tmp_path, monkeypatch):
    import core.recipe
    from core.models import build_model

    # the trainer is set up in core/recipe.py: its model gets two classes too many
    monkeypatch.setattr(core.recipe, "build_model", lambda spec, n, c, s: build_model(spec, n + 2, c, s))
    summary = run_training(tiny(), tmp_path, MemorySink())
    assert summary["status"] == "failed"
    assert "(batch, classes)" in summary["error"] and "(2, 5)" in summary["error"]


def test_bf16_autocast_on_cpu_trains(tmp_path):
    summary = run_training(tiny("train.precision=bf16", "deterministic=false"), tmp_path, MemorySink())
    assert summary["status"] == "completed" and math.isfinite(summary["final"]["val/loss"])


def test_cuda_asked_without_gpu_is_a_clear_failure(tmp_path):
    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU; the message is for machines without one")
    summary = run_training(tiny("device=cuda"), tmp_path, MemorySink())
    assert summary["status"] == "failed" and "no CUDA device" in summary["error"]


def test_deterministic_flag_enables_deterministic_algorithms(tmp_path):
    run_training(tiny("train.epochs=1"), tmp_path, MemorySink())
    assert torch.are_deterministic_algorithms_enabled()
    run_training(tiny("train.epochs=1", "deterministic=false"), tmp_path / "b", MemorySink())
    assert not torch.are_deterministic_algorithms_enabled()


@pytest.mark.parametrize("name", ["sgd", "adam", "adamw", "rmsprop"])
def test_every_optimizer_learns(tmp_path, name):
    lr = {"sgd": 0.05, "adam": 3e-3, "adamw": 3e-3, "rmsprop": 1e-3}[name]
    summary = run_training(tiny(f"optim.name={name}", f"optim.lr={lr}", "train.epochs=4"), tmp_path, MemorySink())
    first_loss = summary["final"]["train/epoch_loss"]
    assert summary["status"] == "completed" and first_loss < math.log(3)  # better than chance


def test_label_smoothing_raises_the_floor_of_the_loss(tmp_path):
    a = run_training(tiny("train.epochs=1"), tmp_path / "a", MemorySink())
    b = run_training(tiny("train.epochs=1", "train.label_smoothing=0.3"), tmp_path / "b", MemorySink())
    assert b["final"]["train/epoch_loss"] != a["final"]["train/epoch_loss"]


@pytest.mark.slow
def test_torch_compile_option_trains(tmp_path):
    summary = run_training(
        tiny("compile=true", "train.epochs=1", "deterministic=false", "model.name=mlp"), tmp_path, MemorySink()
    )
    assert summary["status"] == "completed", summary["error"]


def test_out_dir_has_spec_summary_and_checkpoints(tmp_path):
    run_training(tiny(), tmp_path, MemorySink())
    for rel in ("spec.yaml", "summary.json", "samples.png", "checkpoints/last.pt", "checkpoints/best.pt"):
        assert (Path(tmp_path) / rel).is_file(), rel
    assert RunSpec.from_yaml((tmp_path / "spec.yaml").read_text()) == tiny()


def test_out_of_memory_fails_with_advice(tmp_path, monkeypatch):
    import core.engine as ce

    def oom(*a, **k):
        raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")

    monkeypatch.setattr(ce, "train_one_epoch", oom)
    sink = MemorySink()
    summary = run_training(tiny(), tmp_path, sink)
    assert summary["status"] == "failed" and "out of memory" in summary["error"]
    advice = [e for e in sink.events if e["data"].get("code") == "out_of_memory"]
    assert advice and "batch_size" in advice[0]["data"]["advice"] and "accumulate" in advice[0]["data"]["advice"]


def test_plateau_schedule_decays_when_the_monitor_stalls():
    from core.optim import Schedule
    from core.spec_sections import ScheduleSpec

    opt = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=0.1)
    sched = Schedule(
        opt, ScheduleSpec(name="plateau", patience=1, gamma=0.5), steps_per_epoch=10, epochs=10, mode="min"
    )
    for value in (1.0, 0.9, 0.9, 0.9):
        sched.step_batch()
        sched.step_epoch(value)
    assert opt.param_groups[0]["lr"] == pytest.approx(0.05)


@pytest.mark.parametrize("checkpoint, epoch", [("best", 3), ("last", 6)])
def test_the_end_of_run_export_holds_the_weights_export_checkpoint_names(tmp_path, checkpoint, epoch):
    """A run whose best validation epoch (3) is not its last (6): export.checkpoint decides which weights
    the exported files hold, and export.json says which."""
    import json
    import warnings

    spec = tiny(
        "train.epochs=6",
        "optim.name=sgd",
        "optim.lr=0.5",
        "data.noise=2.0",
        "train.early_stopping.patience=10",
        "export.formats=[torchscript]",
        f"export.checkpoint={checkpoint}",
    )
    summary = run_training(spec, tmp_path, MemorySink())
    assert summary["status"] == "completed" and summary["best"]["epoch"] == 3 and summary["epochs_run"] == 6
    report = json.loads((tmp_path / "export" / "export.json").read_text())
    assert report["weights"] == {"checkpoint": checkpoint, "epoch": epoch}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)
        exported = list(torch.jit.load(tmp_path / "export" / "model.ts").state_dict().values())
    wanted = load_checkpoint(tmp_path / "checkpoints" / f"{checkpoint}.pt")["model"]
    other = load_checkpoint(tmp_path / "checkpoints" / f"{'last' if checkpoint == 'best' else 'best'}.pt")["model"]
    assert _all_in(wanted, exported) and not _all_in(other, exported)


def _all_in(weights: dict, exported: list) -> bool:
    """Every floating-point tensor of a state_dict appears, equal, among the exported module's tensors."""
    return all(
        any(v.shape == e.shape and torch.equal(v, e) for e in exported)
        for v in weights.values()
        if v.is_floating_point()
    )


def test_specs_that_said_restore_best_false_now_say_export_checkpoint_last():
    old = {**TINY, "train": {**TINY["train"], "early_stopping": {"restore_best": False}}}
    assert RunSpec.model_validate(old).export.checkpoint == "last"
    kept = {**TINY, "train": {**TINY["train"], "early_stopping": {"restore_best": True}}}
    assert RunSpec.model_validate(kept).export.checkpoint == "best"
