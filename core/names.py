"""The names every package shares, defined once: run statuses, queues and the rule that picks one, task
names, artifact kinds, export file names, metric keys and their builders, and the few values that go
with them (the stale-heartbeat limit, the image file extensions, how a spec is hashed).

Torch-free and importing nothing of ours, so the dashboard, the database layer, the workers and the
training core all read the same names: a status renamed here is renamed everywhere.
"""

from __future__ import annotations

import hashlib
import json
import math
from collections.abc import Mapping, Sequence
from typing import Any

# --- runs ---------------------------------------------------------------------------------------------
RUN_STATUSES = ("queued", "running", "completed", "early_stopped", "cancelled", "failed", "diverged", "lost", "pruned")
# A run in one of these states is over: it is never claimed or finished again. `pruned`: a sweep's trial stopped
# early because its objective trailed the other trials' (the run's events say by how much, at which epoch).
FINISHED_STATUSES = ("completed", "early_stopped", "cancelled", "failed", "diverged", "pruned")
# A worker may take a run in these states: new, or abandoned by a dead worker.
CLAIMABLE_STATUSES = ("queued", "lost")
SUCCESS_STATUSES = ("completed", "early_stopped")

# --- sweeps -------------------------------------------------------------------------------------------
SWEEP_STATUSES = ("running", "completed", "cancelled", "failed")
SWEEP_FINISHED = ("completed", "cancelled", "failed")
SWEEP_METHODS = ("grid", "random", "tpe")
PRUNERS = ("none", "median", "asha")

# --- queues and tasks ---------------------------------------------------------------------------------

# A queued run's priority, by name (the column holds the number): a worker takes the highest first (db/queue_order.py).
PRIORITIES = {"low": -1, "normal": 0, "high": 1}
GPU_QUEUE, CPU_QUEUE = "gpu", "cpu"
# A run of N > 1 GPUs waits in a queue of its own GPU count (gpu-x2, gpu-x4): only a worker that owns at
# least N GPUs of one host consumes it, so such a run never lands on a one-GPU worker that cannot start it.
MULTI_GPU_PREFIX = "gpu-x"
MAX_RUN_GPUS = 16  # core.spec_sections.ResourcesSpec.gpus's upper bound
# The queues of single-process runs; multi_gpu_queues() names the others (is_run_queue tells any of them).
RUN_QUEUES = (GPU_QUEUE, CPU_QUEUE)
# the dashboard's torch jobs (pre-flight, export now, evaluate), on a small CPU-only worker per host
JOBS_QUEUE = "jobs"
RUN_TASK = "torchdeck.execute_run"
PREFLIGHT_TASK = "torchdeck.preflight"
EXPORT_TASK = "torchdeck.export"
# A finished run's ONNX export scored on another registered dataset (worker/evaluate_job.py), stored as an evaluation.
EVALUATE_TASK = "torchdeck.evaluate"
# A registered model's alias moved: the dashboard asks a jobs worker to post the run-end webhook's kind of message
# (worker/alias_notify.py), only when the webhook is set (WEBHOOK_URL_ENV: worker/settings.py's webhook_url).
ALIAS_MOVED_TASK, WEBHOOK_URL_ENV = "torchdeck.alias_moved", "TORCHDECK_WEBHOOK_URL"
# The pre-flight's overfit-one-batch check (New run page): an interactive budget, on the jobs worker's CPU.
PREFLIGHT_OVERFIT_STEPS, PREFLIGHT_OVERFIT_BATCH, PREFLIGHT_OVERFIT_LR = 40, 16, 3e-3
PREFLIGHT_OVERFIT_S = 20.0  # it stops after this many seconds, whatever the steps left
# A worker (or a run) whose heartbeat is older than this is gone; TORCHDECK_STALE_AFTER_S overrides it.
STALE_AFTER_ENV = "TORCHDECK_STALE_AFTER_S"
STALE_AFTER_S = 30.0


def queue_for(device: str | None, gpus: int = 1) -> str:
    """The queue a run waits in: a CPU run never waits for a GPU worker (whatever its process count: any CPU
    worker starts N gloo processes); `auto` and `cuda` want a GPU, and a run of N > 1 GPUs waits in gpu-xN."""
    if device == "cpu":
        return CPU_QUEUE
    return GPU_QUEUE if gpus <= 1 else multi_gpu_queue(gpus)


def run_gpus(spec: Mapping[str, Any] | None) -> int:
    """`resources.gpus` of a spec dict (1 when absent or unreadable: specs stored before it existed)."""
    value = ((spec or {}).get("resources") or {}).get("gpus", 1)
    try:
        return max(1, int(value))
    except (TypeError, ValueError):
        return 1


def queue_of(spec: Mapping[str, Any] | None) -> str:
    """queue_for a stored or submitted spec dict: its device and its resources.gpus."""
    return queue_for((spec or {}).get("device"), run_gpus(spec))


