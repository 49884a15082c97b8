"""Optuna's samplers and pruners on a study rebuilt from the database each time they decide.

The runs, their stored per-epoch objective, the trials' parameters and the stored decisions are the one
record of a sweep; an Optuna study in memory is built from them for each decision and thrown away. Optuna's
own RDB storage is not used: its tables would be a second record of the same trials to keep in step with
the runs (and its Alembic version table has the name ours has, in the same database).
"""

from __future__ import annotations

import math
import statistics
import warnings
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import optuna
from optuna.distributions import BaseDistribution, CategoricalDistribution, FloatDistribution, IntDistribution
from optuna.trial import FrozenTrial, TrialState, create_trial

from core.names import FINISHED_STATUSES, SUCCESS_STATUSES
from db.types import DecisionRecord, RunRecord, TrialRecord
from sweep.spec import SweepSpec

optuna.logging.set_verbosity(optuna.logging.WARNING)
ACTIVE = ("queued", "running", "lost")


@dataclass(frozen=True)
class SweepState:
    """Everything a decision reads, loaded at once (sweep.control.load_state)."""

    spec: SweepSpec
    trials: Sequence[TrialRecord]
    runs: Sequence[RunRecord]
    decisions: Sequence[DecisionRecord]
    values: Mapping[str, Mapping[int, float]]  # run id -> epoch -> stored objective

    def runs_of(self, number: int) -> list[RunRecord]:
        return [r for r in self.runs if r.trial == number]

    def decisions_of(self, number: int) -> list[DecisionRecord]:
        return [d for d in self.decisions if d.number == number]


@dataclass(frozen=True)
class Outcome:
    """A trial as the sweep page and the samplers see it."""

    number: int
    state: str  # running | completed | pruned | failed
    value: float | None  # mean over its seeds of each run's best objective
    std: float | None
    n: int  # runs with a value
    epochs: int  # epochs its runs trained, together
    curve: Mapping[int, float]  # epoch -> objective (the seeds' mean)
    reason: str | None  # why it was pruned


def distributions(spec: SweepSpec) -> dict[str, BaseDistribution]:
    """A grid's dimensions are its values; the other methods sample the ranges themselves."""
    if spec.method == "grid":
        return {path: CategoricalDistribution(values) for path, values in spec.grid_values().items()}
    out: dict[str, BaseDistribution] = {}
    for path, p in spec.space.items():
        if p.choice is not None:
            out[path] = CategoricalDistribution(p.choice)
        elif p.int_ is not None:
            out[path] = IntDistribution(p.int_[0], p.int_[1], step=int(p.step or 1))
        elif p.loguniform is not None:
            out[path] = FloatDistribution(*p.loguniform, log=True)
        else:
            low, high = p.uniform  # type: ignore[misc]
            out[path] = (
                FloatDistribution(low, low + math.floor((high - low) / p.step + 1e-9) * p.step, step=p.step)
                if p.step
                else FloatDistribution(low, high)
            )
    return out


def best_of(values: Mapping[int, float], mode: str) -> float | None:
    finite = [v for v in values.values() if math.isfinite(v)]
    if not finite:
        return None
    return max(finite) if mode == "max" else min(finite)


def outcome(state: SweepState, number: int) -> Outcome:
    runs = state.runs_of(number)
    mode = state.spec.mode
    per_run = {r.id: state.values.get(r.id, {}) for r in runs}
    epochs = sorted({e for v in per_run.values() for e in v})
    curve = {e: statistics.fmean(v[e] for v in per_run.values() if e in v) for e in epochs}
    bests = [b for b in (best_of(v, mode) for v in per_run.values()) if b is not None]
    value = statistics.fmean(bests) if bests else None
    std = statistics.stdev(bests) if len(bests) > 1 else None
    used = sum(int((r.summary or {}).get("epochs_run") or len(per_run[r.id])) for r in runs)
    pruned = next((d for d in state.decisions_of(number) if d.pruned), None)
    if pruned is not None or any(r.status == "pruned" for r in runs):
        st = "pruned"
    elif runs and all(r.status in FINISHED_STATUSES for r in runs):
        st = "completed" if all(r.status in SUCCESS_STATUSES for r in runs) and value is not None else "failed"
    else:
        st = "running"
    return Outcome(number, st, value, std, len(bests), used, curve, pruned.reason if pruned else None)


_STATES = {
    "completed": TrialState.COMPLETE,
    "pruned": TrialState.PRUNED,
    "failed": TrialState.FAIL,
    "running": TrialState.RUNNING,
}


def _frozen(
    state: SweepState, trial: TrialRecord, dists: Mapping[str, BaseDistribution], until_epoch: int | None = None
) -> FrozenTrial:
    o = outcome(state, trial.number)
    attrs = dict(trial.attrs)
    for d in state.decisions_of(trial.number):
        if until_epoch is None or d.epoch < until_epoch:
            attrs.update(d.attrs)
    curve = {e: v for e, v in o.curve.items() if until_epoch is None or e <= until_epoch}
    st = "running" if until_epoch is not None else o.state
    params = {k: v for k, v in trial.params.items() if k in dists}
    return create_trial(
        state=_STATES[st],
        value=o.value if st == "completed" else None,
        params=params,
        distributions={k: dists[k] for k in params},
        intermediate_values=curve,
        system_attrs=attrs,
    )


