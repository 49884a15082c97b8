"""What the pages say of a run logged by a person's own script through the MLflow client (`run.source` is not
torchdeck: app/tracking/ answers the client, db/external.py stores it). Such a run has no spec, no queue and no
worker: its stored spec holds what the script logged, `{"params": {...}, "tags": {...}}`, and its files are
artifacts of kind FILE_KIND with their relative path in `meta["path"]`. Plain functions, no Streamlit."""

from __future__ import annotations

import math
from collections.abc import Mapping
from datetime import datetime
from typing import Any

FILE_KIND = "file"  # a file the script logged (mlflow.log_artifact), its relative path in meta["path"]
SOURCE_LABEL = "script"  # where a worker or a device would be named
SYSTEM_PREFIX = "mlflow."  # tags the MLflow client sets itself
# The system tags shown as the run's source, in this order, with their labels.
SOURCE_TAGS = {
    "mlflow.source.name": "script",
    "mlflow.source.git.commit": "git commit",
    "mlflow.source.git.branch": "git branch",
    "mlflow.user": "user",
}
NAME_TAG = "mlflow.runName"  # the run's name, already its title
SHORT_COMMIT = 12

_THIS = "this run was logged by a script through the MLflow client"
BY_SCRIPT = _THIS[0].upper() + _THIS[1:]
NO_SPEC = f"{BY_SCRIPT}: it has no spec to clone, re-run or resume."
NO_CANCEL = (
    "torchdeck cannot cancel it: no worker of torchdeck's runs it. Stop the script, or end the run from it "
    '(`mlflow.end_run("KILLED")`).'
)
NO_WORKER = "no worker, GPU or pre-flight of torchdeck's: it runs wherever its script runs"
NOT_APPLICABLE = {
    "spec": f"{BY_SCRIPT}: it has no spec (YAML) to clone, re-run or resume; here is what the script logged.",
    "export": f"**Export now** does not apply: {_THIS}, which left no checkpoint of torchdeck's to export.",
    "predict": f"Predict does not apply: {_THIS}, with no verified ONNX export of torchdeck's.",
    "test": f"No held-out test split of torchdeck's: {_THIS} (any test metrics it logged are on the charts).",
    "diagnosis": f"Diagnosis and evaluation do not apply: {_THIS}; torchdeck's checks "
    "(loss, gradients, data, confusion matrix) run inside its own worker. Its metrics are on the charts.",
    "samples": f"No sample grid: {_THIS}, and torchdeck's pre-flight did not load its data.",
}


def params(spec: Mapping[str, Any] | None) -> dict[str, str]:
    """The params the script logged, by key."""
    return {str(k): str(v) for k, v in sorted(dict((spec or {}).get("params") or {}).items())}


def tags(spec: Mapping[str, Any] | None) -> tuple[dict[str, str], dict[str, str]]:
    """(the script's own tags, the MLflow client's system tags `mlflow.*`), each by key."""
    every = {str(k): str(v) for k, v in sorted(dict((spec or {}).get("tags") or {}).items())}
    system = {k: v for k, v in every.items() if k.startswith(SYSTEM_PREFIX)}
    return {k: v for k, v in every.items() if k not in system}, system


def source(spec: Mapping[str, Any] | None) -> list[tuple[str, str]]:
    """[(label, value)] of the system tags that say where the run comes from: script, git commit, branch, user."""
    system = tags(spec)[1]
    return [(label, system[key]) for key, label in SOURCE_TAGS.items() if system.get(key)]


def source_line(spec: Mapping[str, Any] | None) -> list[tuple[str, str]]:
    """source() for one line: the git commit shortened."""
    return [(label, value[:SHORT_COMMIT] if label == "git commit" else value) for label, value in source(spec)]


def fields(spec: Mapping[str, Any] | None) -> dict[str, str]:
    """The run's fields for Compare, beside a spec's dotted fields: `params.lr`, `tags.team`, `source.script`."""
    own, _ = tags(spec)
    out = {f"params.{k}": v for k, v in params(spec).items()}
    out.update({f"tags.{k}": v for k, v in own.items()})
    out.update({f"source.{label}": value for label, value in source(spec)})
    return out


def number(value: Any) -> Any:
    """A param as the script logged it (text) made a number where it reads as a finite one (`0.01`, `32`), so
    that an axis of params is numeric; anything else as it is."""
    if not isinstance(value, str):
        return value
    try:
        x = float(value)
    except ValueError:
        return value
    if not math.isfinite(x):
        return value
    return int(x) if x.is_integer() and value.strip().lstrip("+-").isdigit() else x


def silent_text(heartbeat_at: datetime | None, now: datetime) -> str:
    """What a lost run of a script says: when its script last wrote, and that it comes back if it writes again."""
    if heartbeat_at is None:
        return "Its script stopped writing: killed, or its machine went away; it is running again if it writes again."
    minutes = max(int((now - heartbeat_at).total_seconds() // 60), 0)
    return (
        f"Its script stopped writing at {heartbeat_at:%Y-%m-%d %H:%M} UTC (no word for {minutes} min): killed, or "
        "its machine went away; it is running again if the script writes again."
    )
