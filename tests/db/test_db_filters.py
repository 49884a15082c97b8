"""Organising runs in the store: the filter expression (metrics, hyperparameters, status, owner, tag, sweep,
parent) read into clauses and run as SQL on SQLite and Postgres; errors that say what is wrong and where;
notes; a search that finds tags and notes; a readable name for a run launched without one."""

from __future__ import annotations

import pytest
from sqlalchemy import Engine

from core.config import RunSpec
from db import repo
from db.filters import Clause, FilterError, parse
from db.types import MetricPoint


def _spec(**sections) -> dict:
    return RunSpec.model_validate({"data": {"name": "digits"}, **sections}).model_dump(mode="json")


def _names(page: repo.RunPage) -> set[str]:
    return {r.name for r in page.runs}


def _where(engine: Engine, expression: str, **filters) -> set[str]:
    page = repo.list_runs(engine, expression=expression, **filters)
    assert page.total == len(page.runs)
    return _names(page)


@pytest.fixture
def runs(engine: Engine) -> dict[str, repo.RunRecord]:
    """Four runs: two resnet18 (one at lr 1e-3, batch 128, pretrained), an mlp, and one without metrics."""
    made = {
        "res-small-lr": repo.create_run(
            engine,
            _spec(model={"name": "resnet18", "pretrained": True}, optim={"lr": 1e-3}, train={"batch_size": 128}),
            name="res-small-lr",
            owner="ana",
            tags=["resnet", "keep"],
        ),
        "res-big-lr": repo.create_run(
            engine,
            _spec(model={"name": "resnet18"}, optim={"lr": 0.1}, seed=7),
            name="res-big-lr",
            owner="bob",
            tags=["resnet"],
        ),
        "mlp": repo.create_run(
            engine, _spec(model={"name": "mlp"}, optim={"lr": 5e-4, "name": "sgd"}), name="mlp", owner="bob"
        ),
        "fresh": repo.create_run(engine, _spec(), name="fresh", owner="ana"),
    }
    # val/acc rises to its last value; res-big-lr peaks early then collapses (max 0.95, last 0.5).
    curves = {"res-small-lr": [0.7, 0.85, 0.93], "res-big-lr": [0.95, 0.6, 0.5], "mlp": [0.6, 0.8, 0.91]}
    for name, accs in curves.items():
        repo.append_metrics(engine, made[name].id, [MetricPoint("val/acc", s, v, s) for s, v in enumerate(accs, 1)])
        repo.claim_run(engine, made[name].id, "w1")
    repo.finish_run(engine, made["mlp"].id, "completed")
    return made


def test_metric_clauses_use_the_last_value_unless_told_max_or_min(engine: Engine, runs: dict) -> None:
    assert _where(engine, "val/acc > 0.9") == {"res-small-lr", "mlp"}
    assert _where(engine, "max(val/acc) > 0.9") == {"res-small-lr", "res-big-lr", "mlp"}
    assert _where(engine, "min(val/acc) >= 0.65") == {"res-small-lr"}
    assert _where(engine, "last(val/acc)<=0.5") == {"res-big-lr"}
    assert _where(engine, "val/acc != 0.93") == {"res-big-lr", "mlp"}  # a run without the series matches none
    assert _where(engine, "val/f1 > 0") == set()  # an unknown key: nothing, not an error
    assert _where(engine, '"val/acc" >= 0.91') == {"res-small-lr", "mlp"}


def test_hyperparameter_clauses_read_the_runs_spec(engine: Engine, runs: dict) -> None:
    assert _where(engine, "optim.lr <= 1e-3") == {"res-small-lr", "mlp", "fresh"}  # fresh: the default 1e-3
    assert _where(engine, "optim.lr < 1e-3") == {"mlp"}
    assert _where(engine, "train.batch_size == 128") == {"res-small-lr"}
    assert _where(engine, "model.name == resnet18") == {"res-small-lr", "res-big-lr"}
    assert _where(engine, "model.name != resnet18") == {"mlp", "fresh"}
    assert _where(engine, "optim.name == 'sgd'") == {"mlp"}
    assert _where(engine, "model.pretrained == true") == {"res-small-lr"}
    assert _where(engine, "model.pretrained == false") == {"res-big-lr", "mlp", "fresh"}
    assert _where(engine, "seed == 7") == {"res-big-lr"}
    assert _where(engine, "data.name == digits and optim.lr > 0.01") == {"res-big-lr"}


