"""What the New run page says before Launch, and the weights it offers to start from; plain functions, torch-free.

- Similar runs: finished successful runs with the same dataset (for an image folder, the same folder) and model.
- Time: the form's epochs × the median seconds per epoch of the similar runs (their summaries), as sweeps do.
- Memory: the peak (`mem/peak_mb`) of the similar run closest in batch size and image size, newest first.
- Workers: which live workers serve the run's queue (app.services.broker.queue_status); for a run of N GPUs (queue
  gpu-xN) that no live worker offers, the most one does and the command that starts one.
- Start from a run's weights: finished successful runs that have a best checkpoint on this host; choosing one
  suggests feature extraction first, the whole backbone unfrozen later, at a 10× smaller learning rate.
"""

from __future__ import annotations

import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import unquote, urlparse

from sqlalchemy import Engine

from app.services.broker import queue_status
from core import catalog
from core.names import CHECKPOINT_BEST, CHECKPOINT_FILES, CPU_QUEUE, PEAK_MEMORY, SUCCESS_STATUSES, queue_for
from db import repo
from db.types import RunRecord

SIMILAR_STATUSES = (*SUCCESS_STATUSES, "pruned")  # a pruned trial's epochs took as long as anyone's
SCAN_LIMIT = 200  # finished runs looked at for similar ones, newest first
SOURCE_LIMIT = 50  # finished runs offered as weights to start from, newest first

# What a practitioner starts a transfer with: train the new head on frozen features, then the whole network
# from this epoch on, the backbone at a tenth of the head's learning rate (discriminative learning rates).
SUGGESTED_TRANSFER = "feature_extract"
SUGGESTED_UNFREEZE_AT = 2
SUGGESTED_BACKBONE_LR_MULT = 0.1
SUGGESTION_NOTE = (
    "Suggested for a transfer: feature extraction first (the backbone frozen, only the head trains), "
    f"then the whole backbone unfrozen from epoch {SUGGESTED_UNFREEZE_AT}, at "
    f"{SUGGESTED_BACKBONE_LR_MULT:g}× the head's learning rate so the features it learned are not "
    "washed out. Change them in Model & transfer learning."
)


def _get(spec: Mapping[str, Any], section: str, name: str) -> Any:
    return (spec.get(section) or {}).get(name)


def similar_runs(engine: Engine, values: Mapping[str, Any]) -> list[RunRecord]:
    """Finished successful (or pruned) runs of the same dataset and model as the form's flat `values`
    ({dotted field: value}), newest first; for an image folder, of the same folder."""
    data, model, path = values.get("data.name"), values.get("model.name"), values.get("data.path")
    page = repo.list_runs(engine, status=list(SIMILAR_STATUSES), limit=SCAN_LIMIT)
    return [
        r
        for r in page.runs
        if _get(r.spec, "data", "name") == data
        and _get(r.spec, "model", "name") == model
        and (not catalog.is_folder(data) or _get(r.spec, "data", "path") == path)
    ]


@dataclass(frozen=True)
class TimeEstimate:
    minutes: float
    seconds_per_epoch: float
    runs: int

    def describe(self) -> str:
        return (
            f"Time: ≈ {self.minutes:.1f} min at {self.seconds_per_epoch:.1f} s/epoch as in {self.runs} similar "
            "finished run(s)"
        )


def time_estimate(similar: Sequence[RunRecord], epochs: int | None) -> TimeEstimate | None:
    """epochs × the median seconds per epoch of the similar runs (wall time / epochs run); None without any."""
    per_epoch = [
        r.summary["wall_time_s"] / r.summary["epochs_run"]
        for r in similar
        if (r.summary or {}).get("epochs_run") and (r.summary or {}).get("wall_time_s")
    ]
    if not per_epoch or not epochs:
        return None
    s = statistics.median(per_epoch)
    return TimeEstimate(epochs * s / 60, s, len(per_epoch))


@dataclass(frozen=True)
class MemoryEstimate:
    mb: float
    run_name: str

    def describe(self) -> str:
        return f"Memory: ≈ {self.mb:,.0f} MB (from {self.run_name}'s peak)"


def memory_estimate(similar: Sequence[RunRecord], values: Mapping[str, Any]) -> MemoryEstimate | None:
    """The peak memory of the similar run closest to the form (same batch size, then same image size;
    newest first among equals); None when no similar run recorded one."""
    measured = [r for r in similar if (m := r.metrics.get(PEAK_MEMORY)) is not None and m.max_value is not None]
    if not measured:
        return None

    def closeness(r: RunRecord) -> int:
        return int(_get(r.spec, "train", "batch_size") == values.get("train.batch_size")) * 2 + int(
            _get(r.spec, "data", "image_size") == values.get("data.image_size")
        )

    best = max(measured, key=closeness)  # max keeps the first (newest) of equals
    return MemoryEstimate(float(best.metrics[PEAK_MEMORY].max_value), best.name)


