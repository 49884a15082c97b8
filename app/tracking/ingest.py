"""What a script logs into its run: metrics, params and tags, one at a time or in a batch (log-batch: the hot path
of every MLflow integration).

A request is checked whole against MLflow's bounds (app/tracking/protocol.py) before anything is written, then
written in one transaction by db.external.log: the metric points through torchdeck's own batched, idempotent
append (a point per key and step: the first value stored at a step is kept, so a client's retry of a batch, which
MLflow's client makes on a lost answer or a 5xx, never duplicates a point), params written once (the same value again
is fine, another value is refused, as MLflow does), tags set or deleted. Each request is also the run's heartbeat."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from app.tracking.protocol import (
    MAX_BATCH_ITEMS,
    MAX_BATCH_METRICS,
    MAX_BATCH_PARAMS,
    MAX_BATCH_TAGS,
    MAX_PARAM_VALUE,
    MAX_STEP,
    MAX_TAG_VALUE,
    MlflowError,
    as_float,
    as_int,
    check_key,
    check_metric_key,
    check_step,
    check_value,
    invalid,
    required,
)
from app.tracking.runs import writable
from db import external
from db.types import MetricPoint


def metric(item: Any) -> MetricPoint:
    """One MLflow metric ({key, value, timestamp in ms, step}) as torchdeck's point."""
    return metrics([item])[0]


def metrics(items: list[Any]) -> list[MetricPoint]:
    """MLflow metrics as torchdeck's points, each checked (a key once per request: a batch repeats a few keys)."""
    keys: set[str] = set()
    points = []
    for item in items:
        if type(item) is not dict:
            raise invalid(f"a metric is {{'key', 'value', 'timestamp', 'step'}}, not {item!r}")
        key, value, timestamp, step = item.get("key"), item.get("value"), item.get("timestamp"), item.get("step")
        if key not in keys:
            keys.add(check_metric_key(key))
        if type(value) is not float:  # JSON's whole numbers, and protobuf's "NaN" / "Infinity"
            value = as_float(value, f"metric '{key}' value")
        if type(timestamp) is not int:
            timestamp = as_int(timestamp, f"metric '{key}' timestamp", default=0)
        if type(step) is not int:
            step = as_int(step, f"metric '{key}' step", default=0)
        if not 0 <= step <= MAX_STEP:
            check_step(step)
        points.append(MetricPoint(key, step, value, None, timestamp / 1000 if timestamp else None))
    return points


def pairs(items: Any, what: str, limit: int) -> dict[str, str]:
    """MLflow's [{key, value}] list as a dict; a key twice in one request with two values is refused."""
    out: dict[str, str] = {}
    for item in items or ():
        if not isinstance(item, Mapping):
            raise invalid(f"a {what} is {{'key': ..., 'value': ...}}, not {item!r}")
        key = check_key(item.get("key"), what)
        value = check_value(item.get("value"), key, what, limit)
        if out.get(key, value) != value:
            raise invalid(f"{what} '{key}' is given twice in one request with two values")
        out[key] = value
    return out


def _write(ctx, run_id: Any, **what: Any) -> dict[str, Any]:
    run = writable(ctx, run_id)
    try:
        external.log(ctx.engine, run.id, **what)
    except external.ParamChanged as e:
        raise invalid(str(e)) from None
    except ValueError as e:
        raise invalid(str(e)) from None
    return {}


def log_metric(ctx, body: Mapping[str, Any]) -> dict[str, Any]:
    point = metric({k: body.get(k) for k in ("key", "value", "timestamp", "step")})
    return _write(ctx, required(body, "run_id", "run_uuid"), points=[point])


def log_param(ctx, body: Mapping[str, Any]) -> dict[str, Any]:
    key = check_key(required(body, "key"), "param")
    params = {key: check_value(body.get("value"), key, "param", MAX_PARAM_VALUE)}
    return _write(ctx, required(body, "run_id", "run_uuid"), params=params)


def set_tag(ctx, body: Mapping[str, Any]) -> dict[str, Any]:
    key = check_key(required(body, "key"), "tag")
    tags = {key: check_value(body.get("value"), key, "tag", MAX_TAG_VALUE)}
    name = tags[key] if key == "mlflow.runName" and tags[key] else None
    return _write(ctx, required(body, "run_id", "run_uuid"), tags=tags, name=name)


def delete_tag(ctx, body: Mapping[str, Any]) -> dict[str, Any]:
    key = check_key(required(body, "key"), "tag")
    run = writable(ctx, required(body, "run_id"))
    if key not in (run.spec.get("tags") or {}):
        raise MlflowError("RESOURCE_DOES_NOT_EXIST", f"No tag with name: {key} in run with id {run.id}")
    return _write(ctx, run.id, deleted_tags=[key])


def log_batch(ctx, body: Mapping[str, Any]) -> dict[str, Any]:
    """Up to 1,000 metrics, 100 params and 100 tags (1,000 items in all) in one transaction."""
    raw_metrics, raw_params, raw_tags = (body.get(k) or [] for k in ("metrics", "params", "tags"))
    for items, limit, what in (
        (raw_metrics, MAX_BATCH_METRICS, "metrics"),
        (raw_params, MAX_BATCH_PARAMS, "params"),
        (raw_tags, MAX_BATCH_TAGS, "tags"),
    ):
        if not isinstance(items, list):
            raise invalid(f"'{what}' is a list")
        if len(items) > limit:
            raise invalid(f"A batch logging request can contain at most {limit} {what}. Got {len(items)} {what}.")
    total = len(raw_metrics) + len(raw_params) + len(raw_tags)
    if total > MAX_BATCH_ITEMS:
        raise invalid(
            f"A batch logging request can contain at most {MAX_BATCH_ITEMS} metrics, params and tags in all. "
            f"Got {total}."
        )
    points = metrics(raw_metrics)
    params = pairs(raw_params, "param", MAX_PARAM_VALUE)
    tags = pairs(raw_tags, "tag", MAX_TAG_VALUE)
    name = tags.get("mlflow.runName") or None
    return _write(ctx, required(body, "run_id"), points=points, params=params, tags=tags, name=name)
