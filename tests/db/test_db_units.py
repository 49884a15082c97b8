"""The Runs page's grouped rows, on SQLite and Postgres: one row per sweep, per seed group, per other run;
paged and sorted in the database."""

from __future__ import annotations

from db import repo


def _runs(engine):
    sweep = repo.create_sweep(engine, {"space": {}}, name="lr sweep", owner="ana")
    trial = repo.add_trial(engine, sweep, 0, {"optim.lr": 0.1}, {}, [({"seed": 0}, "t0 s1"), ({"seed": 1}, "t0 s2")])
    other = repo.add_trial(engine, sweep, 1, {"optim.lr": 0.01}, {}, [({"seed": 0}, "t1")])
    group = repo.new_group_id()
    seeds = [repo.create_run(engine, {"seed": s}, name=f"rep {s}", owner="bo", group_id=group) for s in (0, 1, 2)]
    alone = repo.create_run(engine, {"seed": 9}, name="alone", owner="bo")
    for run, value in ((trial[0], 0.5), (other[0], 0.9), (seeds[1], 0.7), (alone, 0.6)):
        repo.append_metrics(engine, run.id, [repo.MetricPoint("val/acc", 1, value, epoch=1)])
    return sweep, trial, other, group, seeds, alone


def test_rows_are_sweeps_groups_and_runs_paged_and_sorted(engine) -> None:
    sweep, trial, other, group, seeds, alone = _runs(engine)
    page = repo.list_units(engine, sort="metric:val/acc", limit=10)
    assert [(u.kind, u.id, u.runs) for u in page.units] == [
        ("sweep", sweep.id, 3),
        ("seed group", group, 3),
        ("run", alone.id, 1),
    ]
    assert page.total == 3 and page.runs == 7
    first, second = (repo.list_units(engine, sort="metric:val/acc", limit=2, offset=o).units for o in (0, 2))
    assert [u.id for u in first + second] == [u.id for u in page.units]
    within = repo.list_units(engine, sweep_id=sweep.id, sort="metric:val/acc")
    assert [(u.kind, u.runs) for u in within.units] == [("run", 1), ("seed group", 2)]
    assert repo.list_units(engine, owner="bo", text="rep").runs == 3


def test_a_pages_rows_get_their_runs_and_sweeps_at_once(engine) -> None:
    sweep, trial, other, group, seeds, alone = _runs(engine)
    page = repo.list_units(engine, sort="metric:val/acc", limit=10)
    gone = repo.Unit("run", "no-such-run", 1)
    found = repo.members(engine, [*page.units, gone])
    assert [[r.id for r in runs] for runs in found.runs.values()] == [
        [trial[0].id, trial[1].id, other[0].id],
        [s.id for s in seeds],
        [alone.id],
    ]  # by trial, oldest first
    assert gone not in found.runs and list(found.sweeps) == [sweep.id] and found.sweeps[sweep.id].name == "lr sweep"
    within = repo.list_units(engine, sweep_id=sweep.id, sort="metric:val/acc").units
    assert [len(runs) for runs in repo.members(engine, within).runs.values()] == [1, 2]
