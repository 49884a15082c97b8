"""A sweep's decisions on a real database, with trials played by hand: no worker, no torch. What a worker
does with a run (claim, metrics per epoch, judge at each epoch end, finish) is done here step by step, so the
sampler's and the pruner's choices are checked exactly."""

from __future__ import annotations

import math

import pytest

from core.config import RunSpec
from db import repo
from sweep import control
from sweep.spec import SweepSpec

BASE = RunSpec.model_validate(
    {"data": {"name": "digits"}, "model": {"name": "mlp"}, "train": {"epochs": 9}, "device": "cpu", "seed": 7}
)


def sweep_spec(**kw) -> SweepSpec:
    data = {
        "base": BASE.model_dump(mode="json"),
        "space": {"optim.lr": {"choice": [0.1, 0.01, 0.001, 0.0001]}, "optim.weight_decay": {"choice": [0.0, 0.001]}},
        "method": "grid",
        "objective": {"metric": "val/acc"},
    }
    data.update(kw)
    return SweepSpec.model_validate(data)


class Queue:
    def __init__(self) -> None:
        self.sent: list[str] = []

    def __call__(self, run) -> None:
        self.sent.append(run.id)


def quality(params) -> float:
    """A made-up objective: best at lr 0.01, weight decay a small help."""
    return 0.9 - abs(math.log10(params["optim.lr"]) + 2) * 0.2 + (0.01 if params["optim.weight_decay"] else 0.0)


def play(engine, run, epochs: int | None = None, key: str = "val/acc") -> str:
    """Train `run` by hand: claim, one `key` point per epoch (rising to its quality), judged at each end."""
    repo.claim_run(engine, run.id, "w1")
    spec = RunSpec.model_validate(run.spec)
    params = {"optim.lr": spec.optim.lr, "optim.weight_decay": spec.optim.weight_decay}
    last = spec.train.epochs if epochs is None else epochs
    for epoch in range(1, last + 1):
        value = quality(params) * (1 - 0.5 / epoch)
        repo.append_metrics(engine, run.id, [repo.MetricPoint(key, epoch * 10, value, epoch=epoch)])
        reason = control.judge_run(engine, repo.get_run(engine, run.id), epoch) if epoch < spec.train.epochs else None
        if reason:
            repo.finish_run(engine, run.id, "pruned", summary={"epochs_run": epoch, "pruned": reason})
            return "pruned"
    if epochs is None:
        repo.finish_run(engine, run.id, "completed", summary={"epochs_run": last})
        return "completed"
    return "running"


def drain(engine, sweep_id, queue: Queue, key: str = "val/acc") -> list[str]:
    """Play every queued run in order, advancing the sweep after each, until the sweep ends."""
    statuses = []
    while queue.sent:
        run = repo.get_run(engine, queue.sent.pop(0))
        statuses.append(play(engine, run, key=key))
        control.advance(engine, sweep_id, queue)
    return statuses


def test_a_grid_runs_each_configuration_once_and_finds_the_best(engine) -> None:
    queue = Queue()
    sweep = control.create(engine, sweep_spec(budget={"parallel": 2}), owner="ana", send=queue)
    assert len(queue.sent) == 2  # parallel 2: two trials queued at once, no more
    control.advance(engine, sweep.id, queue)
    assert len(queue.sent) == 2  # advancing again with both still queued adds none
    assert drain(engine, sweep.id, queue) == ["completed"] * 8
    runs = repo.sweep_runs(engine, sweep.id)
    configs = sorted((r.spec["optim"]["lr"], r.spec["optim"]["weight_decay"]) for r in runs)
    assert len(runs) == 8 and len(set(configs)) == 8 and [r.trial for r in runs] == list(range(8))
    assert repo.get_sweep(engine, sweep.id).status == "completed"
    top = control.best(control.load_state(engine, repo.get_sweep(engine, sweep.id)))
    assert top.params == {"optim.lr": 0.01, "optim.weight_decay": 0.001}


