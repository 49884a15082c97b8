"""MLflow's runs: create, get, update, delete, search, and a metric's history.

A run a script creates is a torchdeck run of source `mlflow` (db/external.py) in the experiment's project, owned by
the person who logs (local mode: this machine's user; team mode: the API token's person), who must be allowed to
contribute to the project as for any new run. Reading a run (get, search, history) takes what the pages take: a
role in its project; torchdeck's own runs are read too (their spec's fields as params). Writing (log, update,
delete) takes what cancelling a run on the pages takes: its owner, a maintainer of its project, or an admin; and
only a script's run is written this way (a torchdeck run is its worker's)."""

from __future__ import annotations

import os
import posixpath
from collections.abc import Mapping
from typing import Any

from app import auth
from app.services import projects
from app.services import runs as run_service
from app.services.projects import ProjectHidden
from app.tracking import experiments
from app.tracking.protocol import (
    DEFAULT_RESULTS,
    MAX_RESULTS,
    MAX_TAG_VALUE,
    MlflowError,
    as_int,
    check_key,
    check_value,
    finite,
    from_ms,
    invalid,
    missing,
    ms,
    required,
    run_json,
)
from app.tracking.search import matches, offset_of, order_keys, page, parse, token_of
from db import external
from db.errors import RunNotFound, RunRegistered
from db.listing import MAX_PAGE, list_runs
from db.projects import ProjectNotFound
from db.types import RunRecord

MAX_RUNNING_ENV = "TORCHDECK_MAX_SCRIPT_RUNS_PER_OWNER"  # a person's scripts' runs running at once (default 100)
# A search reads at most this many runs of the experiments it names, newest first, before it filters them.
SEARCH_SCAN = 100_000


def readable(ctx, run_id: Any) -> RunRecord:
    """The run, if the person may see it: RESOURCE_DOES_NOT_EXIST otherwise, as for one that does not exist."""
    try:
        return run_service.readable_run(str(run_id), by=ctx.user, engine=ctx.engine)
    except (RunNotFound, LookupError):
        raise missing(f"Run with id={run_id}") from None


def writable(ctx, run_id: Any) -> external.RunHead:
    """The run, if it is a script's and the person may write it (its owner, a maintainer of its project, an admin):
    read as its head only (log-batch asks this at every call)."""
    try:
        run = external.head(ctx.engine, str(run_id))
        projects.check_read(ctx.user, run.project, f"run {run_id}")
    except (RunNotFound, ProjectHidden):
        raise missing(f"Run with id={run_id}") from None
    if not run.external:
        raise MlflowError(
            "INVALID_STATE",
            f"run {run.id} was launched by torchdeck: only its worker writes to it (log into a run your script "
            "created)",
        )
    if not auth.can_modify(ctx.user, run):
        who = ctx.user.describe() if ctx.user else "this request"
        raise MlflowError(
            "PERMISSION_DENIED",
            f"{who} may not write to run {run.id}: it is {run.owner}'s (its owner, a maintainer of project "
            f"{run.project} or an admin may)",
        )
    return run


def answer(run: RunRecord) -> dict[str, Any]:
    return {"run": run_json(run, experiments.experiment_id(run.project))}


def create(ctx, body: Mapping[str, Any]) -> dict[str, Any]:
    project = experiments.project_of_id(body.get("experiment_id") or experiments.DEFAULT_ID)
    experiments.readable_project(ctx, project)
    tags = _tags(body.get("tags"))
    name = str(body.get("run_name") or tags.get("mlflow.runName") or _script_name(tags) or "") or None
    try:
        projects.check_contribute(ctx.user.id, project, ctx.engine)
    except ProjectNotFound:
        raise missing(f"Experiment with id '{experiments.experiment_id(project)}'") from None
    except auth.PermissionDenied as e:
        raise MlflowError("PERMISSION_DENIED", str(e)) from None
    try:
        run = external.create_run(
            ctx.engine,
            owner=ctx.user.id,
            project=project,
            name=name,
            tags=tags,
            started_at=from_ms(body.get("start_time"), "start_time"),
            max_running=max_running(),
        )
    except external.TooManyRunning as e:
        raise MlflowError("INVALID_STATE", str(e)) from None
    except ValueError as e:
        raise invalid(str(e)) from None
    return answer(run)


def max_running() -> int:
    raw = os.environ.get(MAX_RUNNING_ENV, "").strip() or "100"
    try:
        return max(int(raw), 1)
    except ValueError:
        raise MlflowError("INTERNAL_ERROR", f"{MAX_RUNNING_ENV}={raw!r} is not a whole number") from None


def _tags(raw: Any) -> dict[str, str]:
    tags: dict[str, str] = {}
    for tag in raw or ():
        if not isinstance(tag, Mapping):
            raise invalid(f"a tag is {{'key': ..., 'value': ...}}, not {tag!r}")
        key = check_key(tag.get("key"), "tag")
        tags[key] = check_value(tag.get("value"), key, "tag", MAX_TAG_VALUE)
    return tags


def _script_name(tags: Mapping[str, str]) -> str | None:
    source = tags.get("mlflow.source.name")
    return posixpath.basename(source.replace("\\", "/")) or None if source else None


def get(ctx, body: Mapping[str, Any]) -> dict[str, Any]:
    return answer(readable(ctx, required(body, "run_id", "run_uuid")))