def multi_gpu_queue(gpus: int) -> str:
    """`gpu-x<gpus>`: the queue of runs of that many GPUs (gpus ≥ 2)."""
    if not 2 <= gpus <= MAX_RUN_GPUS:
        raise ValueError(f"a multi-GPU queue is for 2 to {MAX_RUN_GPUS} GPUs, not {gpus}")
    return f"{MULTI_GPU_PREFIX}{gpus}"


def multi_gpu_queues(gpus: int) -> tuple[str, ...]:
    """The queues a worker owning `gpus` GPUs consumes: gpu-x2 .. gpu-x<gpus> (a run of fewer GPUs uses a subset
    of them); none for fewer than two."""
    return tuple(multi_gpu_queue(k) for k in range(2, min(gpus, MAX_RUN_GPUS) + 1))


def queue_gpus(queue: str) -> int | None:
    """How many GPUs a run of `queue` needs: 0 for cpu, 1 for gpu, N for gpu-xN; None for a queue that holds
    no runs (jobs, or an unknown name)."""
    if queue == CPU_QUEUE:
        return 0
    if queue == GPU_QUEUE:
        return 1
    digits = queue[len(MULTI_GPU_PREFIX) :] if queue.startswith(MULTI_GPU_PREFIX) else ""
    if digits.isdigit() and str(int(digits)) == digits and 2 <= int(digits) <= MAX_RUN_GPUS:
        return int(digits)
    return None


def is_run_queue(queue: str) -> bool:
    """A queue of runs (cpu, gpu, gpu-xN), as opposed to the dashboard's jobs."""
    return queue_gpus(queue) is not None


def gpus_offered(queues: Sequence[str]) -> int:
    """The most GPUs one run may have on a worker consuming `queues` (0: it takes no GPU run)."""
    return max((queue_gpus(q) or 0 for q in queues), default=0)


# --- artifacts and exports ----------------------------------------------------------------------------
CHECKPOINT_BEST, CHECKPOINT_LAST = "checkpoint_best", "checkpoint_last"
CHECKPOINT_KINDS = {"best": CHECKPOINT_BEST, "last": CHECKPOINT_LAST}
CHECKPOINT_FILES = {"best": "best.pt", "last": "last.pt"}
SAMPLE_GRID = "sample_grid"
EXPORT_REPORT, BUNDLE = "export_report", "bundle"
EXPORT_FORMATS = ("torchscript", "onnx", "pt2")
EXPORT_FILES = {"torchscript": "model.ts", "onnx": "model.onnx", "pt2": "model.pt2"}  # format -> file name
EXPORT_EXTRAS = {"export.json": EXPORT_REPORT, "bundle.zip": BUNDLE}  # file name -> artifact kind
IMAGE_EXTENSIONS = (".png", ".jpg", ".jpeg", ".bmp", ".gif", ".webp", ".tif", ".tiff")
# Larger images are refused before decoding (uploads and training data): a few KB of PNG can declare
# 15000×15000 pixels, gigabytes once decoded. 64 MP is above any camera's photo.
MAX_IMAGE_PIXELS = 64_000_000
# Evaluation events carry the whole confusion matrix up to this many classes (the most confused pairs beyond).
MAX_CONFUSION_CLASSES = 50
MAX_PER_CLASS_SHOWN = 200  # an evaluation event names at most this many classes (the lowest accuracies)
# At the best epoch, a PNG grid of the most confident validation mistakes (their classes in its meta).
MISCLASSIFIED, MAX_MISCLASSIFIED = "misclassified", 32
# Every train.diag_every steps, one event of this kind: per layer group, a histogram of log10 |value| of the
# weights and of the gradients in HIST_BINS fixed bins over HIST_RANGE (values beyond go to the end bins).
HISTOGRAM_EVENT, HIST_BINS, HIST_RANGE = "histogram", 32, (-10.0, 2.0)
# The pre-flight LR range test (train.lr_finder): its curve as lr_finder.json, an artifact of this kind.
LR_FINDER = "lr_finder"

