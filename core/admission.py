"""The rules a new run passes before it is stored that need no dashboard: the ones sweep.control applies to a
sweep's trials, worker-side too (a worker knows neither the dashboard's folders nor its settings).

Every way a run is created goes through one gate (app/services/admission.py): the New run form (a clone and "start
from a run's weights" are the form), `torchdeck submit`, a re-run, "Repeat with k seeds", a sweep's best
launched again, and a sweep, whose base is admitted there. Its parts:

- bounds: the spec is validated again exactly as it will be stored (`bounded`): a copy made with
  `model_copy` (another seed, a checked path) skips pydantic's validation;
- files: the fields that name what a run reads or downloads into (FILE_FIELDS) are checked against the
  allowed folders by the dashboard (app/services/paths.py). They are never swept, and a sweep's trial must read
  exactly what its base was admitted to read (`check_trial`), so the controller needs no folder list;
- quota: the owner's queued runs, counted by the database in the transaction that stores the new ones
  (db.runs.create_runs, db.sweeps.add_trial), with the limit the dashboard set (a sweep stores it).

Torch-free, and never imports app/ (sweep/ and worker/ use it).
"""

from __future__ import annotations

from typing import Any

from core.config import RunSpec
from core.overrides import SpecError

# Fields naming a file or a dataset (a folder read, a torchvision root downloaded into, a state_dict loaded).
# data.name and data.download belong here: together with data.path they decide whether a folder is read as
# an image folder or written into by a download (app/services/paths.py accepts an uploaded dataset as the former only).
FILE_FIELDS = ("data.name", "data.path", "data.download", "data.test_path", "model.weights_file")


def value_at(spec: RunSpec, dotted: str) -> Any:
    node: Any = spec
    for part in dotted.split("."):
        node = getattr(node, part)
    return node


def bounded(spec: RunSpec) -> RunSpec:
    """The spec validated again from the data that will be stored: SpecError naming each field out of bounds."""
    return RunSpec.from_dict(spec.model_dump(mode="json"))


def trial_problems(trial: RunSpec, base: RunSpec) -> list[tuple[str, str]]:
    """(field, message) for each file-naming field in which a sweep's trial differs from its base."""
    return [
        (
            f,
            f"a sweep's trial reads what its base was admitted to read: {value_at(trial, f)!r} is not the "
            f"base's {value_at(base, f)!r} (this field names a file or a dataset and is never swept)",
        )
        for f in FILE_FIELDS
        if value_at(trial, f) != value_at(base, f)
    ]


def check_trial(trial: RunSpec, base: RunSpec) -> RunSpec:
    """The trial's spec as it may be stored (bounds checked again), or SpecError naming each field that is out
    of bounds or names another file than its base."""
    checked = bounded(trial)
    problems = trial_problems(checked, base)
    if problems:
        raise SpecError(problems)
    return checked