def test_clauses_combine_with_each_other_and_with_the_other_filters(engine: Engine, runs: dict) -> None:
    assert _where(engine, "val/acc > 0.9 and optim.lr <= 1e-3") == {"res-small-lr", "mlp"}
    assert _where(engine, "val/acc>0.9 AND optim.lr<=1e-3 and model.name==resnet18") == {"res-small-lr"}
    assert _where(engine, "max(val/acc) > 0.9", owner="bob") == {"res-big-lr", "mlp"}
    assert _where(engine, "optim.lr <= 1e-3", text="RES-") == {"res-small-lr"}
    page = repo.list_runs(engine, expression="max(val/acc) > 0.5", sort="metric:val/acc", limit=2)
    assert page.total == 3 and [r.name for r in page.runs] == ["res-small-lr", "mlp"]


def test_status_owner_tag_sweep_and_parent_clauses(engine: Engine, runs: dict) -> None:
    assert _where(engine, "status == running") == {"res-small-lr", "res-big-lr"}
    assert _where(engine, "status != running") == {"mlp", "fresh"}
    assert _where(engine, "owner == ana") == {"res-small-lr", "fresh"}
    assert _where(engine, "tag == resnet and tag != keep") == {"res-big-lr"}
    child = repo.create_run(engine, _spec(), name="child", parent_id=runs["mlp"].id)
    assert _where(engine, f"parent == {runs['mlp'].id}") == {"child"}
    assert "child" in _where(engine, f"parent != {runs['fresh'].id}")
    sweep = repo.create_sweep(engine, {"base": _spec()}, name="s", owner="ana")
    repo.add_trial(engine, sweep, 0, {"optim.lr": 0.01}, {}, [(_spec(optim={"lr": 0.01}), "trial-0")])
    assert _where(engine, f"sweep == {sweep.id}") == {"trial-0"}
    assert "trial-0" not in _where(engine, f"sweep != {sweep.id}") and child.name in _where(
        engine, f"sweep != {sweep.id}"
    )


def test_an_owner_is_found_by_the_verified_e_mail_of_their_account(engine: Engine) -> None:
    key = "https://sso.example.com#id-ana"
    repo.upsert_account(engine, key, "Ana", "Ana@Example.com")
    repo.create_run(engine, _spec(), name="keyed", owner=key)
    repo.create_run(engine, _spec(), name="other", owner="bob")
    assert _where(engine, "owner == ana@example.com") == {"keyed"}
    assert _where(engine, f'owner == "{key}"') == {"keyed"}
    assert _where(engine, "owner != ana@example.com") == {"other"}


def test_text_search_finds_tags_and_notes(engine: Engine) -> None:
    a = repo.create_run(engine, _spec(), name="alpha", tags=["Baseline-2024"])
    b = repo.create_run(engine, _spec(), name="beta")
    repo.set_notes(engine, b.id, "Tried warmup 5%; loss spiked at epoch 3.\nNext: lower lr.")
    assert _names(repo.list_runs(engine, text="baseline")) == {"alpha"}
    assert _names(repo.list_runs(engine, text="SPIKED")) == {"beta"}
    assert _names(repo.list_runs(engine, text="5%")) == {"beta"}  # wildcards taken literally
    assert _names(repo.list_runs(engine, text=a.id[:7])) == {"alpha"}
    repo.set_tags(engine, a.id, ["renamed"])  # tags change after launch: the search follows
    assert repo.list_runs(engine, text="baseline").total == 0


