"""One run, top to bottom: set up (core/recipe.py), pre-flight, fit, summarise, export.

`run_training(spec, out_dir, sink, control)` is what `torchdeck train` and the
worker's child process both call. Outputs in `out_dir`: spec.yaml,
checkpoints/{last,best}.pt, samples.png, summary.json, export/ (and the JSON-lines
files when the caller's sink writes them).
"""

from __future__ import annotations

import json
import time
import traceback
import warnings
from pathlib import Path
from typing import Any

import torch

from core import lr_finder
from core.checkpoint import load_checkpoint
from core.config import RunSpec
from core.data import DataInfo, Preprocess, load_data
from core.diagnosis import ADVICE
from core.distributed import SOLO, RankLost
from core.ema import export_weights
from core.engine import Diverged, fit
from core.events import Control, NeverStop, Sink
from core.export_report import export_meta
from core.imbalance import warn_if_unbalanced
from core.models import build_model, count_parameters
from core.names import CHECKPOINT_FILES, CHECKPOINT_KINDS, EXPORT_EXTRAS, EXPORT_FILES, SAMPLE_GRID, SUCCESS_STATUSES
from core.preflight import check_memory, check_shapes, overfit_one_batch, sample_grid
from core.preprocessing import as_recorded
from core.ranks import Launch, start_ranks

# The setup steps live in core/recipe.py; worker/preflight.py, the benchmarks and tests still reach them here.
from core.recipe import build_trainer, resolve_device, resume_from, seed_everything, train_peer
from core.test_scores import score_test
from core.trainer import Trainer, prepare


def _passed(sink: Sink, code: str, message: str, data: dict[str, Any]) -> None:
    """A pre-flight check that passed, as an event before the first step (its figures in the event's data)."""
    sink.event("preflight", "info", message, {"code": code, **data}, step=0)


def _preflight(t: Trainer, out: Path, sink: Sink) -> None:
    shapes = check_shapes(t.model, t.data, t.device)
    _passed(
        sink,
        "shape_check",
        f"shape check passed: input {shapes['input_shape']} → output {shapes['output_shape']}",
        shapes,
    )
    grid = sample_grid(t.data, out / "samples.png")
    sink.artifact(SAMPLE_GRID, str(grid), {"labels": "class names under each image"})
    warn_if_unbalanced(t.diagnoser, t.data.info.class_names, t.data.info.class_counts, t.spec.train)
    if t.spec.train.lr_finder.enabled:  # on copies: the run's model, optimizer and random streams are untouched
        lr_finder.report(t, lr_finder.lr_range_test(t), out)
    if t.spec.train.overfit_check:
        r = overfit_one_batch(t.model, t.data, t.device, t.spec.train.overfit_steps)
        if r["passed"]:
            _passed(
                sink,
                "overfit_check",
                f"overfit-one-batch passed: loss {r['initial_loss']:.3g} → {r['final_loss']:.3g}",
                r,
            )
        else:
            t.diagnoser.emit(
                "overfit_check_failed",
                "warning",
                f"could not overfit one batch of {r['batch']} in {r['steps']} "
                f"steps: loss {r['initial_loss']:.3g} → {r['final_loss']:.3g}, batch accuracy {r['batch_acc']:.0%}",
                at_step=0,
                **r,
            )


