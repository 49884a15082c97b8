"""What the UI and the CLI do to runs: validate and submit, cancel, clone. No torch here:
runs are enqueued by task name, so the UI never imports the training code."""

from __future__ import annotations

import shutil
from collections.abc import Iterable

from sqlalchemy import Engine

from app.auth import PermissionDenied, User, check_can_modify, has_role
from app.services import admission
from app.services.artifacts import artifact_root, artifact_store
from app.services.broker import broker_url, enqueue, get_engine
from app.services.owners import owner_label
from app.services.projects import DEFAULT_PROJECT, ProjectHidden, check_read, with_roles
from core.config import RunSpec
from core.names import PRIORITIES
from core.redact import redact
from db.errors import RunRegistered
from db.repo import RunNotFound, RunRecord, RunStillActive, delete_run, get_run, request_cancel
from db.repo import follow as follow_run
from db.repo import set_notes as store_notes
from db.repo import set_priority as store_priority
from db.repo import set_tags as store_tags
from db.repo import set_tags_and_notes as store_tags_and_notes
from db.repo import unfollow as unfollow_run

BY_SCRIPT = "was logged by a script through the MLflow client"


class LoggedByScript(ValueError):
    """What torchdeck cannot do to a run a person's script logged (app/tracking/): it has no spec to clone, re-run or
    resume, and no worker to cancel it."""

    def __init__(self, run_id: str, why: str):
        super().__init__(f"run {run_id} {BY_SCRIPT}: {why}")
        self.run_id = run_id


NO_SPEC = "it has no spec to clone, re-run or resume"
NO_CANCEL = (
    "torchdeck cannot cancel it (no worker of torchdeck's runs it): stop the script, or end the run from it "
    '(mlflow.end_run("KILLED"))'
)


def submit(
    spec: RunSpec,
    *,
    name: str | None = None,
    owner: str = "local",
    tags: list[str] | None = None,
    parent_id: str | None = None,
    engine: Engine | None = None,
    priority: str = "normal",
    by: User | None = None,
    project: str = DEFAULT_PROJECT,
) -> RunRecord:
    """Store a validated spec as a queued run and enqueue it (the New run form, a clone, "start from a run's
    weights", `torchdeck submit`, a re-run). Invalid specs never get here: RunSpec validation happens first
    (the form and the CLI show each field's error). Refused by the gate of every new run (app.services.admission):
    a field out of bounds or a path the run may not read (SpecError) and, in team mode, an owner over the
    queued-runs limit (QueueLimitReached). `priority` (PRIORITIES' names) is an argument, not a spec field: it
    says when the run trains, not what it trains, so it stays out of the spec's hash and a clone does not inherit
    it; above normal only a maintainer of the project or an admin (`by`) may (PermissionDenied). The run goes to
    `project`, of which its owner must be a member in team mode (PermissionDenied)."""
    engine = engine or get_engine()
    check_priority(priority, by, project, engine)
    [run] = admission.store(
        [spec],
        owner=owner,
        engine=engine,
        names=[name or spec.name],
        tags=tags or [],
        parent_id=parent_id,
        priority=PRIORITIES[priority],
        project=project,
    )
    try:
        enqueue(run.id, spec)
    except Exception as e:
        from db.repo import finish_run

        where = redact(broker_url())
        finish_run(engine, run.id, "failed", error=redact(f"could not reach the queue at {where}: {e}"))
        raise RuntimeError(
            redact(
                f"the run was stored but the broker is unreachable ({where}): {e}. "
                "Is a worker stack running? Start it with `make up` or `torchdeck up`."
            )
        ) from e
    return run


def cancel(run_id: str, engine: Engine | None = None, *, by: User) -> RunRecord:
    """A queued run is cancelled at once (its message is refused when delivered); a running one stops between steps.
    Only the run's owner or an admin may (app.auth.PermissionDenied otherwise); a run a script logs is the script's
    to end (LoggedByScript)."""
    engine = engine or get_engine()
    if _may(by, run_id, "cancel", engine).external:
        raise LoggedByScript(run_id, NO_CANCEL)
    return request_cancel(engine, run_id)


def _may(by: User, run_id: str, action: str, engine: Engine) -> RunRecord:
    """The run, when `by` may `action` it (its owner while a member of its project, a maintainer of its project,
    an admin); PermissionDenied otherwise, or RunNotFound when they may not even see it."""
    run = readable_run(run_id, by=by, engine=engine)
    check_can_modify(with_roles(by, engine), run, action, owner_label(run.owner, engine))
    return run


def readable_run(run_id: str, *, by: User | None, engine: Engine | None = None) -> RunRecord:
    """The run, or RunNotFound when there is none or `by` may not see its project (team mode)."""
    engine = engine or get_engine()
    run = get_run(engine, run_id)
    try:
        check_read(with_roles(by, engine), run.project, f"run {run_id!r}")
    except ProjectHidden:
        raise RunNotFound(run_id) from None
    return run


def check_priority(
    priority: str, by: User | None, project: str = DEFAULT_PROJECT, engine: Engine | None = None
) -> None:
    """ValueError for a name not in PRIORITIES; PermissionDenied for a priority above normal unless `by` is a
    maintainer of the project or an admin (who may put a run before everyone else's)."""
    if priority not in PRIORITIES:
        raise ValueError(f"priority {priority!r}: one of {', '.join(PRIORITIES)}")
    if PRIORITIES[priority] > PRIORITIES["normal"] and not has_role(with_roles(by, engine), project, "maintainer"):
        who = by.describe() if by else "an anonymous user"
        raise PermissionDenied(
            f"{who} may not give a run {priority} priority: only a maintainer of project {project} or an admin may"
        )