def test_a_sweep_on_val_f1_macro_finds_the_configuration_with_the_highest_f1(engine) -> None:
    queue = Queue()
    sweep = control.create(
        engine, sweep_spec(objective={"metric": "val/f1_macro"}, pruner={"kind": "median"}), owner="ana", send=queue
    )
    drain(engine, sweep.id, queue, key="val/f1_macro")
    state = control.load_state(engine, repo.get_sweep(engine, sweep.id))
    assert control.best(state).params == {"optim.lr": 0.01, "optim.weight_decay": 0.001}  # the highest, not lowest


def test_asha_prunes_trailing_trials_with_a_reason_and_uses_fewer_epochs(engine) -> None:
    queue = Queue()
    sweep = control.create(
        engine, sweep_spec(pruner={"kind": "asha", "min_epochs": 1, "reduction_factor": 3}), owner="ana", send=queue
    )
    statuses = drain(engine, sweep.id, queue)
    assert statuses.count("pruned") >= 3 and statuses.count("completed") >= 1
    state = control.load_state(engine, repo.get_sweep(engine, sweep.id))
    used = sum(o.epochs for o in control.outcomes(state))
    assert used < 0.7 * 8 * 9
    pruned = [r for r in repo.sweep_runs(engine, sweep.id) if r.status == "pruned"]
    reason = pruned[0].summary["pruned"]
    assert "val/acc" in reason and "at epoch" in reason and "top 1/3" in reason
    assert control.best(state).params["optim.lr"] == 0.01


def test_a_verdict_is_taken_once_per_epoch_even_after_a_resume(engine) -> None:
    queue = Queue()
    spec = sweep_spec(pruner={"kind": "median", "startup_trials": 1, "warmup_epochs": 0}, budget={"parallel": 1})
    sweep = control.create(engine, spec, owner="ana", send=queue)
    first = repo.get_run(engine, queue.sent.pop(0))
    play(engine, first)  # completes: the median's reference
    control.advance(engine, sweep.id, queue)
    second = repo.get_run(engine, queue.sent.pop(0))
    assert play(engine, second, epochs=2) in ("running", "pruned")
    before = repo.decisions(engine, sweep.id, second.trial)
    # The process dies; the resumed attempt asks again about the epochs already judged: same answers, no new row.
    again = [control.judge_run(engine, repo.get_run(engine, second.id), e) for e in (1, 2)]
    assert before and repo.decisions(engine, sweep.id, second.trial) == before
    assert again == [next((d.reason for d in before if d.pruned and d.epoch <= e), None) for e in (1, 2)]


def test_cancel_ends_the_sweep_and_its_runs(engine) -> None:
    queue = Queue()
    sweep = control.create(engine, sweep_spec(budget={"parallel": 3}), owner="ana", send=queue)
    repo.claim_run(engine, queue.sent[0], "w1")
    control.cancel(engine, sweep.id)
    runs = {r.id: r for r in repo.sweep_runs(engine, sweep.id)}
    assert repo.get_sweep(engine, sweep.id).status == "cancelled"
    assert runs[queue.sent[0]].cancel_requested and runs[queue.sent[0]].status == "running"
    assert all(runs[i].status == "cancelled" for i in queue.sent[1:])
    assert control.advance(engine, sweep.id, queue) == []


def test_seeds_make_groups_and_the_best_is_their_mean(engine) -> None:
    queue = Queue()
    sweep = control.create(
        engine,
        sweep_spec(seeds=3, budget={"trials": 2}, method="random", space={"optim.lr": {"loguniform": [1e-3, 1e-1]}}),
        owner="ana",
        send=queue,
    )
    assert len(queue.sent) == 3
    runs = [repo.get_run(engine, i) for i in queue.sent]
    assert len({r.group_id for r in runs}) == 1 and sorted(r.spec["seed"] for r in runs) == [7, 8, 9]
    for run in runs:
        repo.claim_run(engine, run.id, "w1")
        for epoch, value in ((1, 0.5), (2, 0.6 + run.spec["seed"] / 100)):
            repo.append_metrics(engine, run.id, [repo.MetricPoint("val/acc", epoch, value, epoch=epoch)])
        repo.finish_run(engine, run.id, "completed", summary={"epochs_run": 2})
    control.advance(engine, sweep.id, queue)
    state = control.load_state(engine, repo.get_sweep(engine, sweep.id))
    first = control.outcomes(state)[0]
    assert first.state == "completed" and first.n == 3
    assert first.value == pytest.approx(0.68) and first.std == pytest.approx(0.01)


