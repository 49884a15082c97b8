"""The one gate every new run passes before it is stored, whichever way it is created: the New run form (a
clone and "start from a run's weights" are the form), `torchdeck submit`, a re-run (app/services/runs.py), "Repeat
with k seeds", a sweep's best launched again, and a sweep's base (app/services/sweeps.py). A sweep's trials, created
later by sweep.control (worker-side too), pass core.admission's rules against that admitted base, under the
limit stored with the sweep.

In order, each refusal naming what is wrong:
- bounds: the spec validated again as it will be stored (core.admission.bounded: SpecError per field);
- project, in team mode: the owner a member (or maintainer) of the project the runs go to (PermissionDenied);
- files: `data.path` and `model.weights_file` only under the allowed folders (app/services/paths.py: SpecError);
- quota, in team mode: the owner's queued runs and the new ones at most TORCHDECK_MAX_QUEUED_PER_OWNER
  (QueueLimitReached). Counted here to refuse before anything changes, and again in the transaction that
  stores the runs (db.runs.create_runs), so that concurrent submissions never overshoot.
"""

from __future__ import annotations

import os
from collections.abc import Sequence

from sqlalchemy import Engine

from app.services.projects import check_contribute
from core.admission import bounded
from core.config import RunSpec
from db import repo
from db.errors import QueueLimitReached
from db.types import DEFAULT_PROJECT, RunRecord

MAX_QUEUED_ENV = "TORCHDECK_MAX_QUEUED_PER_OWNER"
DEFAULT_MAX_QUEUED = 100


def max_queued_per_owner() -> int | None:
    """Team mode: how many queued runs one person may have (TORCHDECK_MAX_QUEUED_PER_OWNER, default 100; 0 for
    no limit). Local mode: no limit."""
    from app.auth import team_mode

    if not team_mode():
        return None
    raw = os.environ.get(MAX_QUEUED_ENV, "").strip()
    try:
        limit = int(raw) if raw else DEFAULT_MAX_QUEUED
    except ValueError:
        raise ValueError(f"{MAX_QUEUED_ENV}={raw!r} is not a whole number") from None
    return limit if limit > 0 else None


def admit(
    specs: Sequence[RunSpec],
    *,
    owner: str,
    engine: Engine,
    room_for: int | None = None,
    project: str = DEFAULT_PROJECT,
) -> list[RunSpec]:
    """The specs as they may be stored (bounds checked again, paths made absolute), or the refusal: SpecError
    naming each field, QueueLimitReached when the owner's queued runs and `room_for` more (default: one per
    spec) would be over the limit. Nothing is stored here."""
    from app.services.paths import check_paths
    from db.artifacts import local_run_root

    root = local_run_root()
    checked = [check_paths(bounded(spec), engine, root, project) for spec in specs]
    limit = max_queued_per_owner()
    adding = len(checked) if room_for is None else room_for
    if limit is not None:
        queued = repo.queued_count(engine, owner)
        if queued + adding > limit:
            raise QueueLimitReached(owner, queued, limit, adding)
    return checked


def store(
    specs: Sequence[RunSpec],
    *,
    owner: str,
    engine: Engine,
    names: Sequence[str | None] | None = None,
    tags: Sequence[str] = (),
    parent_id: str | None = None,
    group_id: str | None = None,
    priority: int = 0,
    project: str = DEFAULT_PROJECT,
) -> list[RunRecord]:
    """Admit the specs and store them as queued runs of `project`, all or none (each named by `names`, else by
    its spec), at `priority` (core.names.PRIORITIES' values). Team mode: the owner must be a member of the project
    (PermissionDenied; app.services.projects.check_contribute). Sending them to the queue is the caller's."""
    check_contribute(owner, project, engine)
    admitted = admit(specs, owner=owner, engine=engine, project=project)
    names = [s.name for s in admitted] if names is None else list(names)
    return repo.create_runs(
        engine,
        [(s.model_dump(mode="json"), n) for s, n in zip(admitted, names, strict=True)],
        owner=owner,
        tags=tags,
        parent_id=parent_id,
        group_id=group_id,
        max_queued=max_queued_per_owner(),
        priority=priority,
        project=project,
    )
