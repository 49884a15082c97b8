"""One gate for every way a run is created (app/services/admission.py; core/admission.py for a sweep's trials): the New
run form, a clone, "start from a run's weights", `torchdeck submit`, a re-run, "Repeat with k seeds", a sweep's
best launched again, and a sweep (through the service and `torchdeck sweep`). Each entry point is driven with
the same bad specs, on SQLite and on Postgres, in team mode: a `data.path` outside the allowed folders, a
`model.weights_file` at /etc/shadow, and an owner already at the queued-runs limit. Each refuses alike: the
field named (a SpecError) or the limit said (QueueLimitReached), nothing stored, nothing sent; and each admits
a good spec once there is room (the refusals are not an entry point that admits nothing).

The entry points that start from something stored (a clone, a re-run, a repeat, a sweep's best) start from a
run or sweep stored with the bad spec by an operator (the CLI with TORCHDECK_PATH_ROOTS, or an older version):
what a member makes of it passes the gate again."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import yaml
from seeding import error_beside
from sqlalchemy import Engine
from test_auth import ANA, claims, team, team_page, user  # noqa: F401 - `team` is a fixture
from typer.testing import CliRunner

from app.services import paths, sweeps
from app.services.admission import MAX_QUEUED_ENV
from app.services.artifacts import artifact_root
from app.services.runs import rerun, submit
from core.config import RunSpec, SpecError
from db import repo
from db.engine import make_engine
from db.errors import QueueLimitReached
from db.migrate import upgrade
from db.types import MetricPoint
from sweep import control
from sweep.spec import SweepSpec
from tests.db.conftest import database_url  # noqa: F401 - the fixture: a real SQLite file, a real Postgres

LIMIT = 2
OPERATOR = "cli:operator"
GOOD = {
    "name": "good",
    "data": {"name": "digits", "image_size": 8},
    "model": {"name": "mlp"},
    "train": {"epochs": 2},
    "device": "cpu",
}
BAD = {
    "data.path": {**GOOD, "data": {"name": "imagefolder", "path": "/etc"}},
    "model.weights_file": {**GOOD, "model": {"name": "mlp", "weights_file": "/etc/shadow"}},
}
SWEPT = {"data.path": "/etc", "model.weights_file": "/etc/shadow"}  # the same values, in a sweep's space
Outcome = tuple[str, str]  # ("spec", the field named) | ("quota", "") | ("admitted", "")


@pytest.fixture
def engine(home: Path, database_url: str, monkeypatch: pytest.MonkeyPatch) -> Iterator[Engine]:  # noqa: F811
    """The dashboard's database on each backend (the pages and the CLI find it through the environment)."""
    monkeypatch.setenv("TORCHDECK_DATABASE_URL", database_url)
    upgrade(database_url)
    e = make_engine(database_url)
    yield e
    e.dispose()


@pytest.fixture
def gate(team, engine, broker, monkeypatch):
    monkeypatch.setenv(MAX_QUEUED_ENV, str(LIMIT))
    monkeypatch.delenv(paths.ROOTS_ENV, raising=False)
    return engine


def ana() -> str:
    return user(ANA).id


def plant(engine: Engine, spec: dict, *, status: str = "completed", owner: str = OPERATOR) -> repo.RunRecord:
    """A run stored without the gate (as an operator's CLI, or an older version, could have)."""
    run = repo.create_run(engine, RunSpec.model_validate(spec).model_dump(mode="json"), name=spec["name"], owner=owner)
    if status == "completed":
        repo.claim_run(engine, run.id, "w1")
        repo.finish_run(engine, run.id, "completed", summary={"epochs_run": 1})
    return repo.get_run(engine, run.id)


def plant_sweep(engine: Engine, base: dict) -> str:
    """A finished one-trial sweep over `base`, stored without the gate: its best is `base` itself."""
    spec = SweepSpec.model_validate(
        {"base": base, "space": {"optim.lr": {"choice": [0.01]}}, "method": "grid", "objective": {"metric": "val/acc"}}
    )
    sweep = control.create(engine, spec, owner=OPERATOR, send=lambda run: None, name="planted")
    run = repo.sweep_runs(engine, sweep.id)[0]
    repo.claim_run(engine, run.id, "w1")
    repo.append_metrics(engine, run.id, [MetricPoint("val/acc", 1, 0.9, epoch=1)])
    repo.finish_run(engine, run.id, "completed", summary={"epochs_run": 1})
    return sweep.id