def repeat(engine, run, k: int) -> list:
    """What app.services.sweeps.repeat_with_seeds stores once its gate admitted the specs (tests/app test the gate)."""
    specs, group_id = control.repeat_specs(engine, run, k)
    made = repo.create_runs(
        engine, [(s.model_dump(mode="json"), s.name) for s in specs], owner="bo", parent_id=run.id, group_id=group_id
    )
    if run.group_id is None:
        repo.set_group(engine, run.id, group_id)
    return made


def test_repeating_a_run_twice_never_repeats_a_seed(engine) -> None:
    run = repo.create_run(engine, BASE.model_dump(mode="json"), name="base run", owner="ana")
    first = repeat(engine, run, 3)
    assert [r.spec["seed"] for r in first] == [8, 9] and {r.parent_id for r in first} == {run.id}
    again = repeat(engine, repo.get_run(engine, first[0].id), 3)
    group = repo.group_runs(engine, repo.get_run(engine, run.id).group_id)
    assert sorted(r.spec["seed"] for r in group) == [7, 8, 9, 10, 11] and len(again) == 2
    assert {r.group_id for r in first + again} == {repo.get_run(engine, run.id).group_id}


def test_a_sweeps_tags_go_to_every_trial_and_survive_a_yaml_round_trip(engine) -> None:
    queue = Queue()
    spec = sweep_spec(budget={"parallel": 2}, tags=["lr-study"])
    sweep = control.create(engine, spec, owner="ana", send=queue, tags=["team-a", "lr-study"])
    runs = repo.sweep_runs(engine, sweep.id)
    assert len(runs) == 2 and all(set(r.tags) == {"lr-study", "team-a"} for r in runs)
    assert control.spec_of(repo.get_sweep(engine, sweep.id)).tags == ["lr-study", "team-a"]
    with pytest.raises(ValueError, match="tag"):
        control.create(engine, spec, owner="ana", send=queue, tags=["x" * 65])


def test_a_trial_taken_by_another_process_between_reads_never_makes_one_too_many(engine, monkeypatch) -> None:
    """Two workers advance at once: the other takes the last trial after this one counted the trials and
    before it read the sweep's state. The sweep still has exactly its grid's trials."""
    sweep = control.create(engine, sweep_spec(budget={"parallel": 1}), owner="ana", send=Queue())
    real_load, raced = control.load_state, []

    def load_after_a_rival(engine_, sweep_, runs=None):
        if len(repo.trials(engine_, sweep_.id)) == 7 and not raced:
            raced.append(True)
            monkeypatch.setattr(control, "load_state", real_load)
            for run in repo.sweep_runs(engine_, sweep_.id):  # the rival sees every slot free and takes trial 7
                if run.status == "queued":
                    repo.claim_run(engine_, run.id, "w2")
                    repo.finish_run(engine_, run.id, "completed", summary={})
            control.advance(engine_, sweep_.id, Queue())
            monkeypatch.setattr(control, "load_state", load_after_a_rival)
        return real_load(engine_, sweep_, runs)

    monkeypatch.setattr(control, "load_state", load_after_a_rival)
    for _ in range(7):
        for run in repo.sweep_runs(engine, sweep.id):
            if run.status == "queued":
                repo.claim_run(engine, run.id, "w1")
                repo.finish_run(engine, run.id, "completed", summary={})
        control.advance(engine, sweep.id, Queue())
    assert raced
    assert [t.number for t in repo.trials(engine, sweep.id)] == list(range(8))


