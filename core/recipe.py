"""The setup steps of a run, shared by its processes: the device, the seeds, the trainer (data, model, optimizer,
schedule, loaders) and a resume from last.pt. `train_peer` is what a rank other than 0 runs of a run.

Its own module so that the two sides of a run on several processes need not import each other: core.train (rank
0's whole run) starts the other ranks through core.ranks, handing it `train_peer` as their target, and
core.ranks never imports core.train.
"""

from __future__ import annotations

import os
import random
from pathlib import Path

import numpy as np
import torch

from core.batches import make_batches
from core.checkpoint import EarlyStopping, load_checkpoint, set_rng_state
from core.config import RunSpec
from core.data import DataInfo, load_data
from core.diagnosis import Diagnoser
from core.distributed import SOLO, CollectiveControl, Group, Ranks
from core.engine import fit
from core.events import Control, NullSink, Sink
from core.imagefolder import Reading
from core.models import Classifier, build_model, count_parameters, load_weights_file, wants_channels_last
from core.names import CHECKPOINT_FILES
from core.optim import AmpStep, Schedule, apply_transfer, build_optimizer
from core.trainer import Trainer, steps_per_epoch


def resolve_device(spec: RunSpec) -> torch.device:
    cuda = torch.cuda.is_available()
    if spec.device == "cuda" and not cuda:
        raise RuntimeError(
            "device=cuda was asked but no CUDA device is visible here (check CUDA_VISIBLE_DEVICES, the driver, "
            "and that torch is a CUDA build); use device=auto or cpu"
        )
    device = torch.device("cuda" if spec.device == "cuda" or (spec.device == "auto" and cuda) else "cpu")
    if device.type == "cpu" and spec.train.precision == "fp16":
        raise RuntimeError("train.precision=fp16 needs CUDA, and this run resolved to the CPU; use bf16 or fp32")
    return device


def seed_everything(seed: int, deterministic: bool) -> None:
    """Python, NumPy and torch seeds; deterministic algorithms when asked."""
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)
    if deterministic:
        os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
        torch.use_deterministic_algorithms(True)
        torch.backends.cudnn.benchmark = False
    else:
        torch.use_deterministic_algorithms(False)
        torch.backends.cudnn.benchmark = True