def fill_queue(engine: Engine) -> list[str]:
    """Ana at the limit: LIMIT queued runs of hers."""
    return [plant(engine, GOOD, status="queued", owner=ana()).id for _ in range(LIMIT)]


def raised(call: Callable[[], object]) -> Outcome:
    try:
        call()
    except QueueLimitReached:
        return "quota", ""
    except SpecError as e:
        return "spec", " ".join(field.removeprefix("space.") for field, _ in e.errors)
    return "admitted", ""


# --- the entry points: each makes runs from `case` (a bad field's name, "quota" or "good") for Ana -----------
def spec_for(case: str) -> dict:
    return BAD.get(case, GOOD)


def by_service(engine: Engine, case: str) -> Outcome:
    return raised(lambda: submit(RunSpec.model_validate(spec_for(case)), owner=ana(), engine=engine))


def by_rerun(engine: Engine, case: str) -> Outcome:
    source = plant(engine, spec_for(case))
    return raised(lambda: rerun(source.id, owner=ana(), engine=engine))


def by_repeat(engine: Engine, case: str) -> Outcome:
    source = plant(engine, spec_for(case))
    return raised(lambda: sweeps.repeat_with_seeds(source.id, 2, owner=ana(), engine=engine))


def by_launch_best(engine: Engine, case: str) -> Outcome:
    sweep_id = plant_sweep(engine, spec_for(case))
    return raised(lambda: sweeps.launch_best(sweep_id, owner=ana(), engine=engine))


def sweep_of(case: str) -> SweepSpec:
    """A sweep swept over the bad value (the hole: a trial's spec was never checked), or over the learning rate."""
    space = {case: {"choice": [SWEPT[case]]}} if case in SWEPT else {"optim.lr": {"choice": [0.01, 0.001]}}
    return SweepSpec.model_validate({"base": GOOD, "space": space, "method": "grid"}, context={"stored": True})


def by_sweep(engine: Engine, case: str) -> Outcome:
    return raised(lambda: sweeps.submit_sweep(sweep_of(case), owner=ana(), engine=engine))


def cli(args: list[str]) -> Outcome:
    from app.cli import app

    done = CliRunner().invoke(app, args)
    if done.exit_code == 0:
        return "admitted", ""
    if "this dashboard allows" in done.output:
        return "quota", ""
    return "spec", " ".join(f for f in SWEPT if f in done.output)


def by_cli_submit(engine: Engine, case: str, tmp: Path) -> Outcome:
    (tmp / "run.yaml").write_text(yaml.safe_dump(spec_for(case)))
    return cli(["submit", str(tmp / "run.yaml"), "--owner", ana()])


def by_cli_sweep(engine: Engine, case: str, tmp: Path) -> Outcome:
    data = sweep_of(case).model_dump(mode="json", by_alias=True, exclude_none=True)
    (tmp / "sweep.yaml").write_text(yaml.safe_dump(data))
    return cli(["sweep", str(tmp / "sweep.yaml"), "--owner", ana()])


SERVICES = {
    "service": by_service,
    "rerun": by_rerun,
    "repeat": by_repeat,
    "launch-best": by_launch_best,
    "sweep": by_sweep,
}
CLIS = {"cli-submit": by_cli_submit, "cli-sweep": by_cli_sweep}


def with_checkpoint(engine: Engine) -> repo.RunRecord:
    """A finished run whose best checkpoint is a file under the artifact root, as a worker registers it."""
    run = plant(engine, {**GOOD, "name": "teacher"})
    path = artifact_root() / "runs" / run.id / "checkpoints" / "best.pt"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(b"not really a state_dict")
    repo.add_artifact(engine, run.id, "checkpoint_best", path.as_uri(), size=path.stat().st_size)
    return run