# --- the gate's rules for trials, applied by the controller (worker-side too) ------------------------------
def test_a_trial_waits_while_its_owner_is_at_the_queued_runs_limit(engine) -> None:
    """The limit stored with the sweep: a trial whose runs would take its owner past it is created at a later
    advance (every worker's reaper advances every running sweep), never beyond it."""
    own = repo.create_run(engine, BASE.model_dump(mode="json"), name="ana's own run", owner="ana")
    queue = Queue()
    sweep = control.create(engine, sweep_spec(seeds=2, budget={"parallel": 3}), owner="ana", send=queue, max_queued=4)
    assert len(queue.sent) == 2 and repo.queued_count(engine, "ana") == 3  # the next trial needs two places
    assert control.advance(engine, sweep.id, queue) == [] and len(repo.trials(engine, sweep.id)) == 1
    repo.request_cancel(engine, own.id)  # a place frees
    assert len(control.advance(engine, sweep.id, queue)) == 2 and repo.queued_count(engine, "ana") == 4
    for run_id in queue.sent[:2]:  # the first trial's runs start: the third trial fits, parallel allows it
        repo.claim_run(engine, run_id, "w1")
    assert len(control.advance(engine, sweep.id, queue)) == 2 and repo.queued_count(engine, "ana") == 4


def test_the_limit_is_counted_again_where_a_trial_is_stored(engine) -> None:
    """A run queued between the controller's look and the trial's transaction: the transaction refuses the
    trial (the stored limit, whatever record the caller holds) and leaves its number free."""
    from dataclasses import replace

    sweep = repo.create_sweep(
        engine, sweep_spec().model_dump(mode="json", by_alias=True), name="s", owner="ana", max_queued=1
    )
    repo.create_run(engine, BASE.model_dump(mode="json"), name="queued meanwhile", owner="ana")
    with pytest.raises(repo.QueueLimitReached, match="ana has 1 queued runs; this dashboard allows 1"):
        repo.add_trial(engine, replace(sweep, max_queued=None), 0, {}, {}, [(BASE.model_dump(mode="json"), "s #0")])
    assert repo.trials(engine, sweep.id) == [] and len(repo.sweep_runs(engine, sweep.id)) == 0


def test_a_stored_sweep_over_a_file_never_gets_a_trial(engine) -> None:
    """A sweep over model.weights_file, stored before such spaces were refused: it still loads (its page shows
    it), and the controller refuses its trial, naming the field, and ends it."""
    from sweep.spec import SweepSpecError

    data = {
        **sweep_spec().model_dump(mode="json", by_alias=True),
        "space": {"model.weights_file": {"choice": ["/etc/shadow"]}},
    }
    with pytest.raises(SweepSpecError, match="space.model.weights_file: names a file or a dataset"):
        SweepSpec.from_dict(data)
    sweep = repo.create_sweep(engine, data, name="old", owner="ana")
    assert control.spec_of(sweep).space["model.weights_file"].choice == ["/etc/shadow"]
    assert control.advance(engine, sweep.id, Queue()) == []
    after = repo.get_sweep(engine, sweep.id)
    assert after.status == "failed" and "model.weights_file" in after.error
    assert repo.trials(engine, sweep.id) == [] and repo.sweep_runs(engine, sweep.id) == []


def test_a_sweeps_trials_are_queued_at_its_priority_and_move_with_it(engine) -> None:
    queue = Queue()
    sweep = control.create(engine, sweep_spec(budget={"parallel": 2}), owner="ana", send=queue, priority=-1)
    assert repo.get_sweep(engine, sweep.id).priority == -1
    assert [repo.get_run(engine, i).priority for i in queue.sent] == [-1, -1]
    play(engine, repo.get_run(engine, queue.sent[0]))  # one trial runs: it keeps the priority it ran at
    assert repo.set_sweep_priority(engine, sweep.id, 0) == 1  # the queued one moves
    assert [repo.get_run(engine, i).priority for i in queue.sent] == [-1, 0]
    control.advance(engine, sweep.id, queue)
    assert repo.get_run(engine, queue.sent[-1]).priority == 0  # and the trials to come
    with pytest.raises(ValueError, match="priority 3"):
        repo.set_sweep_priority(engine, sweep.id, 3)
    with pytest.raises(repo.SweepNotFound):
        repo.set_sweep_priority(engine, "nosuchsweep", 0)
