"""MLflow's experiments are torchdeck's projects.

An experiment's id is its project's name, except the default project's, which is MLflow's default experiment:
id "0", named "Default" (a script that names no experiment logs into it). An experiment's name is its project's
name; a name a script gives is made a project name the way people write them in URLs (`My Experiment` →
`my-experiment`: lower case, runs of other characters a dash), so that `mlflow.set_experiment("My Experiment")`
finds, or makes, the project `my-experiment` every time. Making an experiment makes a project, its maker its
maintainer, as on the Project page (any member of the dashboard may). A person sees only the experiments of the
projects they may read: another project is "not found", in the same words as one that does not exist."""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from app.services import projects
from app.services.projects import ProjectHidden
from app.tracking.protocol import (
    DEFAULT_RESULTS,
    MAX_RESULTS,
    MlflowError,
    as_int,
    experiment_json,
    invalid,
    missing,
    required,
)
from app.tracking.search import Clause, matches, page, parse
from db.projects import ProjectNotFound, ProjectRecord
from db.types import DEFAULT_PROJECT, PROJECT_LEN

DEFAULT_ID = "0"
DEFAULT_NAME = "Default"


def project_name(name: str) -> str:
    """The project an experiment name stands for (INVALID_PARAMETER_VALUE when nothing of it is left)."""
    if name.strip().lower() == DEFAULT_NAME.lower():
        return DEFAULT_PROJECT
    slug = re.sub(r"[^a-z0-9]+", "-", name.strip().lower()).strip("-")[:PROJECT_LEN].strip("-")
    if not slug:
        raise invalid(
            f"experiment name {name!r}: torchdeck makes it a project name (letters, digits and dashes), and nothing "
            "of it is left"
        )
    return slug


def project_of_id(experiment_id: Any) -> str:
    text = str(experiment_id)
    return DEFAULT_PROJECT if text in (DEFAULT_ID, "") else text


def experiment_id(project: str) -> str:
    return DEFAULT_ID if project == DEFAULT_PROJECT else project


def _json(record: ProjectRecord) -> dict[str, Any]:
    name = DEFAULT_NAME if record.name == DEFAULT_PROJECT else record.name
    return experiment_json(experiment_id(record.name), name, record.created_at, record.description)


def readable_project(ctx, project: str) -> ProjectRecord:
    """The project, if the person may read it: RESOURCE_DOES_NOT_EXIST otherwise, as for none."""
    try:
        projects.check_read(ctx.user, project, f"experiment {project}")
        return projects.get(project, by=ctx.user, engine=ctx.engine)
    except (ProjectHidden, ProjectNotFound, LookupError):
        raise missing(f"Experiment with id '{experiment_id(project)}'") from None


def get(ctx, body: Mapping[str, Any]) -> dict[str, Any]:
    record = readable_project(ctx, project_of_id(required(body, "experiment_id")))
    return {"experiment": _json(record)}


def get_by_name(ctx, body: Mapping[str, Any]) -> dict[str, Any]:
    name = str(required(body, "experiment_name"))
    try:
        record = readable_project(ctx, project_name(name))
    except MlflowError:
        raise missing(f"Experiment {name!r}") from None
    return {"experiment": _json(record)}


def create(ctx, body: Mapping[str, Any]) -> dict[str, Any]:
    name = str(required(body, "name"))
    project = project_name(name)
    description = ""
    for tag in body.get("tags") or ():
        if isinstance(tag, Mapping) and tag.get("key") == "mlflow.note.content":
            description = str(tag.get("value") or "")
    try:
        record = projects.create(project, by=ctx.user, description=description, engine=ctx.engine)
    except ValueError as e:
        if "taken" in str(e) or "exists" in str(e):
            raise MlflowError("RESOURCE_ALREADY_EXISTS", f"Experiment '{name}' already exists.") from None
        raise invalid(str(e)) from None
    return {"experiment_id": experiment_id(record.name)}


def search(ctx, body: Mapping[str, Any]) -> dict[str, Any]:
    """Experiments the person may read, by name; `filter` on `name` (=, !=, LIKE, ILIKE) and `tags.*`."""
    limit = as_int(body.get("max_results"), "max_results", default=DEFAULT_RESULTS)
    if not 1 <= limit <= MAX_RESULTS:
        raise invalid(f"max_results {limit}: from 1 to {MAX_RESULTS}")
    clauses = parse(str(body.get("filter") or ""))
    for clause in clauses:
        if clause.entity not in ("attribute", "tag") or (clause.entity == "attribute" and clause.key != "name"):
            raise invalid(f"experiments are searched by name or tags.*, not {clause.entity}.{clause.key}")
    if str(body.get("view_type") or "ACTIVE_ONLY").upper() == "DELETED_ONLY":
        return {"experiments": []}
    found = [_json(r) for r in projects.readable(ctx.user, ctx.engine)]
    found = [e for e in found if all(_matches(clause, e) for clause in clauses)]
    chosen, token = page(sorted(found, key=lambda e: e["name"]), limit, body.get("page_token"))
    return {"experiments": chosen, **({"next_page_token": token} if token else {})}


def _matches(clause: Clause, experiment: Mapping[str, Any]) -> bool:
    if clause.entity == "attribute":
        return matches(clause, experiment["name"])
    tags = {t["key"]: t["value"] for t in experiment["tags"]}
    return matches(clause, tags.get(clause.key))