# --- metric keys --------------------------------------------------------------------------------------
TRAIN_LOSS, TRAIN_EPOCH_LOSS, TRAIN_ACC = "train/loss", "train/epoch_loss", "train/acc"
VAL_LOSS, VAL_ACC, VAL_ACC_TOP5 = "val/loss", "val/acc", "val/acc_top5"
# the exponential moving average of the weights (train.ema), evaluated beside them: every val/ key + "_ema"
VAL_LOSS_EMA, VAL_ACC_EMA = "val/loss_ema", "val/acc_ema"
VAL_F1_MACRO = "val/f1_macro"  # the mean of the per-class F1 scores, every class counting the same
VAL_BALANCED_ACC = "val/balanced_acc"  # the mean of the per-class recalls: a rare class counts as much as a common one
# The held-out test split's scores, stored once at the end of a run (core/test_scores.py); nothing selects on them.
TEST_PREFIX = "test/"
TEST_LOSS, TEST_ACC, TEST_ACC_TOP5, TEST_F1_MACRO = "test/loss", "test/acc", "test/acc_top5", "test/f1_macro"
TEST_EVENT = "test"  # the event kind of the test split's per-class scores and confusion matrix
LR, GRAD_NORM, THROUGHPUT, DATA_WAIT = "lr", "grad_norm", "throughput", "data_wait"
EPOCH_TIME, LR_EPOCH, PEAK_MEMORY, DATA_WAIT_EPOCH = "epoch_time_s", "lr_epoch", "mem/peak_mb", "data_wait_epoch"
SYSTEM_PREFIX = "sys/"  # system metrics: their step is the Unix time in seconds
SYS_CPU, SYS_HOST_CPU, SYS_RSS = "sys/cpu_percent", "sys/host_cpu_percent", "sys/rss_mb"
GPU_PREFIX = "sys/gpu"
GRAD_NORM_PREFIX, UPDATE_RATIO_PREFIX = "grad_norm/", "update_ratio/"
# The longest metric key the store accepts (the metric tables' key column).
MAX_METRIC_KEY = 200
CLASS_ACC_PREFIX = "val/acc_class/"
# The longest class name that appears in a per-class key unchanged; uploads refuse longer names.
MAX_CLASS_NAME = MAX_METRIC_KEY - len(CLASS_ACC_PREFIX)
_DIGEST = 10  # hex characters of the name's hash kept in a shortened key


def gpu_key(index: int, what: str) -> str:
    """`sys/gpu<index>_<what>`: what is util, mem_mb or temp_c."""
    return f"{GPU_PREFIX}{index}_{what}"


def grad_norm_key(stage: str) -> str:
    return GRAD_NORM_PREFIX + stage


def update_ratio_key(stage: str) -> str:
    return UPDATE_RATIO_PREFIX + stage


def class_acc_key(class_name: str) -> str:
    """`val/acc_class/<class name>`; a name too long for the store is cut and suffixed with a hash of the
    whole name (`~` + 10 hex digits), so two long names sharing a prefix still get different keys."""
    return CLASS_ACC_PREFIX + short_name(class_name, MAX_CLASS_NAME)


def short_name(name: str, limit: int) -> str:
    """`name` when it has at most `limit` characters, else its first characters + `~` + a hash of all of it."""
    if len(name) <= limit:
        return name
    digest = hashlib.sha256(name.encode("utf-8", "surrogatepass")).hexdigest()[:_DIGEST]
    return f"{name[: limit - _DIGEST - 1]}~{digest}"


def is_loss(key: str) -> bool:
    """Lower is better for a loss; higher for everything else the dashboard ranks (accuracies)."""
    return "loss" in key


# --- JSON -------------------------------------------------------------------------------------------
def json_safe(value: Any) -> Any:
    """JSON has no NaN or Infinity (Postgres refuses them too): write them as the strings "nan", "inf",
    "-inf", which float() and pandas read back. Mapping keys become strings."""
    if isinstance(value, float) and not math.isfinite(value):
        return "nan" if math.isnan(value) else ("inf" if value > 0 else "-inf")
    if isinstance(value, Mapping):
        return {str(k): json_safe(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [json_safe(v) for v in value]
    return value


MAX_EVENT_DATA = 64 << 10  # bytes of JSON an event's data may hold; larger fields are left out (and named)


def bounded(data: dict) -> dict:
    """An event's data within MAX_EVENT_DATA: the fields over 2 KB are dropped, then (many smaller fields add up
    too) the largest of the rest until they fit in half the cap; the dropped ones are named under `truncated`."""
    if len(json.dumps(data, default=str)) <= MAX_EVENT_DATA:
        return data
    size = {k: len(json.dumps({k: v}, default=str)) for k, v in data.items()}
    kept = {k: v for k, v in data.items() if size[k] <= 2048}
    total = sum(size[k] for k in kept)
    for k in sorted(kept, key=size.__getitem__, reverse=True):
        if total <= MAX_EVENT_DATA // 2:  # the other half leaves room for the names of the dropped fields
            break
        total -= size[k]
        del kept[k]
    kept["truncated"] = sorted(str(k)[:100] for k in data if k not in kept)[:100]
    return kept


def spec_hash(spec: Mapping[str, Any]) -> str:
    """sha256 of a spec's canonical JSON, its name left out: the same recipe has the same hash whatever it
    is called (the New run page, export.json and the database all show this one)."""
    payload = {k: v for k, v in json_safe(spec).items() if k != "name"}
    try:
        canonical = json.dumps(payload, sort_keys=True, separators=(",", ":"), allow_nan=False)
    except TypeError as exc:
        raise ValueError(f"run spec is not JSON-serializable: {exc}") from None
    return hashlib.sha256(canonical.encode()).hexdigest()
