"""Sweeps for the dashboard's tests, played by hand the way workers would (no worker, no torch): the sweep is
created by sweep.control with a `send` that only records the runs, then each run is claimed, gets one val/acc
point per epoch, is judged by the pruner at each epoch end but the last, and finishes (completed, or pruned
when the pruner says so), and the sweep advances after each.

The objective depends on the trial number only (not on the sampled parameters), so what happens is known:
trial 0 completes, trial 1 trails it at epoch 1 and is pruned there (median pruner), trial 2 completes best."""

from __future__ import annotations

from dataclasses import dataclass, field

from sqlalchemy import Engine

from core.config import RunSpec
from db import repo
from db.types import DEFAULT_PROJECT, MetricPoint, SweepRecord
from sweep import control
from sweep.spec import SweepSpec

BASE = RunSpec.model_validate(
    {
        "data": {"name": "digits", "image_size": 16},
        "model": {"name": "mlp"},
        "train": {"epochs": 3},
        "device": "cpu",
        "seed": 7,
    }
)
LRS = (0.1, 0.01, 0.001)
CURVES = {0: [0.5, 0.8, 0.9], 1: [0.2, 0.3, 0.35], 2: [0.6, 0.85, 0.95]}  # val/acc per epoch, by trial number
SEED_SPREAD = 0.01  # seed k of a group: every value + k × this


def sweep_spec(seeds: int = 1, **kw) -> SweepSpec:
    data = {
        "base": BASE.model_dump(mode="json"),
        "space": {"optim.lr": {"choice": list(LRS)}},
        "method": "grid",
        "objective": {"metric": "val/acc"},
        "budget": {"parallel": 1},
        "seeds": seeds,
        "pruner": {"kind": "median", "startup_trials": 1, "warmup_epochs": 0},
    }
    data.update(kw)
    return SweepSpec.model_validate(data)


@dataclass
class Played:
    """A sweep being played: its id and the runs sent and not yet played, in order."""

    engine: Engine
    sweep_id: str
    sent: list[str] = field(default_factory=list)

    def __call__(self, run) -> None:  # sweep.control's `send`
        self.sent.append(run.id)

    @property
    def sweep(self) -> SweepRecord:
        return repo.get_sweep(self.engine, self.sweep_id)

    def play(self, trials: int | None = None, *, then_running: bool = False) -> Played:
        """Play the runs sent, in order, until `trials` trials are over (None: until the sweep ends). With
        then_running, the next run is claimed by a worker and left running (no epoch done yet)."""
        while self.sent:
            run = repo.get_run(self.engine, self.sent[0])
            if run.status not in ("queued", "running"):  # a pruned trial's other seeds never start
                self.sent.pop(0)
                continue
            if trials is not None and run.trial >= trials:
                if then_running and run.status == "queued":
                    repo.claim_run(self.engine, run.id, "w1", device="cpu")
                return self
            play_run(self.engine, self.sent.pop(0))
            control.advance(self.engine, self.sweep_id, self)
        return self


def play_run(engine: Engine, run_id: str) -> str:
    """Claim the run (unless a worker has) and train it by hand: its trial's curve (shifted by its seed), judged
    at each epoch end."""
    if repo.get_run(engine, run_id).status == "queued":
        repo.claim_run(engine, run_id, "w1", device="cpu")
    run = repo.get_run(engine, run_id)
    spec = RunSpec.model_validate(run.spec)
    shift = (spec.seed - BASE.seed) * SEED_SPREAD
    curve = CURVES[run.trial % len(CURVES)]
    last = spec.train.epochs
    for epoch in range(1, last + 1):
        value = curve[epoch - 1] + shift
        repo.append_metrics(
            engine,
            run_id,
            [
                MetricPoint("val/acc", epoch * 10, value, epoch=epoch),
                MetricPoint("val/loss", epoch * 10, 1 - value, epoch=epoch),
            ],
        )
        if epoch < last:
            reason = control.judge_run(engine, repo.get_run(engine, run_id), epoch)
            if reason:
                repo.finish_run(engine, run_id, "pruned", summary={"epochs_run": epoch, "pruned": reason})
                return "pruned"
    repo.finish_run(
        engine,
        run_id,
        "completed",
        summary={
            "epochs_run": last,
            "wall_time_s": 6.0 * last,
            "best": {"metric": "val/acc", "value": max(curve) + shift},
        },
    )
    return "completed"


def seed_sweep(
    engine: Engine,
    *,
    name: str = "lr-sweep",
    owner: str = "local",
    seeds: int = 1,
    trials: int | None = None,
    then_running: bool = False,
    project: str = DEFAULT_PROJECT,
    **spec,
) -> Played:
    """A grid over three learning rates (in `project`), played to its end (trials=None) or until `trials` trials are
    over."""
    played = Played(engine, "")
    record = control.create(engine, sweep_spec(seeds, **spec), owner=owner, send=played, name=name, project=project)
    played.sweep_id = record.id
    return played.play(trials, then_running=then_running)