def build_trainer(
    spec: RunSpec, out: Path, sink: Sink, control: Control, device: torch.device, ranks: Ranks = SOLO
) -> Trainer:
    """Data, model, optimizer, schedule and loaders of one run; on several ranks, this rank's shard of every
    global batch (train.batch_size / world each) and the model wrapped in DDP."""
    data = load_data(spec.data, spec.seed, spec.model, _reading(spec, sink, ranks))
    _report_data(sink, data.info)
    model = _build_model(spec, data.info, device, sink)
    forward = ranks.wrap(model, torch.compile(model) if spec.compile and ranks.world == 1 else model)
    optimizer = build_optimizer(model, spec.optim, spec.model)
    w = ranks.world
    balanced = spec.train.sampler == "balanced"
    train_b = make_batches(
        data.train, spec.train.batch_size // w, True, device, spec.seed, spec.loader, ranks.rank, w, balanced
    )
    val_b = make_batches(
        data.val, -(-max(spec.train.batch_size, 256) // w), False, device, spec.seed, spec.loader, ranks.rank, w
    )
    es = spec.train.early_stopping
    schedule = Schedule(
        optimizer, spec.schedule, steps_per_epoch(len(train_b), spec.train), spec.train.epochs, es.resolved_mode
    )
    return Trainer(
        spec=spec,
        model=model,
        forward=forward,
        optimizer=optimizer,
        schedule=schedule,
        amp=AmpStep(spec.train, device.type),
        data=data,
        train_batches=train_b,
        val_batches=val_b,
        device=device,
        sink=sink,
        control=control,
        diagnoser=Diagnoser(sink),
        early=EarlyStopping(es.resolved_mode, es.patience, es.min_delta, es.enabled),
        out_dir=out,
        ranks=ranks,
    )


def _reading(spec: RunSpec, sink: Sink, ranks: Ranks) -> Reading:
    """An image folder's decoding at load: loader.num_workers processes (one per core by default), its progress
    sent as an event at every quarter (rank 0 alone: the others read what it built, or decode alike)."""
    said = [-1]

    def progress(done: int, total: int) -> None:
        quarter = 4 * done // max(total, 1)
        if ranks.rank == 0 and quarter > said[0] and done < total:
            said[0] = quarter
            sink.event("data", "info", f"decoding images: {done:,} of {total:,} ({100 * done // total} %)")

    def report(message: str) -> None:
        if ranks.rank == 0:
            sink.event("data", "info", message, {"code": "decoded"})

    return Reading(workers=spec.loader.num_workers, progress=progress, report=report)


def _report_data(sink: Sink, info: DataInfo) -> None:
    """The `data` event (the dataset's shape and split), and a warning for unreadable images it skipped."""
    sink.event(
        "lifecycle",
        "info",
        f"data {info.name}: {info.num_train} train / {info.num_val} val"
        + (f" / {info.num_test} test ({info.test_source})" if info.num_test else "")
        + f", {info.num_classes} classes, "
        f"{info.channels}×{info.image_size}×{info.image_size}",
        {"code": "data", **info.to_dict()},
    )
    if info.skipped:
        sink.event(
            "data",
            "warning",
            f"{info.skipped} unreadable image(s) skipped",
            {"code": "skipped_images", "files": info.skipped_files},
        )


def _build_model(spec: RunSpec, info: DataInfo, device: torch.device, sink: Sink) -> Classifier:
    """The model for this data on `device`: its weights file loaded, the first epoch's layers trainable, and
    the `weights_file` and `model` events."""
    # The weights file is loaded here, where the task's class names are known (they decide whose head: head_plan).
    model = build_model(
        spec.model.model_copy(update={"weights_file": None}), info.num_classes, info.channels, info.image_size
    )
    if spec.model.weights_file:
        model.weights_report = load_weights_file(model, spec.model.weights_file, spec.model, info.class_names)
    model = model.to(device)
    if wants_channels_last(spec.channels_last, device, model):
        model = model.to(memory_format=torch.channels_last)
    _report_weights(sink, spec, model)
    apply_transfer(model, spec.model, 1)
    total, trainable = count_parameters(model)
    sink.event(
        "lifecycle",
        "info",
        f"model {spec.model.name}: {total:,} parameters ({trainable:,} trainable) on {device}",
        {"code": "model", "parameters": total, "trainable": trainable, "device": str(device)},
    )
    return model


def _report_weights(sink: Sink, spec: RunSpec, model: Classifier) -> None:
    """The `weights_file` event: which keys of the file were loaded, and whose head the model kept and why."""
    report = getattr(model, "weights_report", None)
    if not report:
        return
    head = model.head_report or {}
    sink.event(
        "lifecycle",
        "warning" if any(report.values()) else "info",
        f"loaded {spec.model.weights_file}: {len(report['missing'])} missing, "
        f"{len(report['unexpected'])} unexpected, {len(report['shape_mismatch'])} shape-mismatched keys; "
        f"head {head.get('head')}: {head.get('reason')}",
        {
            "code": "weights_file",
            **report,
            "head": head.get("head"),
            "head_reason": head.get("reason"),
            "head_keys_not_loaded": head.get("dropped", []),
            "weights_classes": head.get("file_classes", []),
        },
    )


def resume_from(t: Trainer, path: Path, sink: Sink) -> int:
    """Load a last.pt into a built trainer (weights, optimizer, schedule, scaler, early stopping, counters,
    random streams); returns the first epoch to train."""
    ck = load_checkpoint(path, t.device)
    t.model.load_state_dict(ck["model"])
    apply_transfer(t.model, t.spec.model, ck["epoch"] + 1)
    t.optimizer.load_state_dict(ck["optimizer"])
    t.schedule.load_state_dict(ck["schedule"])
    t.amp.scaler.load_state_dict(ck["scaler"])
    t.early.load_state_dict(ck["early_stopping"])
    t.global_step, t.epoch, t.history = ck["global_step"], ck["epoch"], list(ck["history"])
    t.diagnoser.emitted = set(ck["diagnoser"]["emitted"])
    t.ref_loss = ck["ref_loss"]
    if t.ema is not None and "ema" in ck:  # the moving average and its step count (train.ema)
        t.ema.load_state_dict(ck["ema"])
    set_rng_state(t.ranks.own_rng(ck))  # on several ranks, each its own streams
    sink.event(
        "lifecycle",
        "info",
        f"resumed from {path.name} after epoch {ck['epoch']} (step {ck['global_step']})",
        {"code": "resumed", "epoch": ck["epoch"], "step": ck["global_step"]},
    )
    return ck["epoch"] + 1


def train_peer(spec: RunSpec, out: Path, ranks: Group, resume: bool) -> None:
    """What a rank other than 0 runs of `core.train.run_training`: the same trainer on its shard, no pre-flight,
    no files (core.ranks starts it in each of those ranks' processes)."""
    seed_everything(spec.seed, spec.deterministic)
    sink = NullSink()
    t = build_trainer(spec, out, sink, CollectiveControl(ranks), ranks.device, ranks)
    first_epoch = resume_from(t, out / "checkpoints" / CHECKPOINT_FILES["last"], sink) if resume else 1
    fit(t, first_epoch)