def test_notes_are_kept_as_written_bounded_and_cleared_when_blank(engine: Engine) -> None:
    run = repo.create_run(engine, _spec(), name="n")
    assert run.notes == ""
    text = "  # not a heading\n*not bold* <b>x</b>\n"
    assert repo.set_notes(engine, run.id, text).notes == text
    assert repo.get_run(engine, run.id).notes == text
    assert repo.set_notes(engine, run.id, "x" * 10_000).notes == "x" * 10_000
    with pytest.raises(ValueError, match="notes are 10,001 characters long; the limit is 10,000"):
        repo.set_notes(engine, run.id, "x" * 10_001)
    with pytest.raises(ValueError, match="NUL"):
        repo.set_notes(engine, run.id, "a\0b")
    assert repo.get_run(engine, run.id).notes == "x" * 10_000  # a refused edit changes nothing
    assert repo.set_notes(engine, run.id, "   \n").notes == ""
    with pytest.raises(repo.RunNotFound):
        repo.set_notes(engine, "nosuchrun", "hello")


def test_a_run_without_a_name_gets_its_dataset_model_and_short_id(engine: Engine) -> None:
    run = repo.create_run(engine, _spec(model={"name": "resnet18"}))
    assert run.name == f"digits-resnet18-{run.id[:6]}"
    bare = repo.create_run(engine, {"lr": 0.1})
    assert bare.name == f"run-{bare.id[:6]}"
    assert repo.create_run(engine, _spec(), name="  mine ").name == "mine"


# --- reading an expression (no database) -------------------------------------------------------------------
def test_an_expression_reads_into_clauses() -> None:
    assert parse("") == () and parse("   ") == ()
    assert parse("val/acc > 0.9 and optim.lr <= 1e-3") == (
        Clause("metric", "val/acc", ">", 0.9),
        Clause("spec", "optim.lr", "<=", 0.001),
    )
    assert parse("max( val/loss )<2") == (Clause("metric", "val/loss", "<", 2.0, "max"),)
    assert parse("status = completed") == (Clause("status", "status", "==", "completed"),)
    assert parse("lr > 0.01")[0].kind == "metric"  # a word that is no field is a metric key
    assert parse('tag == "two words"') == (Clause("tag", "tag", "==", "two words"),)


@pytest.mark.parametrize(
    ("expression", "message"),
    [
        ("val/acc => 0.9", "unknown operator '=>' at position 9; use one of > >= < <= == !="),
        ("val/acc 0.9", "expected an operator at position 9, found '0.9'"),
        ("val/acc >", "expected a value at position 10 after '>'"),
        ("optim.lrr < 1", "unknown spec field 'optim.lrr' at position 1; did you mean optim.lr"),
        ("optm.lr < 1", "did you mean optim.lr"),
        ("train.batch < 1", "did you mean train.batch_size"),
        ("val/acc > high", "'val/acc' is a metric and is compared with a number, not 'high' (position 11)"),
        ("stauts == running", "did you mean status"),
        ("status == done", "unknown status 'done' at position 11; known: queued, running"),
        ("status > running", "status at position 1 is compared with == or !=, not '>'"),
        ("model.name > resnet18", "model.name at position 1 is compared with == or !=, not '>'"),
        ("model.name == resnet81", "model.name is one of mlp, simple_cnn"),
        ("optim.lr == fast", "optim.lr is a number: 'fast' at position 13 is not one"),
        ("model.pretrained == yes", "model.pretrained is true or false: 'yes' at position 21 is neither"),
        ("export.formats == onnx", "export.formats holds a list"),
        ("val/acc > 0.9 or val/acc < 0.1", "'or' at position 15: only 'and' joins conditions"),
        ("val/acc > 0.9 optim.lr < 1", "expected 'and' at position 15, found 'optim.lr'"),
        ("val/acc > 0.9 and", "nothing after 'and' at position 15"),
        ("avg(val/acc) > 1", "unknown function 'avg' at position 1; use one of last(...), max(...), min(...)"),
        ("max(val/acc > 1", "max( at position 1 needs a metric key and a closing ')'"),
        ('tag == "open', "unclosed quote at position 8"),
        ("> 1", "expected a metric or a field at position 1, found '>'"),
    ],
)
def test_an_unreadable_expression_says_what_is_wrong_and_where(expression: str, message: str) -> None:
    with pytest.raises(FilterError) as caught:
        parse(expression)
    assert message in str(caught.value)


def test_list_runs_refuses_an_unreadable_expression(engine: Engine) -> None:
    with pytest.raises(FilterError, match="unknown operator"):
        repo.list_runs(engine, expression="val/acc =< 1")