def set_case(at, case: str) -> None:
    if case == "data.path":
        at.selectbox(key="nr.f.data.name").set_value("imagefolder").run()
        at.text_input(key="nr.f.data.path").input("/etc")
    elif case == "model.weights_file":
        at.text_input(key="nr.f.model.weights_file").input("/etc/shadow")


def launched(at) -> Outcome:
    """What the New run page said when Launch run was pressed: the refused field beside it, the limit, or the
    new run's own page."""
    at = next(b for b in at.button if b.label == "Launch run").click().run()
    assert not at.exception, at.exception
    said = " ".join(e.value for e in at.error).replace("\\", "")
    if "this dashboard allows" in said:
        return "quota", ""
    named = [f for f in SWEPT if "outside the folders runs may read" in beside(at, f"nr.f.{f}")]
    return ("spec", " ".join(named)) if named else ("admitted" if not said else said, "")


def beside(at, key: str) -> str:
    """The error under a field ('' for none, or when the field is not drawn: a dataset that needs no path)."""
    try:
        return (error_beside(at, key) or "").replace("\\", "")
    except KeyError:
        return ""


def by_form(engine: Engine, case: str) -> Outcome:
    at = team_page("new_run.py", claims(ANA))
    set_case(at, case)
    return launched(at)


def by_clone(engine: Engine, case: str) -> Outcome:
    return launched(team_page("new_run.py", claims(ANA), clone=plant(engine, spec_for(case)).id))


def by_weights(engine: Engine, case: str) -> Outcome:
    teacher = with_checkpoint(engine)
    at = team_page("new_run.py", claims(ANA))
    at.selectbox(key="nr.weights_from").set_value(teacher.id).run()
    set_case(at, case)
    return launched(at)


PAGES = {"form": by_form, "clone": by_clone, "weights": by_weights}
EXPECTED = {
    "data.path": ("spec", "data.path"),
    "model.weights_file": ("spec", "model.weights_file"),
    "quota": ("quota", ""),
    "good": ("admitted", ""),
}


def anas(engine: Engine) -> tuple[int, int]:
    """Ana's runs and sweeps: what an entry point she uses may add."""
    return repo.list_runs(engine, owner=ana()).total, sum(s.owner == ana() for s in repo.list_sweeps(engine))


@pytest.mark.parametrize("entry", [*SERVICES, *CLIS, *PAGES])
def test_every_entry_point_refuses_the_same_bad_specs_alike(gate, broker, entry, tmp_path):
    engine = gate
    make = {**SERVICES, **PAGES}.get(entry) or (lambda e, case: CLIS[entry](e, case, tmp_path))
    outcomes = {}
    for case in ("data.path", "model.weights_file", "quota"):
        queue = fill_queue(engine) if case == "quota" else []
        before = anas(engine)
        outcomes[case] = make(engine, case)
        assert anas(engine) == before and broker.dbsize() == 0, (entry, case)  # nothing stored, nothing sent
        for run_id in queue:
            repo.request_cancel(engine, run_id)
    before = anas(engine)
    outcomes["good"] = make(engine, "good")
    assert anas(engine) > before and broker.dbsize() > 0
    assert outcomes == EXPECTED


