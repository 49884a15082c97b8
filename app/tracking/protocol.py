"""The wire format of MLflow's tracking API as torchdeck answers it: its error shape and codes, its input bounds,
and the JSON of an experiment and of a run (what the `mlflow` client parses into its entities).

Bounds are MLflow's own where it has them (a log-batch of at most 1,000 metrics, 100 params and 100 tags, 1,000
items in all; keys of 250 characters, param values of 6,000, tag values of 8,000), torchdeck's where it is
stricter (a metric key: db.types.KEY_LEN characters; a step: 0 to 2^53). A request over them is refused whole,
with INVALID_PARAMETER_VALUE, before anything is written."""

from __future__ import annotations

import math
from collections.abc import Mapping
from datetime import UTC, datetime
from typing import Any

from db.types import KEY_LEN, RunRecord

# MLflow's error codes (databricks.proto's ErrorCode) and the HTTP status its server gives each.
STATUS = {
    "INVALID_PARAMETER_VALUE": 400,
    "BAD_REQUEST": 400,
    "MALFORMED_REQUEST": 400,
    "INVALID_STATE": 400,
    "RESOURCE_ALREADY_EXISTS": 400,
    "RESOURCE_DOES_NOT_EXIST": 404,
    "ENDPOINT_NOT_FOUND": 404,
    "UNAUTHENTICATED": 401,
    "PERMISSION_DENIED": 403,
    "INTERNAL_ERROR": 500,
}

MAX_BATCH_METRICS = 1000
MAX_BATCH_PARAMS = 100
MAX_BATCH_TAGS = 100
MAX_BATCH_ITEMS = 1000
MAX_KEY = 250
MAX_PARAM_VALUE = 6000
MAX_TAG_VALUE = 8000
MAX_STEP = 2**53
MAX_RESULTS = 50_000  # a search's page, at most (MLflow's own threshold)
DEFAULT_RESULTS = 1000

# torchdeck's status → MLflow's RunStatus. A script's lost run (it fell silent) is FAILED to the client; the
# `torchdeck.status` tag says which of torchdeck's statuses it is.
RUN_STATUS = {
    "queued": "SCHEDULED",
    "running": "RUNNING",
    "completed": "FINISHED",
    "early_stopped": "FINISHED",
    "pruned": "KILLED",
    "cancelled": "KILLED",
    "failed": "FAILED",
    "diverged": "FAILED",
}