def build_study(
    state: SweepState,
    *,
    sampler: optuna.samplers.BaseSampler | None = None,
    pruner: optuna.pruners.BasePruner | None = None,
    leave_out: int | None = None,
) -> optuna.Study:
    direction = "maximize" if state.spec.mode == "max" else "minimize"
    study = optuna.create_study(
        storage=optuna.storages.InMemoryStorage(), direction=direction, sampler=sampler, pruner=pruner
    )
    dists = distributions(state.spec)
    for trial in state.trials:
        if trial.number != leave_out:
            study.add_trial(_frozen(state, trial, dists))
    return study


def sampler_for(spec: SweepSpec, number: int) -> optuna.samplers.BaseSampler:
    """Seeded per trial number: a study rebuilt for trial n samples as the same study would have."""
    seed = (spec.sampler_seed * 1_000_003 + number) % 2**32
    if spec.method == "grid":
        return optuna.samplers.GridSampler(spec.grid_values(), seed=spec.sampler_seed)
    if spec.method == "random":
        return optuna.samplers.RandomSampler(seed=seed)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
        return optuna.samplers.TPESampler(seed=seed, n_startup_trials=min(10, max(2, spec.trials // 4)))


def ask(state: SweepState) -> tuple[dict[str, Any], dict[str, Any]]:
    """The next configuration: (params by dotted field, the sampler's attributes to store with it)."""
    number = len(state.trials)
    study = build_study(state, sampler=sampler_for(state.spec, number))
    trial = study.ask(fixed_distributions=distributions(state.spec))
    frozen = study._storage.get_trial(trial._trial_id)
    return dict(frozen.params), dict(frozen.system_attrs)


def pruner_for(spec: SweepSpec) -> optuna.pruners.BasePruner | None:
    p = spec.pruner
    if p.kind == "median":
        return optuna.pruners.MedianPruner(n_startup_trials=p.startup_trials, n_warmup_steps=p.warmup_epochs + 1)
    if p.kind == "asha":
        return optuna.pruners.SuccessiveHalvingPruner(min_resource=p.min_epochs, reduction_factor=p.reduction_factor)
    return None


@dataclass(frozen=True)
class Verdict:
    pruned: bool
    value: float | None
    reason: str | None
    attrs: dict[str, Any]


def judge(state: SweepState, number: int, epoch: int) -> Verdict | None:
    """Optuna's pruner on trial `number` at the end of `epoch`, from the stored objective; None when the
    sweep has no pruner or the trial has no value for that epoch yet."""
    pruner = pruner_for(state.spec)
    trial = next(t for t in state.trials if t.number == number)
    mine = _frozen(state, trial, distributions(state.spec), until_epoch=epoch)
    if pruner is None or epoch not in mine.intermediate_values:
        return None
    study = build_study(state, pruner=pruner, leave_out=number)
    study.add_trial(mine)
    added = study._storage.get_all_trials(study._study_id, deepcopy=False)[-1]
    pruned = bool(pruner.prune(study, added))
    after = study._storage.get_trial(added._trial_id).system_attrs
    attrs = {k: v for k, v in after.items() if mine.system_attrs.get(k) != v}
    value = mine.intermediate_values[epoch]
    reason = explain(state, study, added, attrs, epoch) if pruned else None
    return Verdict(pruned, value, reason, attrs)


def explain(state: SweepState, study: optuna.Study, trial: FrozenTrial, attrs: Mapping[str, Any], epoch: int) -> str:
    """Why the pruner stopped the trial, in the objective's own terms."""
    spec, value = state.spec, trial.intermediate_values[epoch]
    metric, worse = spec.metric, ("below" if spec.mode == "max" else "above")
    if not math.isfinite(value):
        return f"{metric} is {value} at epoch {epoch}"
    if spec.pruner.kind == "median":
        done = [
            t.intermediate_values[epoch]
            for t in study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,))
            if epoch in t.intermediate_values
        ]
        best = best_of(trial.intermediate_values, spec.mode)
        return (
            f"{metric} {best:.4g} {worse} the median {statistics.median(done):.4g} of {len(done)} completed trials "
            f"at epoch {epoch}"
        )
    rung = max((k for k in attrs if k.startswith("completed_rung_")), key=lambda k: int(k.rsplit("_", 1)[1]))
    rivals = [t.system_attrs[rung] for t in study.get_trials(deepcopy=False) if rung in t.system_attrs]
    rf = spec.pruner.reduction_factor
    ranked = sorted(rivals, reverse=spec.mode == "max")
    cut = ranked[max(len(ranked) // rf, 1) - 1]
    return (
        f"{metric} {value:.4g} at epoch {epoch} is not in the top 1/{rf} of the {len(ranked)} trials that reached "
        f"this rung (the cut is {cut:.4g})"
    )


def importances(state: SweepState) -> dict[str, float]:
    """Optuna's parameter importances over the completed trials (fANOVA); empty with fewer than two."""
    study = build_study(state)
    done = study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,))
    if len(done) < 2 or len({repr(t.params) for t in done}) < 2:
        return {}
    try:
        return dict(optuna.importance.get_param_importances(study))
    except (RuntimeError, ValueError, ZeroDivisionError):  # e.g. every completed trial has the same value
        return {}