def test_repeats_and_sweeps_never_take_a_person_past_the_limit(gate, broker):
    """The issue's numbers: at a limit of 2, two "Repeat with 20 seeds" had made 40 queued runs, three sweeps
    (parallel 2) 46. Now a group is stored whole or not at all, a sweep needs room for its first configuration,
    and its later trials wait for room (created at a later advance, as a worker's reaper does)."""
    engine = gate
    first = submit(RunSpec.model_validate(GOOD), owner=ana(), engine=engine)
    for _ in range(2):
        with pytest.raises(QueueLimitReached, match="these 19 would make 20"):
            sweeps.repeat_with_seeds(first.id, 20, owner=ana(), engine=engine)
    assert repo.get_run(engine, first.id).group_id is None  # a refused repeat leaves the run as it was
    spec = SweepSpec.model_validate(
        {
            "base": GOOD,
            "space": {"optim.lr": {"choice": [0.1, 0.01, 0.001]}},
            "method": "grid",
            "budget": {"parallel": 2},
        }
    )
    made = sweeps.submit_sweep(spec, owner=ana(), engine=engine)
    for _ in range(2):
        with pytest.raises(QueueLimitReached):
            sweeps.submit_sweep(spec, owner=ana(), engine=engine)
    assert repo.queued_count(engine, ana()) == LIMIT and len(repo.sweep_runs(engine, made.id)) == 1
    assert repo.get_sweep(engine, made.id).max_queued == LIMIT  # what a worker's controller applies
    assert control.advance(engine, made.id, sweeps.send) == []  # still no room: the second trial waits
    assert sweeps.waits_for_room(sweeps.view(made.id, engine), engine)  # what the sweep's page says
    repo.claim_run(engine, first.id, "w1")  # Ana's run starts: one place frees
    assert len(control.advance(engine, made.id, sweeps.send)) == 1
    assert not sweeps.waits_for_room(sweeps.view(made.id, engine), engine)  # parallel 2 in flight
    assert repo.queued_count(engine, ana()) == LIMIT and len(repo.list_sweeps(engine)) == 1


def test_a_sweep_never_turns_an_uploaded_dataset_into_a_download_folder(gate, home):
    """Sweeping data.name to mnist over another member's uploaded dataset, with download on, had torchvision
    write MNIST/raw into it: refused at validation, and a sweep stored so earlier never gets a trial."""
    engine = gate
    bobs = home / "datasets" / "pets"
    repo.create_dataset(
        engine, "pets", str(bobs), classes=["cat", "dog"], counts={"cat": 1, "dog": 1}, status="ready", owner="bob"
    )
    data = {
        "base": {**GOOD, "data": {"name": "imagefolder", "path": str(bobs), "download": True}},
        "space": {"data.name": {"choice": ["mnist"]}},
        "method": "grid",
    }
    with pytest.raises(SpecError) as refused:
        sweeps.submit_sweep(SweepSpec.model_validate(data, context={"stored": True}), owner=ana(), engine=engine)
    assert [f for f, _ in refused.value.errors] == ["space.data.name"] and repo.list_sweeps(engine) == []
    stored = control.create(engine, SweepSpec.stored(data), owner=ana(), send=sweeps.send)
    assert stored.status == "failed" and "data.name" in stored.error and "trial 0 refused" in stored.error
    assert repo.sweep_runs(engine, stored.id) == [] and repo.list_runs(engine, owner=ana()).total == 0


@pytest.mark.parametrize("entry", [*SERVICES, *CLIS, *PAGES])
def test_closing_the_one_gate_closes_every_entry_point(gate, broker, entry, tmp_path, monkeypatch):
    """Every way to create a run goes through app/services/admission.py: with its gate refusing everything, each
    entry point refuses a good spec, nothing stored, nothing sent. An entry point that stored its runs some other
    way (its own checks, or none) would still admit it."""
    from app.services import admission

    def closed(specs, **_):
        raise SpecError([("data.path", "the gate is closed")])

    monkeypatch.setattr(admission, "admit", closed)
    engine = gate
    make = {**SERVICES, **PAGES}.get(entry) or (lambda e, case: CLIS[entry](e, case, tmp_path))
    before = anas(engine)
    outcome = make(engine, "good")
    assert outcome[0] != "admitted" and anas(engine) == before and broker.dbsize() == 0, (entry, outcome)


def test_a_copy_out_of_bounds_is_refused_with_its_field(gate):
    """A repeat's runs are copies of a spec with other seeds, which pydantic does not validate: the gate
    validates each again as it will be stored (the seed's bound is 2^32 − 1)."""
    engine = gate
    top = plant(engine, {**GOOD, "seed": 2**32 - 1})
    with pytest.raises(SpecError) as refused:
        sweeps.repeat_with_seeds(top.id, 2, owner=ana(), engine=engine)
    assert [field for field, _ in refused.value.errors] == ["seed"] and repo.list_runs(engine, owner=ana()).total == 0
