"""What the UI and the CLI do to sweeps and seed groups: validate and launch, cancel, read the state, launch
the best configuration, repeat a run with k seeds, estimate the compute. Torch-free (sweep.* uses Optuna on
the stored trials; runs are enqueued by task name like every run)."""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from dataclasses import dataclass

from sqlalchemy import Engine

from app.auth import ADMINS_ENV, PermissionDenied, User, can_modify
from app.services import admission
from app.services.broker import enqueue, get_engine
from app.services.owners import owner_label
from app.services.projects import DEFAULT_PROJECT, ProjectHidden, check_contribute, check_read, with_roles
from app.services.runs import check_priority
from core.config import RunSpec
from core.names import PRIORITIES
from db import repo
from db.types import RunRecord, SweepRecord
from sweep import control, study
from sweep.spec import SweepSpec


def send(run: RunRecord) -> None:
    enqueue(run.id, RunSpec.model_validate(run.spec))


def submit_sweep(
    spec: SweepSpec,
    *,
    owner: str,
    name: str | None = None,
    tags: Sequence[str] = (),
    engine: Engine | None = None,
    priority: str = "normal",
    by: User | None = None,
    project: str = DEFAULT_PROJECT,
) -> SweepRecord:
    """Store the sweep and queue its first trials. The sweep is validated again (its space never names a file,
    its grid is sized first); its base passes the gate of every new run (app.services.admission: bounds, the paths it
    reads, room under the owner's queued-runs limit for its first configuration's runs). Its trials are
    created by sweep.control under the same limit, stored with the sweep, each reading what the base reads, queued
    at `priority` (above normal: a maintainer's of the project or an admin's, `by`; PermissionDenied), in `project`
    (team mode: the owner must be a member of it; PermissionDenied)."""
    engine = engine or get_engine()
    check_priority(priority, by, project, engine)
    check_contribute(owner, project, engine)
    spec = SweepSpec.from_dict(spec.model_dump(mode="json", by_alias=True))  # a model_copy is never validated
    limit, in_flight = admission.max_queued_per_owner(), spec.budget.parallel * spec.seeds
    if limit is not None and in_flight > limit:
        raise ValueError(
            f"budget.parallel × seeds = {in_flight} runs in flight at once, more than the {limit} queued runs "
            "this dashboard allows per person (TORCHDECK_MAX_QUEUED_PER_OWNER): lower budget.parallel"
        )
    [base] = admission.admit([spec.base], owner=owner, engine=engine, room_for=spec.seeds, project=project)
    spec = spec.model_copy(update={"base": base})
    return control.create(
        engine,
        spec,
        owner=owner,
        send=send,
        name=name,
        tags=tags,
        max_queued=limit,
        priority=PRIORITIES[priority],
        project=project,
    )


def set_sweep_priority(sweep_id: str, priority: str, *, by: User, engine: Engine | None = None) -> int:
    """The priority of a sweep's queued trials and of those it will queue; how many queued runs moved. As for a run:
    its owner lowers it or brings it back to normal, only a maintainer of its project or an admin raises it
    (PermissionDenied)."""
    engine = engine or get_engine()
    sweep = _may(by, sweep_id, "reprioritise", engine)
    check_priority(priority, by, sweep.project, engine)
    return repo.set_sweep_priority(engine, sweep_id, PRIORITIES[priority])


def cancel_sweep(sweep_id: str, *, by: User, engine: Engine | None = None) -> SweepRecord:
    """Only the sweep's owner (a member of its project), a maintainer of its project or an admin may
    (app.auth.PermissionDenied otherwise)."""
    engine = engine or get_engine()
    _may(by, sweep_id, "cancel", engine)
    return control.cancel(engine, sweep_id)


def readable_sweep(sweep_id: str, *, by: User | None, engine: Engine | None = None) -> SweepRecord:
    """The sweep, or SweepNotFound when there is none or `by` may not see its project (team mode)."""
    engine = engine or get_engine()
    sweep = repo.get_sweep(engine, sweep_id)
    try:
        check_read(with_roles(by, engine), sweep.project, f"sweep {sweep_id!r}")
    except ProjectHidden:
        raise repo.SweepNotFound(sweep_id) from None
    return sweep


def _may(by: User, sweep_id: str, action: str, engine: Engine) -> SweepRecord:
    sweep = readable_sweep(sweep_id, by=by, engine=engine)
    if not can_modify(with_roles(by, engine), sweep):
        who = by.describe() if by else "an anonymous user"
        raise PermissionDenied(
            f"{who} may not {action} sweep {sweep.id}: it belongs to {owner_label(sweep.owner, engine)}, and only "
            f"its owner (a member of project {sweep.project}), a maintainer of the project or an admin "
            f"({ADMINS_ENV}) may"
        )
    return sweep


