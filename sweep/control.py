"""A sweep's life: create it, advance it (new trials while the budget and `parallel` allow), judge a trial at
an epoch end, cancel it, find its best configuration, launch that again; and seed groups.

Nothing here runs in the background or owns a process. `advance` is called by whoever may have freed a slot:
the service that creates the sweep, a worker after each run of a sweep ends, and every worker's reaper (so a
worker that died between a run's end and the advance delays the sweep by a reaper period, never stalls it).
It is safe to call from many processes at once: a trial number is taken once, with its runs, in one
transaction, and only while its owner's queued runs stay within the limit stored with the sweep (else the
trial waits for a later advance). Each trial reads what its base was admitted to read (core.admission): the
dashboard's gate (app/services/admission.py) admitted the base, and stores the runs of `best_specs` and
`repeat_specs`. Sending a run is the caller's (`send(run)`): the dashboard and the workers each have their
own way to reach the queue, and this package reaches none.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from sqlalchemy import Engine

from core.admission import check_trial
from core.config import RunSpec
from core.names import FINISHED_STATUSES
from db import repo
from db.errors import QueueLimitReached
from db.run_labels import check_tags
from db.types import DEFAULT_PROJECT, RunRecord, SweepRecord
from sweep import study
from sweep.spec import SweepSpec

log = logging.getLogger("torchdeck.sweep")
Send = Callable[[RunRecord], None]


def spec_of(sweep: SweepRecord) -> SweepSpec:
    return SweepSpec.stored(sweep.spec)


def load_state(engine: Engine, sweep: SweepRecord, runs: list[RunRecord] | None = None) -> study.SweepState:
    spec = spec_of(sweep)
    runs = repo.sweep_runs(engine, sweep.id) if runs is None else runs
    values = repo.epoch_values(engine, [r.id for r in runs], spec.stored_metric)
    return study.SweepState(
        spec=spec,
        trials=repo.trials(engine, sweep.id),
        runs=runs,
        decisions=repo.decisions(engine, sweep.id),
        values=values,
    )


def create(
    engine: Engine,
    spec: SweepSpec,
    *,
    owner: str,
    send: Send,
    name: str | None = None,
    tags: Sequence[str] = (),
    max_queued: int | None = None,
    priority: int = 0,
    project: str = DEFAULT_PROJECT,
) -> SweepRecord:
    """Store the sweep (in `project`) and queue its first trials (up to `parallel`, while the owner's queued runs
    stay within `max_queued`, stored with the sweep for every later advance; at `priority`, its trials' place in
    their queue). Its base must have passed the dashboard's gate (app.services.admission): each trial is checked
    against it (core.admission.check_trial)."""
    label = name or spec.name or f"{spec.base.data.name}-{spec.base.model.name}-{spec.method}"
    all_tags = check_tags([*spec.tags, *tags])  # each tag checked before anything is stored
    stored = spec.model_copy(update={"name": label, "tags": all_tags}).model_dump(mode="json", by_alias=True)
    sweep = repo.create_sweep(
        engine, stored, name=label, owner=owner, max_queued=max_queued, priority=priority, project=project
    )
    advance(engine, sweep.id, send)
    return repo.get_sweep(engine, sweep.id)


def run_name(sweep: SweepRecord, number: int, seed_index: int, seeds: int) -> str:
    return f"{sweep.name} #{number}" + (f" seed {seed_index + 1}/{seeds}" if seeds > 1 else "")


def advance(engine: Engine, sweep_id: str, send: Send) -> list[RunRecord]:
    """Queue new trials while fewer than `parallel` are in flight, the budget is not spent and the owner's
    queued runs leave room under the sweep's limit (else the trial waits for a later advance: every worker's
    reaper advances every running sweep); end the sweep once every trial is over. Returns the runs it queued."""
    queued: list[RunRecord] = []
    for _ in range(1000):  # each round takes one trial number or returns
        sweep = repo.get_sweep(engine, sweep_id)
        if sweep.finished:
            return queued
        spec, runs = spec_of(sweep), repo.sweep_runs(engine, sweep_id)
        in_flight = {r.trial for r in runs if r.status not in FINISHED_STATUSES}
        if len(repo.trials(engine, sweep_id)) >= spec.trials:
            if not in_flight:
                repo.finish_sweep(engine, sweep_id, "completed")
            return queued
        if len(in_flight) >= spec.budget.parallel or not has_room(engine, sweep, spec.seeds):
            return queued  # (every reaper round comes here: no metric is read until a slot is free)
        created = _next_trial(engine, sweep, spec, runs)
        if created is None:
            return queued
        for run in created:
            _send(send, run)
        queued += created
    return queued


def has_room(engine: Engine, sweep: SweepRecord, runs: int) -> bool:
    """Whether `runs` more fit under the sweep's queued-runs limit beside its owner's queued runs: read before
    the sampler is asked (the count that decides is taken again where the trial is stored, db add_trial)."""
    return sweep.max_queued is None or repo.queued_count(engine, sweep.owner) + runs <= sweep.max_queued


def _next_trial(engine: Engine, sweep: SweepRecord, spec: SweepSpec, runs: list[RunRecord]) -> list[RunRecord] | None:
    """The next trial, stored with its runs; [] when another process took its number (the caller looks
    again); None when it waits (its owner reached the limit meanwhile) or is refused (the sweep then fails)."""
    state = load_state(engine, sweep, runs)
    number = len(state.trials)
    if number >= spec.trials:
        return []  # another process took the last trial between the two reads: the next round may end it
    params, attrs = study.ask(state)
    names = [run_name(sweep, number, i, spec.seeds) for i in range(spec.seeds)]
    try:  # a trial reads what its base was admitted to read, within the schema's bounds
        specs = [check_trial(spec.run_spec(params, i, name), spec.base) for i, name in enumerate(names)]
    except ValueError as e:  # SpecError, or pydantic's for a spec stored by an older version
        log.warning("sweep %s: trial %d refused: %s", sweep.id, number, e)
        repo.finish_sweep(engine, sweep.id, "failed", error=f"trial {number} refused: {e}")
        return None
    try:
        created = repo.add_trial(
            engine,
            sweep,
            number,
            params,
            attrs,
            [(s.model_dump(mode="json"), n) for s, n in zip(specs, names, strict=True)],
            tags=spec.tags,
        )
    except QueueLimitReached:
        return None  # a run of the owner's was queued since has_room: this trial waits for a later advance
    return created or []


def send_all(send: Send, runs: Sequence[RunRecord]) -> None:
    for run in runs:
        _send(send, run)


def _send(send: Send, run: RunRecord) -> None:
    try:
        send(run)
    except Exception as e:  # noqa: BLE001 - the run is stored: a reaper sends a queued run without a message again
        log.warning("could not send run %s now (%s); it stays queued and is sent again later", run.id, e)


def judge_run(engine: Engine, run: RunRecord, epoch: int) -> str | None:
    """For a sweep's run at the end of `epoch`: the reason to stop it (pruned), or None to go on. The first
    verdict on a trial at an epoch is stored and every later call reads it (a resumed run is never judged
    twice, and the seeds of one configuration share its verdicts)."""
    if run.sweep_id is None or run.trial is None:
        return None
    earlier = [d for d in repo.decisions(engine, run.sweep_id, run.trial) if d.epoch <= epoch]
    if any(d.pruned for d in earlier):
        return next(d.reason for d in earlier if d.pruned)
    if any(d.epoch == epoch for d in earlier):
        return None
    sweep = repo.get_sweep(engine, run.sweep_id)
    if ((sweep.spec.get("pruner") or {}).get("kind") or "none") == "none":
        return None  # nothing to judge: no need to read the sweep's trials
    verdict = study.judge(load_state(engine, sweep), run.trial, epoch)
    if verdict is None:
        return None
    stored = repo.record_decision(
        engine,
        sweep.id,
        run.trial,
        epoch,
        pruned=verdict.pruned,
        value=verdict.value,
        reason=verdict.reason,
        attrs=verdict.attrs,
        run_id=run.id,
    )
    if stored.pruned:
        for other in repo.sweep_runs(engine, sweep.id):  # the trial's seeds still waiting never start
            if other.trial == run.trial and other.id != run.id and other.status in ("queued", "lost"):
                repo.finish_run(
                    engine,
                    other.id,
                    "pruned",
                    only_from=("queued", "lost"),
                    summary={"pruned": stored.reason},
                    error=None,
                )
    return stored.reason if stored.pruned else None


def cancel(engine: Engine, sweep_id: str) -> SweepRecord:
    """End the sweep (no new trial) and cancel its queued and running runs."""
    repo.finish_sweep(engine, sweep_id, "cancelled")
    for run in repo.sweep_runs(engine, sweep_id):
        if run.status not in FINISHED_STATUSES:
            repo.request_cancel(engine, run.id)
    return repo.get_sweep(engine, sweep_id)


@dataclass(frozen=True)
class Best:
    number: int
    value: float
    std: float | None
    n: int
    params: dict[str, Any]
    run_ids: list[str]


def outcomes(state: study.SweepState) -> list[study.Outcome]:
    return [study.outcome(state, t.number) for t in state.trials]


def best(state: study.SweepState) -> Best | None:
    """The completed configuration with the best objective (mean over its seeds)."""
    done = [o for o in outcomes(state) if o.state == "completed" and o.value is not None]
    if not done:
        return None
    top = (max if state.spec.mode == "max" else min)(done, key=lambda o: o.value)
    trial = next(t for t in state.trials if t.number == top.number)
    return Best(
        top.number,
        top.value,
        top.std,
        top.n,
        dict(trial.params),  # type: ignore[arg-type]
        [r.id for r in state.runs_of(top.number)],
    )


def best_specs(engine: Engine, sweep: SweepRecord, seeds: int = 1) -> tuple[list[RunSpec], str]:
    """The best configuration's spec once per seed (a run, or a seed group), and its trial's first run (their
    parent). Storing them is the caller's, through the dashboard's gate (app.services.sweeps.launch_best)."""
    state = load_state(engine, sweep)
    top = best(state)
    if top is None:
        raise ValueError(f"sweep {sweep.id} has no completed trial yet")
    specs = [
        state.spec.run_spec(top.params, i, f"{sweep.name} best" + (f" seed {i + 1}/{seeds}" if seeds > 1 else ""))
        for i in range(seeds)
    ]
    return specs, top.run_ids[0]


def repeat_specs(engine: Engine, run: RunRecord, k: int) -> tuple[list[RunSpec], str]:
    """`run`'s spec with k − 1 more seeds (seed + 1, ..., none its seed group has yet), and the group they
    form with it (the run's, or a new one the caller puts the run in once they are stored). Storing them is
    the caller's, through the dashboard's gate (app.services.sweeps.repeat_with_seeds)."""
    if not 2 <= k <= 20:
        raise ValueError(f"repeat with 2 to 20 seeds, not {k}")
    base = RunSpec.model_validate(run.spec)
    group_id = run.group_id or repo.new_group_id()
    taken = {int(r.spec.get("seed", 0)) for r in repo.group_runs(engine, group_id)} | {base.seed}
    seeds = [s for s in range(base.seed + 1, base.seed + 1 + len(taken) + k) if s not in taken][: k - 1]
    return [base.model_copy(update={"seed": s, "name": f"{run.name} seed {s}"}) for s in seeds], group_id
