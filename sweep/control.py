"""A sweep's life: create it, advance it (new trials while the budget and `parallel` allow), judge a trial at
an epoch end, cancel it, find its best configuration, launch that again; and seed groups.

Nothing here runs in the background or owns a process. `advance` is called by whoever may have freed a slot:
the service that creates the sweep, a worker after each run of a sweep ends, and every worker's reaper (so a
worker that died between a run's end and the advance delays the sweep by a reaper period, never stalls it).
It is safe to call from many processes at once: a trial number is taken once, with its runs, in one
transaction. Sending a run is the caller's (`send(run)`): the dashboard and the workers each have their
own way to reach the queue, and this package reaches none.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from sqlalchemy import Engine

from core.names import FINISHED_STATUSES
from db import repo
from db.runs import check_tags
from db.types import RunRecord, SweepRecord
from sweep import study
from sweep.spec import SweepSpec

log = logging.getLogger("torchdeck.sweep")
Send = Callable[[RunRecord], None]


def spec_of(sweep: SweepRecord) -> SweepSpec:
    return SweepSpec.model_validate(sweep.spec)


def load_state(engine: Engine, sweep: SweepRecord, runs: list[RunRecord] | None = None) -> study.SweepState:
    spec = spec_of(sweep)
    runs = repo.sweep_runs(engine, sweep.id) if runs is None else runs
    values = repo.epoch_values(engine, [r.id for r in runs], spec.stored_metric)
    return study.SweepState(spec=spec, trials=repo.trials(engine, sweep.id), runs=runs,
                            decisions=repo.decisions(engine, sweep.id), values=values)


def create(engine: Engine, spec: SweepSpec, *, owner: str, send: Send, name: str | None = None,
           tags: Sequence[str] = ()) -> SweepRecord:
    """Store the sweep and queue its first trials (up to `parallel`)."""
    label = name or spec.name or f"{spec.base.data.name}-{spec.base.model.name}-{spec.method}"
    all_tags = check_tags([*spec.tags, *tags])  # each tag checked before anything is stored
    stored = spec.model_copy(update={"name": label, "tags": all_tags}).model_dump(mode="json", by_alias=True)
    sweep = repo.create_sweep(engine, stored, name=label, owner=owner)
    advance(engine, sweep.id, send)
    return repo.get_sweep(engine, sweep.id)


def run_name(sweep: SweepRecord, number: int, seed_index: int, seeds: int) -> str:
    return f"{sweep.name} #{number}" + (f" seed {seed_index + 1}/{seeds}" if seeds > 1 else "")


def advance(engine: Engine, sweep_id: str, send: Send) -> list[RunRecord]:
    """Queue new trials while fewer than `parallel` are in flight and the budget is not spent; end the sweep
    once every trial is over. Returns the runs it queued."""
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
        if len(in_flight) >= spec.budget.parallel:
            return queued  # (every reaper round comes here: no metric is read until a slot is free)
        state = load_state(engine, sweep, runs)
        number = len(state.trials)
        if number >= spec.trials:
            continue  # another process took the last trial between the two reads: the next round may end it
        params, attrs = study.ask(state)
        to_create = [(spec.run_spec(params, i, run_name(sweep, number, i, spec.seeds)).model_dump(mode="json"),
                      run_name(sweep, number, i, spec.seeds)) for i in range(spec.seeds)]
        created = repo.add_trial(engine, sweep, number, params, attrs, to_create, tags=spec.tags)
        for run in created or ():
            _send(send, run)
        queued += created or []
    return queued


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
    stored = repo.record_decision(engine, sweep.id, run.trial, epoch, pruned=verdict.pruned, value=verdict.value,
                                  reason=verdict.reason, attrs=verdict.attrs, run_id=run.id)
    if stored.pruned:
        for other in repo.sweep_runs(engine, sweep.id):  # the trial's seeds still waiting never start
            if other.trial == run.trial and other.id != run.id and other.status in ("queued", "lost"):
                repo.finish_run(engine, other.id, "pruned", only_from=("queued", "lost"),
                                summary={"pruned": stored.reason}, error=None)
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
    return Best(top.number, top.value, top.std, top.n, dict(trial.params),  # type: ignore[arg-type]
                [r.id for r in state.runs_of(top.number)])


def launch_best(engine: Engine, sweep: SweepRecord, *, owner: str, send: Send, seeds: int = 1) -> list[RunRecord]:
    """The best configuration as a new run (seeds=1) or seed group, its parent the trial's first run."""
    state = load_state(engine, sweep)
    top = best(state)
    if top is None:
        raise ValueError(f"sweep {sweep.id} has no completed trial yet")
    specs = [state.spec.run_spec(top.params, i, f"{sweep.name} best" + (f" seed {i + 1}/{seeds}" if seeds > 1 else ""))
             for i in range(seeds)]
    return _group(engine, specs, owner=owner, parent_id=top.run_ids[0], send=send)


def repeat_with_seeds(engine: Engine, run: RunRecord, k: int, *, owner: str, send: Send) -> list[RunRecord]:
    """Run `run`'s spec again with k − 1 more seeds (seed + 1, ...); with it they form one seed group."""
    from core.config import RunSpec

    if not 2 <= k <= 20:
        raise ValueError(f"repeat with 2 to 20 seeds, not {k}")
    base = RunSpec.model_validate(run.spec)
    group_id = run.group_id or repo.new_group_id()
    if run.group_id is None:
        repo.set_group(engine, run.id, group_id)
    taken = {int(r.spec.get("seed", 0)) for r in repo.group_runs(engine, group_id)} | {base.seed}
    seeds = [s for s in range(base.seed + 1, base.seed + 1 + len(taken) + k) if s not in taken][:k - 1]
    specs = [base.model_copy(update={"seed": s, "name": f"{run.name} seed {s}"}) for s in seeds]
    return _group(engine, specs, owner=owner, parent_id=run.id, send=send, group_id=group_id)


def _group(engine: Engine, specs: list, *, owner: str, parent_id: str, send: Send,
           group_id: str | None = None) -> list[RunRecord]:
    group = group_id or (repo.new_group_id() if len(specs) > 1 else None)
    out = []
    for spec in specs:
        run = repo.create_run(engine, spec.model_dump(mode="json"), name=spec.name, owner=owner, parent_id=parent_id,
                              group_id=group)
        _send(send, run)
        out.append(run)
    return out