@dataclass(frozen=True)
class SweepView:
    sweep: SweepRecord
    spec: SweepSpec
    state: study.SweepState
    outcomes: list[study.Outcome]
    best: control.Best | None

    @property
    def epochs_used(self) -> int:
        return sum(o.epochs for o in self.outcomes)

    def counts(self) -> dict[str, int]:
        out: dict[str, int] = {}
        for o in self.outcomes:
            out[o.state] = out.get(o.state, 0) + 1
        return out


def view(sweep_id: str, engine: Engine | None = None) -> SweepView:
    engine = engine or get_engine()
    sweep = repo.get_sweep(engine, sweep_id)
    state = control.load_state(engine, sweep)
    outcomes = control.outcomes(state)
    return SweepView(sweep, state.spec, state, outcomes, control.best(state))


def waits_for_room(v: SweepView, engine: Engine | None = None) -> bool:
    """Whether its next trial waits for its owner's queued runs to fall under the limit stored with the sweep."""
    in_flight = sum(o.state == "running" for o in v.outcomes)
    if v.sweep.finished or len(v.outcomes) >= v.spec.trials or in_flight >= v.spec.budget.parallel:
        return False
    return not control.has_room(engine or get_engine(), v.sweep, v.spec.seeds)


def best_so_far(v: SweepView) -> list[tuple[int, float]]:
    """(trial number, best objective up to it) over the completed trials, in trial order."""
    out, best = [], None
    for o in v.outcomes:
        if o.state != "completed" or o.value is None:
            continue
        if best is None or (o.value > best if v.spec.mode == "max" else o.value < best):
            best = o.value
        out.append((o.number, best))
    return out


def launch_best(sweep_id: str, *, owner: str, seeds: int = 1, engine: Engine | None = None) -> list[RunRecord]:
    """The best configuration again as a new run (seeds=1) or seed group, owned by whoever asks (anyone may: it
    is a clone), its parent the trial's first run; through the gate of every new run (app.services.admission)."""
    engine = engine or get_engine()
    sweep = repo.get_sweep(engine, sweep_id)
    specs, parent_id = control.best_specs(engine, sweep, seeds)
    group_id = repo.new_group_id() if seeds > 1 else None
    runs = admission.store(
        specs, owner=owner, engine=engine, parent_id=parent_id, group_id=group_id, project=sweep.project
    )
    control.send_all(send, runs)
    return runs


def repeat_with_seeds(run_id: str, k: int, *, owner: str, engine: Engine | None = None) -> list[RunRecord]:
    """The run's spec again with k − 1 more seeds; together they are one seed group (anyone may: it is a clone).
    Through the gate of every new run (app.services.admission): all k − 1 are stored, or none."""
    engine = engine or get_engine()
    run = repo.get_run(engine, run_id)
    specs, group_id = control.repeat_specs(engine, run, k)
    runs = admission.store(specs, owner=owner, engine=engine, parent_id=run.id, group_id=group_id, project=run.project)
    if run.group_id is None:  # only once its repeats are stored: a refused repeat leaves the run as it was
        repo.set_group(engine, run.id, group_id)
    control.send_all(send, runs)
    return runs


@dataclass(frozen=True)
class Estimate:
    trials: int
    runs: int
    max_epochs: int
    seconds_per_epoch: float | None  # from finished runs of the same dataset and model, when there are some
    similar_runs: int

    def describe(self, pruner: str) -> str:
        text = (
            f"{self.trials} trials × {self.runs // max(self.trials, 1)} seed(s) = {self.runs} runs, "
            f"at most {self.max_epochs} epochs"
        )
        if pruner != "none":
            text += " (the pruner stops trailing trials early: usually far fewer)"
        if self.seconds_per_epoch is not None:
            text += (
                f"; ≈ {self.max_epochs * self.seconds_per_epoch / 60:.1f} worker-minutes at most, at "
                f"{self.seconds_per_epoch:.1f} s per epoch as in {self.similar_runs} similar finished run(s)"
            )
        return text


def estimate(spec: SweepSpec, engine: Engine | None = None) -> Estimate:
    """Trials, runs and epochs of the sweep; seconds per epoch from finished runs of the same data and model."""
    engine = engine or get_engine()
    page = repo.list_runs(engine, status=["completed", "early_stopped", "pruned"], limit=200)
    similar = [
        r
        for r in page.runs
        if (r.spec.get("data") or {}).get("name") == spec.base.data.name
        and (r.spec.get("model") or {}).get("name") == spec.base.model.name
        and (r.summary or {}).get("epochs_run")
        and (r.summary or {}).get("wall_time_s")
    ]
    per_epoch = [r.summary["wall_time_s"] / r.summary["epochs_run"] for r in similar]
    return Estimate(
        spec.trials, spec.runs(), spec.max_epochs(), statistics.median(per_epoch) if per_epoch else None, len(per_epoch)
    )
