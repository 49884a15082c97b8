"""Which files a run may read: the spec's `data.path`, `data.test_path` and `model.weights_file`, checked before a
run is stored or a pre-flight is sent, so that nobody reads the host's files through a run.

- Team mode: a `data.path` must be an uploaded (registered) dataset, a `model.weights_file` a file under the
  artifact root (a run's checkpoint), unless the operator lists other folders in TORCHDECK_PATH_ROOTS.
- Local mode: anything under the data folder ($TORCHDECK_HOME), the current folder, $TORCHDECK_DATA and the
  folders in TORCHDECK_PATH_ROOTS.

Paths are compared after resolving links and `..`, so a link out of a root is outside it, and stored absolute,
so the worker reads what was checked. A refusal names the field and the allowed folders, never what lies
outside them. Workers do not check again: they run what the queue gives them (see SECURITY.md).
"""

from __future__ import annotations

import os
from pathlib import Path

from sqlalchemy import Engine

from app.auth import team_mode
from core import catalog
from core.config import RunSpec, SpecError
from db.engine import data_home
from db.repo import list_datasets

ROOTS_ENV = "TORCHDECK_PATH_ROOTS"  # extra folders runs may read, separated by os.pathsep (':')


def _resolved(path: str | Path) -> Path:
    return Path(path).expanduser().resolve()


def extra_roots() -> list[Path]:
    return [_resolved(p) for p in os.environ.get(ROOTS_ENV, "").split(os.pathsep) if p.strip()]


def data_roots() -> list[Path]:
    """Folders any `data.path` may lie under (besides the registered datasets)."""
    roots = extra_roots()
    if not team_mode():
        roots += [_resolved(data_home()), _resolved(Path.cwd())]
        if os.environ.get("TORCHDECK_DATA"):
            roots.append(_resolved(os.environ["TORCHDECK_DATA"]))
    return roots


def weights_roots(artifact_root: Path) -> list[Path]:
    """Folders a `model.weights_file` may lie under: the artifact root (runs' checkpoints) and the data roots."""
    return [_resolved(artifact_root), *data_roots()]


def _inside(path: Path, roots: list[Path]) -> bool:
    return any(path == root or root in path.parents for root in roots)


def _registered(path: Path, engine: Engine, project: str | None) -> bool:
    return any(_resolved(d.uri) == path for d in list_datasets(engine, status="ready", project=project))


def _other_projects_run(path: Path, artifact_root: Path, engine: Engine, project: str | None) -> str | None:
    """The id of the run whose folder under the artifact root holds `path`, when that run is of another project
    than `project` (None: any, or a file that is no run's)."""
    from db.projects import project_of

    root = _resolved(artifact_root)
    if project is None or root not in path.parents:
        return None
    parts = path.relative_to(root).parts  # runs/<run id>/… (db.artifacts' layout)
    run_id = parts[1] if len(parts) > 1 and parts[0] == "runs" else parts[0]
    found = project_of(engine, "run", run_id)
    return run_id if found is not None and found != project else None


def _refusal(field: str, roots: list[Path], hint: str) -> tuple[str, str]:
    where = ", ".join(str(r) for r in roots) or "none configured"
    return field, f"this path is outside the folders runs may read ({where}): {hint}"


def path_problems(
    spec: RunSpec, engine: Engine, artifact_root: Path, project: str | None = None
) -> list[tuple[str, str]]:
    """(field, message) for each path in the spec that a run may not read. With `project` (team mode: the
    project the run goes to), an uploaded dataset or a run's checkpoint counts only when it is of that project."""
    problems = []
    for field, value in (("data.path", spec.data.path), ("data.test_path", spec.data.test_path)):
        if not value:
            continue
        path = _resolved(value)
        roots = data_roots()
        # An uploaded dataset is an image folder to read: never a torchvision root to download into.
        registered = catalog.is_folder(spec.data.name) and _registered(path, engine, project)
        if not (_inside(path, roots) or registered):
            hint = (
                f"choose an uploaded dataset of project {project} (Datasets page)"
                if team_mode() and project is not None
                else "choose an uploaded dataset (Datasets page)"
                if team_mode()
                else f"move the data under one of them, or add its folder to {ROOTS_ENV}"
            )
            problems.append(_refusal(field, roots, hint))
    if spec.model.weights_file:
        path = _resolved(spec.model.weights_file)
        roots = weights_roots(artifact_root)
        if not _inside(path, roots):
            problems.append(
                _refusal(
                    "model.weights_file",
                    roots,
                    f"use a run's checkpoint, or ask the operator to add the folder to {ROOTS_ENV}",
                )
            )
        elif team_mode() and (other := _other_projects_run(path, artifact_root, engine, project)) is not None:
            problems.append(
                ("model.weights_file", f"this is a checkpoint of run {other}, of another project than {project}")
            )
    return problems


def check_paths(spec: RunSpec, engine: Engine, artifact_root: Path, project: str | None = None) -> RunSpec:
    """The spec with its paths made absolute (a worker elsewhere, or in another folder, reads what was checked),
    or SpecError (a ValueError naming each field) when it reads files it may not (path_problems; `project`: the
    project whose datasets and checkpoints it may read, in team mode)."""
    problems = path_problems(spec, engine, artifact_root, project if team_mode() else None)
    if problems:
        raise SpecError(problems)
    data, model = spec.data, spec.model
    if data.path:
        data = data.model_copy(update={"path": _absolute(data.path)})
    if data.test_path:
        data = data.model_copy(update={"test_path": _absolute(data.test_path)})
    if model.weights_file:
        model = model.model_copy(update={"weights_file": _absolute(model.weights_file)})
    return spec.model_copy(update={"data": data, "model": model})


def _absolute(path: str) -> str:
    """Relative to this process's folder, as it was checked; links kept (an uploaded dataset keeps the path
    it is registered under, which workers on other hosts look up)."""
    p = Path(path).expanduser()
    return str(p if p.is_absolute() else Path.cwd() / p)