def run_training(
    spec: RunSpec, out_dir: str | Path, sink: Sink, control: Control | None = None, resume: bool = False
) -> dict[str, Any]:
    """Train one run to its end. Never raises for a run that merely failed: the summary says why.
    With resources.gpus > 1 this process is rank 0 of the run's processes (core.ranks); a lost one
    raises core.distributed.RankLost instead of a summary (the run is resumed, not failed)."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    (out / "spec.yaml").write_text(spec.to_yaml())
    control = control or NeverStop()
    start, t, status, error, launch = time.time(), None, "failed", None, None
    try:
        device = resolve_device(spec)
        check_memory(spec)
        last = out / "checkpoints" / CHECKPOINT_FILES["last"]
        resume = resume and last.is_file()
        if spec.resources.gpus > 1:
            launch = start_ranks(spec, out, device.type, resume, train_peer)
            device, control = launch.ranks.device, launch.control(control)
        seed_everything(spec.seed, spec.deterministic)
        t = build_trainer(spec, out, sink, control, device, launch.ranks if launch else SOLO)
        first_epoch = resume_from(t, last, sink) if resume else 1
        if first_epoch == 1:
            _preflight(t, out, sink)
        launch and launch.announce(sink, spec)
        sink.event("lifecycle", "info", f"training epochs {first_epoch}..{spec.train.epochs}", {"code": "started"})
        status = fit(t, first_epoch)
    except Diverged as e:
        status, error = "diverged", str(e)
        t and _diagnose_divergence(t, e)
    except torch.OutOfMemoryError as e:
        status, error = "failed", f"out of memory: {e}"
        sink.event(
            "diagnosis",
            "error",
            "CUDA out of memory",
            {"code": "out_of_memory", "advice": ADVICE["out_of_memory"]},
            step=t and t.global_step,
        )
    except Exception as e:  # noqa: BLE001 - the run ends as failed with the traceback recorded
        status, error = _failed(e, launch, sink, t)
    finally:
        launch and launch.close(finished=status not in ("failed", "diverged"), sink=sink)
    summary = _finish(t, spec, out, sink, status, error, time.time() - start)
    return summary


def _failed(e: Exception, launch: Launch | None, sink: Sink, t: Trainer | None) -> tuple[str, str]:
    """Record a failure; a lost rank is not one: RankLost propagates (the other ranks end in the caller's finally)."""
    cause = launch.explain(e) if launch is not None else e
    if isinstance(cause, RankLost):
        raise cause from e
    error = f"{cause.__class__.__name__}: {cause}"
    tb = getattr(cause, "peer_traceback", None) or traceback.format_exc()
    sink.event("lifecycle", "error", error, {"code": "failed", "traceback": tb}, step=t and t.global_step)
    return "failed", error


def _diagnose_divergence(t: Trainer, e: Diverged) -> None:
    data: dict[str, Any] = {"step": e.step, "value": str(e.value)}
    if t.spec.train.detect_anomaly:
        data["first_bad_op"] = _find_nan_source(t)
    where = f"; first non-finite gradient in {data['first_bad_op']}" if data.get("first_bad_op") else ""
    t.sink.event(
        "diagnosis",
        "error",
        f"loss became {e.value} at step {e.step}{where}",
        {"code": "non_finite_loss", "advice": ADVICE["non_finite_loss"], **data},
        step=e.step,
    )


def _find_nan_source(t: Trainer) -> str | None:
    """replay one batch under anomaly detection (slow, so only after divergence)."""
    x, y = next(iter(t.train_batches))
    x = prepare(t.pre_val, x)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", UserWarning)  # "anomaly detection enabled": we know, it is brief
            with torch.autograd.detect_anomaly(check_nan=True):
                t.model.train()
                loss = torch.nn.functional.cross_entropy(t.model(x).float(), y)
                loss.backward()
    except RuntimeError as err:
        msg = str(err).splitlines()[0]
        return msg[:300]
    finally:
        t.optimizer.zero_grad(set_to_none=True)
    return "forward pass (the weights are already non-finite)" if not torch.isfinite(loss) else None


def _finish(
    t: Trainer | None, spec: RunSpec, out: Path, sink: Sink, status: str, error: str | None, wall: float
) -> dict[str, Any]:
    best = None
    if t is not None and t.early.best is not None:
        best = {"metric": spec.train.early_stopping.monitor, "value": t.early.best, "epoch": t.early.best_epoch}
    summary: dict[str, Any] = {
        "status": status,
        "best": best,
        "epochs_run": t.epoch if t else 0,
        "wall_time_s": round(wall, 3),
        "global_step": t.global_step if t else 0,
        "final": t.history[-1] if t and t.history else {},
        "error": error,
        "spec_hash": spec.spec_hash(),
    }
    if t is not None:
        summary["parameters"] = count_parameters(t.model)[0]
        summary["dataset_fingerprint"] = t.data.info.fingerprint or None  # the model registry's lineage
        weights = _score_test(t, spec, out, summary) if status in SUCCESS_STATUSES else None
        epochs = {"best": t.early.best_epoch, "last": t.epoch}
        for which, name in CHECKPOINT_FILES.items():
            if (out / "checkpoints" / name).is_file():
                sink.artifact(CHECKPOINT_KINDS[which], str(out / "checkpoints" / name), {"epoch": epochs[which]})
        if spec.export.formats and status in SUCCESS_STATUSES:
            weights = weights or {"checkpoint": spec.export.checkpoint, "epoch": _load_export_weights(t, spec, out)}
            summary["export"] = export_trained(
                t.model,
                t.data.info,
                t.data.val,
                spec,
                out / "export",
                sink,
                step=t.global_step,
                weights=weights,
            )
    (out / "summary.json").write_text(json.dumps(summary, indent=2, default=str))
    sink.event(
        "lifecycle",
        "error" if status in ("failed", "diverged") else "info",
        f"run {status}" + (f": {error}" if error else ""),
        {"code": status, "summary": summary},
        step=t and t.global_step,
    )
    return summary


def _score_test(t: Trainer, spec: RunSpec, out: Path, summary: dict[str, Any]) -> dict[str, Any] | None:
    """The held-out test split scored once with the weights the export uses (core/test_scores.py), before the
    checkpoints are registered (last.pt records the scores); returns those weights, None without a test split."""
    if t.data.test is None:
        return None
    weights = {"checkpoint": spec.export.checkpoint, "epoch": _load_export_weights(t, spec, out)}
    try:
        summary["test"] = score_test(t, weights)
    except Exception as e:  # noqa: BLE001 - the trained run stands; the missing scores are said
        t.sink.event(
            "test", "warning", f"the test split was not scored: {e.__class__.__name__}: {e}", {"code": "test_failed"}
        )
    return weights


def _load_export_weights(t: Trainer, spec: RunSpec, out: Path) -> int:
    """Put the weights export.checkpoint names into the model; returns their epoch. `last` is what the loop
    left in memory; `best` is best.pt (the last weights when no best.pt was saved)."""
    best = out / "checkpoints" / CHECKPOINT_FILES["best"]
    if spec.export.checkpoint == "best" and best.is_file():
        ck = load_checkpoint(best, t.device)
        t.model.load_state_dict(ck["model"])  # best.pt's model: the EMA's weights when they were chosen
        return int(ck["epoch"])
    if t.ema is not None and t.ema.chosen:  # the last epoch's EMA scored better than the trained weights
        t.model.load_state_dict(t.ema.module.state_dict())
    return t.epoch


def validation_inputs(info: DataInfo, val, n: int, device: torch.device) -> torch.Tensor:
    """Up to n real validation samples, preprocessed exactly as the model saw them."""
    n = min(n, len(val))
    x = val.images[:n] if isinstance(val.images, torch.Tensor) else torch.stack([val.images[i] for i in range(n)])
    return Preprocess(info, None, device)(x.to(device))


def export_trained(
    model,
    info: DataInfo,
    val,
    spec: RunSpec,
    out: Path,
    sink: Sink,
    step: int | None = None,
    weights: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """Export + verify (core.export), registering each produced file as an artifact. `step`: the training
    step the export belongs to (the end of the run), None for an export made later from a checkpoint;
    `weights`: which checkpoint and epoch the model holds (recorded in export.json)."""
    from core.checkpoint import versions
    from core.export import export_model

    model = model.to("cpu").eval()
    inputs = validation_inputs(info, val, spec.export.parity_samples, torch.device("cpu"))
    meta = {
        **export_meta(info, spec.spec_hash()),
        "arch": spec.model.name,
        "versions": versions(),
        "weights": weights or {},
    }
    sink.event(
        "lifecycle", "info", f"exporting {', '.join(spec.export.formats)}", {"code": "export_started"}, step=step
    )
    report = export_model(
        model, inputs, out, list(spec.export.formats), meta, atol=spec.export.atol, opset=spec.export.opset
    )
    for fmt in spec.export.formats:
        r = report.get("formats", {}).get(fmt, {})
        if (out / EXPORT_FILES[fmt]).is_file():
            sink.artifact(fmt, str(out / EXPORT_FILES[fmt]), r)
        if not r.get("ok", False):
            sink.event(
                "export",
                "warning",
                f"{fmt} export failed or failed parity: {r.get('error', 'see export.json')}",
                {"code": "export_failed", "format": fmt},
                step=step,
            )
    for name, kind in EXPORT_EXTRAS.items():
        if (out / name).is_file():
            sink.artifact(kind, str(out / name), {})
    return {fmt: bool(report.get("formats", {}).get(fmt, {}).get("ok")) for fmt in spec.export.formats}


def export_run(
    run_dir: str | Path,
    checkpoint: str = "best",
    formats: list[str] | None = None,
    sink: Sink | None = None,
    out: str | Path | None = None,
) -> dict[str, Any]:
    """`torchdeck export RUN_DIR`: rebuild the model from a checkpoint and export it into `out` (default
    RUN_DIR/export; the dashboard's Export now gives each export a new folder)."""
    from core.events import MemorySink

    run = Path(run_dir)
    path = run / "checkpoints" / CHECKPOINT_FILES[checkpoint]
    if not path.is_file():
        raise FileNotFoundError(f"no {checkpoint} checkpoint in {run} (expected {path})")
    ck = load_checkpoint(path)
    spec = RunSpec.model_validate(ck["spec"])
    if formats is not None:
        spec = spec.model_copy(update={"export": spec.export.model_copy(update={"formats": formats})})
    recorded = (ck.get("data_info") or {}).get("preprocessing")  # the run's own, whatever its weights file is now
    data = load_data(as_recorded(spec.data, recorded), spec.seed) if recorded else load_data(spec.data, spec.seed)
    data.info.preprocessing = recorded or data.info.preprocessing
    model = build_model(
        spec.model.model_copy(update={"pretrained": False, "weights_file": None}),
        data.info.num_classes,
        data.info.channels,
        data.info.image_size,
    )
    model.load_state_dict(export_weights(ck))  # the EMA's when it was chosen at that epoch (core/ema.py)
    return export_trained(
        model,
        data.info,
        data.val,
        spec,
        Path(out) if out else run / "export",
        sink or MemorySink(),
        weights={"checkpoint": checkpoint, "epoch": int(ck["epoch"])},
    )