@dataclass(frozen=True)
class WorkerHint:
    served: bool
    text: str


def worker_hint(queue: str, engine: Engine, processes: int = 1) -> WorkerHint:
    """Which live workers would take the run, or that none would and how to start one (for a run of N GPUs, that
    no live worker offers N, the most one does, and the command that starts one). `processes`: the run's
    resources.gpus, said for a CPU run (one CPU worker starts them all)."""
    status = queue_status(queue, engine=engine)
    if not status.served:
        return WorkerHint(False, "Workers: " + status.message())
    names = ", ".join(w.id if w.hostname in w.id else f"{w.id} on {w.hostname}" for w in status.workers[:5])
    more = f" and {len(status.workers) - 5} more" if len(status.workers) > 5 else ""
    n = len(status.workers)
    where = (
        f"; the one that takes it runs its {processes} processes (gloo, the CPU cores shared)"
        if queue == CPU_QUEUE and processes > 1
        else ""
    )
    return WorkerHint(
        True, f"Workers: {n} live worker{'s serve' if n > 1 else ' serves'} '{queue}' ({names}{more})" + where
    )


def processes_of(values: Mapping[str, Any]) -> int:
    """The form's resources.gpus (1 when it is not a whole number yet)."""
    try:
        return max(1, int(values.get("resources.gpus") or 1))
    except (TypeError, ValueError):
        return 1


@dataclass(frozen=True)
class Hints:
    workers: WorkerHint
    memory: MemoryEstimate | None
    time: TimeEstimate | None


def hints(engine: Engine, values: Mapping[str, Any]) -> Hints:
    """Everything said before Launch, for the form's flat `values`."""
    similar = similar_runs(engine, values)
    n = processes_of(values)
    return Hints(
        worker_hint(queue_for(values.get("device"), n), engine, n),
        memory_estimate(similar, values),
        time_estimate(similar, values.get("train.epochs")),
    )


# --- start from a run's weights ---------------------------------------------------------------------------
@dataclass(frozen=True)
class WeightSource:
    run: RunRecord
    path: Path | None  # the best checkpoint on this host; None when it is only in an object store

    @property
    def model(self) -> str:
        return str(_get(self.run.spec, "model", "name") or "?")

    def label(self) -> str:
        where = "" if self.path is not None else " — not on this host"
        return f"{self.run.name} ({self.model}, {self.run.status}){where}"


def checkpoint_path(uri: str, run_id: str, root: Path) -> Path | None:
    """The local file of a best checkpoint's URI: a file under the artifact root, or, when the store is an
    object store, the run's working copy under the artifact root (runs/<id>/checkpoints/best.pt); else None."""
    root = root.resolve()
    parsed = urlparse(uri)
    candidates = []
    if parsed.scheme in ("file", ""):
        candidates.append(Path(unquote(parsed.path)))
    candidates.append(root / "runs" / run_id / "checkpoints" / CHECKPOINT_FILES["best"])
    for c in candidates:
        p = c.resolve()
        if root in p.parents and p.is_file():
            return p
    return None


def weight_sources(engine: Engine, root: Path, project: str | None = None) -> list[WeightSource]:
    """Finished successful runs (of `project`, or of all) with a best checkpoint, newest first (the newest checkpoint
    of each)."""
    page = repo.list_runs(engine, status=list(SUCCESS_STATUSES), limit=SOURCE_LIMIT, project=project)
    out = []
    for r in page.runs:
        found = repo.list_artifacts(engine, r.id, kind=CHECKPOINT_BEST)
        if found:
            out.append(WeightSource(r, checkpoint_path(found[-1].uri, r.id, root)))
    return out


def suggestion(source: WeightSource) -> dict[str, Any]:
    """The form's values (a partial spec) for starting from `source`'s best checkpoint."""
    return {
        "model": {
            "name": source.model,
            "weights_file": str(source.path),
            "pretrained": False,
            "transfer": SUGGESTED_TRANSFER,
            "unfreeze_at_epoch": SUGGESTED_UNFREEZE_AT,
            "backbone_lr_mult": SUGGESTED_BACKBONE_LR_MULT,
        }
    }