def update(ctx, body: Mapping[str, Any]) -> dict[str, Any]:
    """A script's word on its run: its end (FINISHED, FAILED, KILLED), RUNNING again, and/or a new name."""
    run = writable(ctx, required(body, "run_id", "run_uuid"))
    try:
        if body.get("run_name"):
            external.rename(ctx.engine, run.id, str(body["run_name"]))
        if body.get("status"):
            external.end(ctx.engine, run.id, str(body["status"]), ended_at=from_ms(body.get("end_time"), "end_time"))
    except ValueError as e:
        raise invalid(str(e)) from None
    info = answer(readable(ctx, run.id))["run"]["info"]
    return {"run_info": info}


def delete(ctx, body: Mapping[str, Any]) -> dict[str, Any]:
    """The run and its files, gone (torchdeck keeps no deleted runs to restore). A running one is ended first."""
    run = writable(ctx, required(body, "run_id"))
    if not run.finished:
        external.end(ctx.engine, run.id, "KILLED")
    try:
        run_service.remove(run.id, ctx.engine, by=ctx.user)
    except RunRegistered as e:
        raise MlflowError("INVALID_STATE", str(e)) from None
    return {}


def search(ctx, body: Mapping[str, Any]) -> dict[str, Any]:
    """Runs of the experiments named that the person may read, filtered, ordered (default: newest first), paged."""
    limit = as_int(body.get("max_results"), "max_results", default=DEFAULT_RESULTS)
    if not 1 <= limit <= MAX_RESULTS:
        raise invalid(f"max_results {limit}: from 1 to {MAX_RESULTS}")
    clauses = parse(str(body.get("filter") or ""))
    order = order_keys(body.get("order_by") or ())
    if str(body.get("run_view_type") or "ACTIVE_ONLY").upper() == "DELETED_ONLY":
        return {"runs": []}  # torchdeck deletes a run outright
    made: dict[str, dict[str, Any]] = {}  # each run's JSON, made once: filters, order and answer read it

    def value(entity: str, key: str, run: RunRecord) -> Any:
        if run.id not in made:
            made[run.id] = run_json(run, experiments.experiment_id(run.project))
        return _value(entity, key, run, made[run.id])

    found: list[RunRecord] = []
    for experiment in body.get("experiment_ids") or ():
        project = experiments.project_of_id(experiment)
        try:
            experiments.readable_project(ctx, project)
        except MlflowError:
            continue  # as MLflow: an experiment that is not there has no runs
        found += [r for r in _scan(ctx, project) if all(matches(c, value(c.entity, c.key, r)) for c in clauses)]
    found.sort(key=lambda r: (-(ms(r.started_at or r.created_at) or 0), r.id))
    for entity, key, descending in reversed(order):  # stable sorts, the first order key last
        keyed = [(value(entity, key, r), r) for r in found]
        have = sorted(((_sortable(v), r) for v, r in keyed if v is not None), key=lambda p: p[0], reverse=descending)
        found = [r for _, r in have] + [r for v, r in keyed if v is None]
    chosen, token = page(found, limit, body.get("page_token"))
    runs = [made.get(r.id) or answer(r)["run"] for r in chosen]
    return {"runs": runs, **({"next_page_token": token} if token else {})}


def _scan(ctx, project: str) -> list[RunRecord]:
    runs: list[RunRecord] = []
    while len(runs) < SEARCH_SCAN:
        batch = list_runs(ctx.engine, project=project, limit=MAX_PAGE, offset=len(runs)).runs
        runs += batch
        if len(batch) < MAX_PAGE:
            break
    return runs


def _value(entity: str, key: str, run: RunRecord, data: Mapping[str, Any]) -> Any:
    """What a filter or order key reads of a run (`data`: the run's JSON)."""
    if entity == "metric":
        summary = run.metrics.get(key)
        return None if summary is None else summary.last_value
    if entity == "param":
        return next((p["value"] for p in data["data"]["params"] if p["key"] == key), None)
    if entity == "tag":
        return next((t["value"] for t in data["data"]["tags"] if t["key"] == key), None)
    info = data["info"]
    aliases = {"run_name": "run_name", "name": "run_name", "status": "status", "run_id": "run_id", "user_id": "user_id"}
    if key in aliases:
        return info.get(aliases[key])
    if key in ("start_time", "end_time", "artifact_uri", "lifecycle_stage"):
        return info.get(key)
    raise invalid(f"Invalid attribute key '{key}': run_name, status, run_id, user_id, start_time or end_time")


def _sortable(value: Any) -> tuple[int, Any]:
    try:
        return (0, float(value))
    except (TypeError, ValueError):
        return (1, str(value))


def history(ctx, body: Mapping[str, Any]) -> dict[str, Any]:
    """Every point of one series of a run, by step (`max_results` a page, at most 25,000)."""
    run = readable(ctx, required(body, "run_id", "run_uuid"))
    key = str(required(body, "metric_key"))
    limit = as_int(body.get("max_results"), "max_results", default=25_000)
    if not 1 <= limit <= 25_000:
        raise invalid(f"max_results {limit}: from 1 to 25000")
    offset = offset_of(body.get("page_token"))
    points = external.history(ctx.engine, run.id, key, offset=offset, limit=limit + 1)
    metrics = [
        {"key": key, "value": finite(p.value), "timestamp": int((p.wall_time or 0) * 1000), "step": p.step}
        for p in points[:limit]
    ]
    more = len(points) > limit
    return {"metrics": metrics, **({"next_page_token": token_of(offset + limit)} if more else {})}


def logged_models(ctx, body: Mapping[str, Any]) -> dict[str, Any]:
    """MLflow 3's logged models: torchdeck does not take them (logged-models/create is not answered: a model is
    delivered through torchdeck's registry from a torchdeck run), so a search finds none. The client searches them
    when it lists a run's files under a folder."""
    for experiment in body.get("experiment_ids") or ():
        experiments.readable_project(ctx, experiments.project_of_id(experiment))
    return {"models": []}