class MlflowError(Exception):
    """An answer in MLflow's error shape: `{"error_code": code, "message": message}` with the code's HTTP status."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message

    @property
    def status(self) -> int:
        return STATUS.get(self.code, 400)

    def body(self) -> dict[str, str]:
        return {"error_code": self.code, "message": self.message}


def invalid(message: str) -> MlflowError:
    return MlflowError("INVALID_PARAMETER_VALUE", message)


def missing(what: str) -> MlflowError:
    return MlflowError("RESOURCE_DOES_NOT_EXIST", f"{what} not found")


def required(body: Mapping[str, Any], name: str, *aliases: str) -> Any:
    """The field `name` (or an alias: MLflow's older `run_uuid`), or INVALID_PARAMETER_VALUE naming it."""
    for key in (name, *aliases):
        value = body.get(key)
        if value not in (None, ""):
            return value
    raise invalid(f"Missing value for required parameter '{name}'.")


def as_int(value: Any, name: str, *, default: int | None = None) -> int:
    """An int64 field: a JSON number or, as protobuf's JSON writes them, a string of digits."""
    if value is None or value == "":
        if default is None:
            raise invalid(f"Missing value for required parameter '{name}'.")
        return default
    if isinstance(value, bool):
        raise invalid(f"Invalid value {value!r} for parameter '{name}': a whole number")
    try:
        number = int(value)
    except (TypeError, ValueError):
        raise invalid(f"Invalid value {value!r} for parameter '{name}': a whole number") from None
    if isinstance(value, float) and number != value:
        raise invalid(f"Invalid value {value!r} for parameter '{name}': a whole number")
    return number


def as_float(value: Any, name: str) -> float:
    """A double field: a number, or protobuf's JSON strings for the non-finite ones ("NaN", "Infinity")."""
    if isinstance(value, bool) or value is None:
        raise invalid(f"Invalid value {value!r} for parameter '{name}': a number")
    try:
        return float(value)
    except (TypeError, ValueError):
        raise invalid(f"Invalid value {value!r} for parameter '{name}': a number") from None


def check_key(key: Any, what: str) -> str:
    if not isinstance(key, str) or not key:
        raise invalid(f"Invalid {what} name {key!r}: a non-empty string")
    if len(key) > MAX_KEY:
        raise invalid(f"{what} name '{key[:40]}…' is {len(key)} characters long: at most {MAX_KEY}")
    if "\x00" in key or any(part in ("..", ".") for part in key.split("/")) or key.startswith("/"):
        raise invalid(f"Invalid {what} name {key!r}: no '..' or '.' parts, no leading '/', no NUL")
    return key


def check_value(value: Any, key: str, what: str, limit: int) -> str:
    if value is None:
        value = ""
    if not isinstance(value, str):
        value = str(value)
    if len(value) > limit:
        raise invalid(f"{what} '{key}' has a value of {len(value)} characters: at most {limit}")
    return value


def check_metric_key(key: Any) -> str:
    key = check_key(key, "metric")
    if len(key) > KEY_LEN:
        raise invalid(f"metric name '{key[:40]}…' is {len(key)} characters long: torchdeck keeps at most {KEY_LEN}")
    return key


def check_step(step: int) -> int:
    if not 0 <= step <= MAX_STEP:
        raise invalid(f"metric step {step}: torchdeck keeps steps from 0 to 2^53")
    return step


def ms(at: datetime | None) -> int | None:
    return None if at is None else int(at.timestamp() * 1000)


def from_ms(value: Any, name: str) -> datetime | None:
    if value in (None, ""):
        return None
    return datetime.fromtimestamp(as_int(value, name) / 1000, UTC)


def pairs(mapping: Mapping[str, Any]) -> list[dict[str, str]]:
    return [{"key": k, "value": "" if v is None else str(v)} for k, v in sorted(mapping.items())]


def experiment_json(experiment_id: str, name: str, created: datetime | None, description: str = "") -> dict[str, Any]:
    stamp = ms(created) or 0
    tags = [{"key": "mlflow.note.content", "value": description}] if description else []
    return {
        "experiment_id": experiment_id,
        "name": name,
        "artifact_location": "mlflow-artifacts:/runs",
        "lifecycle_stage": "active",
        "creation_time": stamp,
        "last_update_time": stamp,
        "tags": tags,
    }


def run_status(run: RunRecord) -> str:
    if run.status == "lost":
        return "FAILED" if run.external else "SCHEDULED"  # a script fell silent; a torchdeck run waits to resume
    return RUN_STATUS.get(run.status, "FAILED")


def artifact_uri(run_id: str) -> str:
    """Where the client sends a run's files: MLflow's artifact proxy under the tracking URI (app/tracking/artifacts)."""
    return f"mlflow-artifacts:/runs/{run_id}"


def run_json(run: RunRecord, experiment_id: str) -> dict[str, Any]:
    """A run as the client reads it. A script's run: the params and tags it logged. A torchdeck run: its spec's
    fields as params, its labels as tags (`torchdeck.tag.<label>`)."""
    if run.external:
        params = dict(run.spec.get("params") or {})
        tags = dict(run.spec.get("tags") or {})
    else:
        params = {k: v for k, v in flatten(run.spec).items() if v is not None}
        tags = {f"torchdeck.tag.{t}": "" for t in run.tags}
        tags.setdefault("mlflow.user", run.owner)
    tags.update({"mlflow.runName": run.name, "torchdeck.status": run.status, "torchdeck.project": run.project})
    stamp = ms(run.heartbeat_at or run.finished_at or run.created_at) or 0
    metrics = [
        {"key": s.key, "value": finite(s.last_value), "timestamp": stamp, "step": s.last_step}
        for s in run.metrics.values()
    ]
    info: dict[str, Any] = {
        "run_id": run.id,
        "run_uuid": run.id,
        "run_name": run.name,
        "experiment_id": experiment_id,
        "user_id": run.owner,
        "status": run_status(run),
        "start_time": ms(run.started_at or run.created_at),
        "artifact_uri": artifact_uri(run.id),
        "lifecycle_stage": "active",
    }
    if run.finished_at is not None and run.status != "running":
        info["end_time"] = ms(run.finished_at)
    data = {"metrics": metrics, "params": pairs({k: str(v) for k, v in params.items()}), "tags": pairs(tags)}
    return {"info": info, "data": data, "inputs": {}, "outputs": {}}


def finite(value: float) -> float | str:
    """protobuf's JSON for a double: NaN and ±inf as strings."""
    if math.isnan(value):
        return "NaN"
    if math.isinf(value):
        return "Infinity" if value > 0 else "-Infinity"
    return value


def flatten(spec: Mapping[str, Any], prefix: str = "") -> dict[str, str | None]:
    """A torchdeck spec's fields as dotted keys (`optim.lr`), their values as text."""
    out: dict[str, str | None] = {}
    for key, value in spec.items():
        name = f"{prefix}{key}"
        if isinstance(value, Mapping):
            out.update(flatten(value, f"{name}."))
        else:
            out[name] = None if value is None else str(value)
    return out
