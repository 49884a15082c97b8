"""The Models page: a model's versions with their scores side by side and a link to each run, its aliases and
stable links, the alias moves, and the alias form, which a member who does not own the model never sees."""

from __future__ import annotations

from test_auth import ANA, BOB, claims, team, team_page  # noqa: F401 - `team` is a fixture
from test_registry import exported_run

from app import auth
from app.services import registry


def _two_versions(engine, home, owner: auth.User):
    runs = [exported_run(engine, home, data, owner=owner.id) for data in (b"onnx-1", b"onnx-2")]
    for r in runs:
        registry.register(r.id, "digits", owner, engine)
    registry.set_alias("digits", "production", 1, owner, engine)
    return runs


def test_the_page_shows_versions_scores_runs_aliases_and_the_alias_form(page, engine, home):
    runs = _two_versions(engine, home, auth.local_user())
    at = page("models.py")
    assert not at.exception and not at.error
    table = at.dataframe[0].value
    assert list(table["version"]) == [2, 1] and list(table["run"]) == [f"run?id={r.id}" for r in reversed(runs)]
    assert list(table["best val acc"]) == [0.91, 0.91] and list(table["test acc"]) == [0.88, 0.88]
    assert list(table["aliases"][table["version"] == 1])[0] == ["production"]
    assert [list(e) for e in table["evaluations"]] == [[], []]
    assert "/_torchdeck/models/digits@production/model.onnx" in at.code[0].value
    at.selectbox(key="models.alias").set_value("production")
    at.selectbox(key="models.version").set_value(2)
    at.button[-1].click().run()  # the form's Move
    assert registry.resolve("digits", "production", engine).version == 2
    assert len(at.dataframe) == 2 and list(at.dataframe[1].value["to"]) == [2, 1]


def test_another_member_sees_the_model_but_not_the_alias_form(team, engine, home):
    ana = auth.user_from_claims({"is_logged_in": True, **claims(ANA)})
    _two_versions(engine, home, ana)
    at = team_page("models.py", claims(BOB))
    assert not at.exception and list(at.dataframe[0].value["version"]) == [2, 1]
    assert not [s for s in at.selectbox if s.key == "models.alias"]
    at = team_page("models.py", claims(ANA))
    assert [s for s in at.selectbox if s.key == "models.alias"]


def test_a_versions_evaluations_on_other_data_are_shown_beside_its_scores(page, engine, home):
    from db.evaluations import add_evaluation

    runs = _two_versions(engine, home, auth.local_user())
    for dataset, acc in (("site-b", 0.85), ("site-b", 0.8), ("digits", 0.97)):  # the newest per dataset, not the best
        add_evaluation(
            engine,
            runs[0].id,
            "a" * 32,
            dataset=dataset,
            dataset_path=None,
            fingerprint="f" * 64,
            metrics={"acc": acc, "f1_macro": acc - 0.01},
            details={"images": 300},
            created_by="local",
        )
    table = page("models.py").dataframe[0].value
    shown = {v: list(e) for v, e in zip(table["version"], table["evaluations"], strict=True)}
    assert shown == {1: ["digits acc 0.9700", "site-b acc 0.8000"], 2: []}