def set_priority(run_id: str, priority: str, engine: Engine | None = None, *, by: User) -> RunRecord:
    """Move a queued run within its queue (db/queue_order.py): low, normal or high. Only the run's owner or an
    admin may, and only an admin above normal (PermissionDenied); ValueError once the run has left the queue."""
    engine = engine or get_engine()
    run = _may(by, run_id, "reprioritise", engine)
    check_priority(priority, by, run.project, engine)
    changed = store_priority(engine, run_id, PRIORITIES[priority])
    if changed is None:
        raise ValueError(f"run {run_id} is {get_run(engine, run_id).status}: only a queued run's priority changes")
    return changed


def set_tags(run_id: str, tags: Iterable[str], engine: Engine | None = None, *, by: User) -> RunRecord:
    """Replace a run's tags, at any time after launch. Only the run's owner or an admin may (PermissionDenied)."""
    engine = engine or get_engine()
    _may(by, run_id, "tag", engine)
    return store_tags(engine, run_id, tags)


def set_notes(run_id: str, notes: str, engine: Engine | None = None, *, by: User) -> RunRecord:
    """Replace a run's notes (plain text, at most db.types.NOTES_LEN characters: ValueError beyond; blank clears
    them). Only the run's owner or an admin may (PermissionDenied)."""
    engine = engine or get_engine()
    _may(by, run_id, "annotate", engine)
    return store_notes(engine, run_id, notes)


def set_tags_and_notes(
    run_id: str, tags: Iterable[str], notes: str, engine: Engine | None = None, *, by: User
) -> RunRecord:
    """Replace a run's tags and notes together (the Run page's "Edit tags & notes"): both checked, then written
    in one transaction, so a refused or failed save changes neither. Only the run's owner or an admin may
    (PermissionDenied); ValueError for a bad tag or notes; RunNotFound for a run deleted meanwhile."""
    engine = engine or get_engine()
    _may(by, run_id, "tag", engine)
    return store_tags_and_notes(engine, run_id, tags, notes)


def follow(run_id: str, engine: Engine | None = None, *, by: User) -> bool:
    """`by` follows the run (anyone who may see it; the dashboard then tells them when it ends); True when the
    follow is new. RunNotFound for a run deleted meanwhile, or of a project they may not see."""
    engine = engine or get_engine()
    readable_run(run_id, by=by, engine=engine)
    return follow_run(engine, by.id, run_id)


def unfollow(run_id: str, engine: Engine | None = None, *, by: User) -> bool:
    """`by` no longer follows the run; True when they did."""
    return unfollow_run(engine or get_engine(), by.id, run_id)


def remove(run_id: str, engine: Engine | None = None, *, by: User) -> list[str]:
    """Delete a finished run with its rows and its files under the artifact root. Only the run's owner or an
    admin may (app.auth.PermissionDenied otherwise); a run holding a registered model version's files is refused
    (db.errors.RunRegistered). A script's lost run (the script is gone) is ended as cancelled first."""
    engine = engine or get_engine()
    run = _may(by, run_id, "delete", engine)
    if run.external and run.status == "lost":
        from db.external import end

        end(engine, run_id, "KILLED")
    uris = delete_run(engine, run_id)
    artifact_store().delete_prefix(f"runs/{run_id}")  # the run's files in the store (local folder or bucket)
    root = artifact_root()
    run_dir = root / "runs" / run_id
    if run_dir.is_dir() and root in run_dir.resolve().parents:  # this host's working copy, if any
        shutil.rmtree(run_dir)
    return uris


def rerun(run_id: str, *, owner: str, engine: Engine | None = None) -> RunRecord:
    """The same spec again, as a new queued run of the same project whose parent is the original, owned by whoever
    re-runs it (a re-run is a clone: any member of the project may make one). Through the same gate as any new
    run (submit). A run a script logged has no spec to run again (LoggedByScript)."""
    engine = engine or get_engine()
    r = get_run(engine, run_id)
    return submit(
        spec_of(r), name=r.name, owner=owner, tags=list(r.tags), parent_id=r.id, engine=engine, project=r.project
    )


def refused_removal(run_id: str, *, by: User, engine: Engine | None = None) -> str | None:
    """Delete a run (remove); returns why that was refused, or None when it is gone."""
    try:
        remove(run_id, engine=engine, by=by)
    except PermissionDenied as e:
        return str(e)
    except RunStillActive:
        if _external(run_id, engine):
            return f"run {run_id} is still being logged by its script: delete it once the script has ended it"
        return f"run {run_id} is still running: cancel it first"
    except RunRegistered as e:
        return str(e)
    except RunNotFound:
        return None
    return None


def _external(run_id: str, engine: Engine | None) -> bool:
    try:
        return get_run(engine or get_engine(), run_id).external
    except RunNotFound:
        return False


def spec_of(run: RunRecord) -> RunSpec:
    """The run's spec, to run it again (re-run, clone, resume); LoggedByScript for a run a script logged."""
    if run.external:
        raise LoggedByScript(run.id, NO_SPEC)
    return RunSpec.model_validate(dict(run.spec))
