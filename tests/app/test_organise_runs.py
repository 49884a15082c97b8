"""Organising runs on the pages: tags and notes edited after launch by the run's owner or an admin (refused by
the service to anyone else), notes shown as their text, the Runs page's filter expression kept in the URL with
the other filters, a search that finds tags and notes, lineage links on the Run page, readable default names."""

from __future__ import annotations

from urllib.parse import quote

import pytest
from markdown_view import shown
from seeding import DIGITS, seed_run
from test_auth import ADMIN, ANA, BOB, claims, team, team_page, user  # noqa: F401 - `team` is a fixture

from app import auth
from app.services.runs import set_notes, set_tags, submit
from core.config import RunSpec
from db import repo
from db.types import MetricPoint

NOTES = "# not a heading\n**lr 3e-4** was <b>too low</b> ![x](https://elsewhere/x.png)\n- not a list"


def _click(at, label: str):
    next(b for b in at.button if b.label == label).click()
    return at.run()


def _table(at):
    return at.dataframe[0].value


def _plain(markdown: str) -> str:
    view = shown(markdown)
    assert not ({"img", "a", "em", "strong", "h1", "ul", "li"} & {t for t, _ in view.tags}), view.html
    return view.text


def _spec(**more) -> dict:
    return RunSpec.model_validate({**DIGITS, **more}).model_dump(mode="json")


# --- tags and notes ---------------------------------------------------------------------------------------
def test_the_owner_edits_tags_and_notes_after_launch_and_sees_the_notes_as_text(page, engine):
    r = seed_run(engine, "base", tags=("old",), epochs=1)
    at = page("run.py", id=r.id)
    assert not at.exception
    at.text_input(key=f"run.tags.{r.id}").input("baseline, lr-sweep, baseline")
    at.text_area(key=f"run.notes.{r.id}").input(NOTES)
    at = _click(at, "Save")
    assert not at.exception and not at.error
    stored = repo.get_run(engine, r.id)
    assert stored.tags == ("baseline", "lr-sweep") and stored.notes == NOTES
    caption = next(c.value for c in at.caption if "tags" in c.value)
    assert shown(caption).code[-2:] == ["baseline", "lr-sweep"]
    body = next(m.value for m in at.markdown if "not a heading" in m.value)
    assert _plain(body) == NOTES  # every line as written, line breaks kept, no markup


def test_a_refused_edit_says_why_and_changes_nothing(page, engine):
    r = seed_run(engine, "base", tags=("keep",))
    at = page("run.py", id=r.id)
    at.text_input(key=f"run.tags.{r.id}").input("ok, " + "t" * 65)
    at.text_area(key=f"run.notes.{r.id}").input("new notes")
    at = _click(at, "Save")
    assert [_plain(e.value) for e in at.error] == [
        "Tags and notes not saved: tag is 65 characters long; the limit is 64"
    ]
    stored = repo.get_run(engine, r.id)
    assert stored.tags == ("keep",) and stored.notes == ""  # neither was written
    assert at.text_area(key=f"run.notes.{r.id}").proto.max_chars == 10_000  # the form stops at the limit…
    with pytest.raises(ValueError, match="notes are 10,001 characters long; the limit is 10,000"):
        set_notes(r.id, "x" * 10_001, engine=engine, by=auth.local_user())  # …and the service too


def test_a_save_that_fails_half_way_changes_neither_tags_nor_notes(page, engine):
    """Tags and notes are written in one transaction: the database refusing the notes leaves the tags too."""
    r = seed_run(engine, "base", tags=("keep",))
    with engine.begin() as conn:  # the notes' write fails at the database, after the tags' would have been written
        conn.exec_driver_sql(
            "CREATE TRIGGER no_notes BEFORE UPDATE OF notes ON run BEGIN SELECT RAISE(ABORT, 'the disk is full'); END"
        )
    at = page("run.py", id=r.id)
    at.text_input(key=f"run.tags.{r.id}").input("new-tag")
    at.text_area(key=f"run.notes.{r.id}").input("new notes")
    _click(at, "Save")
    stored = repo.get_run(engine, r.id)
    assert stored.tags == ("keep",) and stored.notes == ""  # the run as it was: neither half saved


def test_in_team_mode_only_the_owner_or_an_admin_may_edit_tags_and_notes(team, engine):
    bob = user(BOB)
    r = seed_run(engine, "bobs", owner=bob.id, tags=("mine",))
    at = team_page("run.py", claims(ANA), id=r.id)
    assert not at.exception
    with pytest.raises(KeyError):  # others never see the control…
        at.text_area(key=f"run.notes.{r.id}")
    # …and the service refuses them, whatever a page shows.
    with pytest.raises(auth.PermissionDenied, match=rf"Ana \({ANA}\) may not tag run {r.id}: it belongs to "):
        set_tags(r.id, ["hijacked"], engine=engine, by=user(ANA))
    with pytest.raises(auth.PermissionDenied, match=f"may not annotate run {r.id}"):
        set_notes(r.id, "hijacked", engine=engine, by=user(ANA))
    assert repo.get_run(engine, r.id).tags == ("mine",) and repo.get_run(engine, r.id).notes == ""
    at = team_page("run.py", claims(BOB), id=r.id)
    at.text_area(key=f"run.notes.{r.id}").input("owner's note")
    _click(at, "Save")
    assert repo.get_run(engine, r.id).notes == "owner's note"
    assert set_tags(r.id, ["reviewed"], engine=engine, by=user(ADMIN)).tags == ("reviewed",)


# --- the Runs page: the filter expression, in the URL -----------------------------------------------------
def _finished(engine, name: str, acc: float, lr: float) -> repo.RunRecord:
    return seed_run(engine, name, lr=lr, epochs=2, val_acc=acc)


def test_a_filter_expression_from_a_link_filters_the_table(page, engine):
    _finished(engine, "good-small-lr", 0.95, 1e-3)
    _finished(engine, "good-big-lr", 0.96, 0.1)
    _finished(engine, "poor", 0.5, 1e-4)
    at = page("runs.py", q="val/acc > 0.9 and optim.lr <= 1e-3")
    assert not at.exception
    assert at.text_input(key="runs.q").value == "val/acc > 0.9 and optim.lr <= 1e-3"
    assert list(_table(at)["name"]) == ["good-small-lr"]
    at.text_input(key="runs.q").input("max(val/acc) > 0.9").run()
    assert sorted(_table(at)["name"]) == ["good-big-lr", "good-small-lr"]
    assert at.query_params["q"] == "max(val/acc) > 0.9"  # the view, shareable by link
    at.text_input(key="runs.q").input("").run()
    assert len(_table(at)) == 3 and "q" not in at.query_params


def test_an_unreadable_filter_says_where_and_is_not_applied(page, engine):
    _finished(engine, "a", 0.95, 1e-3)
    _finished(engine, "b", 0.5, 1e-3)
    at = page("runs.py", q="val/acc => 0.9")
    assert not at.exception
    error = next(e.value for e in at.error if "Filter not applied" in e.value)
    assert _plain(error) == ("Filter not applied: unknown operator '=>' at position 9; use one of > >= < <= == !=")
    assert len(_table(at)) == 2  # the table stays, unfiltered
    at.text_input(key="runs.q").input("optim.lrr < 1").run()
    assert any("did you mean optim.lr" in e.value for e in at.error)


def test_every_filter_lives_in_the_url(page, engine):
    seed_run(engine, "alpha", tags=("x",), owner="ana")
    seed_run(engine, "beta", status="running", tags=("x",), owner="bob")
    seed_run(engine, "gamma", status="failed", owner="bob")
    at = page("runs.py", status="running,failed", tag="x", owner="bob")
    assert at.multiselect(key="runs.status").value == ["running", "failed"]
    assert at.selectbox(key="runs.tag").value == "x" and at.selectbox(key="runs.owner").value == "bob"
    assert list(_table(at)["name"]) == ["beta"]
    at.selectbox(key="runs.tag").set_value(None).run()
    at.text_input(key="runs.text").input("gam").run()
    assert list(_table(at)["name"]) == ["gamma"]
    assert at.query_params["search"] == "gam" and "tag" not in at.query_params
    assert at.query_params["status"] == "running,failed" and at.query_params["owner"] == "bob"


def test_grouping_waits_while_a_filter_expression_is_set(page, engine):
    seed_run(engine, "a", epochs=1, val_acc=0.95)
    seed_run(engine, "b", epochs=1, val_acc=0.3)
    at = page("runs.py")
    at.toggle(key="runs.group").set_value(True).run()
    assert "kind" in _table(at).columns
    at.text_input(key="runs.q").input("val/acc > 0.5").run()
    assert at.toggle(key="runs.group").disabled
    assert "kind" not in _table(at).columns and list(_table(at)["name"]) == ["a"]  # the runs, filtered
    at.text_input(key="runs.q").input("").run()
    assert not at.toggle(key="runs.group").disabled and "kind" in _table(at).columns


def test_search_finds_a_runs_notes_and_tags(page, engine):
    r = seed_run(engine, "first")
    seed_run(engine, "second", tags=("Ablation-B",))
    repo.set_notes(engine, r.id, "diverged after warmup; retry with clip 0.5")
    at = page("runs.py", search="WARMUP")
    assert list(_table(at)["name"]) == ["first"]
    at.text_input(key="runs.text").input("ablation").run()
    assert list(_table(at)["name"]) == ["second"]


# --- lineage ------------------------------------------------------------------------------------------------
def test_the_run_page_links_its_parent_and_its_children(page, engine):
    base = seed_run(engine, "base", epochs=1)
    rerun = repo.create_run(engine, dict(base.spec), name="again", parent_id=base.id)
    clone = repo.create_run(engine, _spec(optim={"lr": 0.05}), name="faster", parent_id=base.id)
    weights = f"/data/artifacts/runs/{base.id}/checkpoints/best.pt"
    tuned = repo.create_run(engine, _spec(model={"weights_file": weights}), name="tuned", parent_id=base.id)
    at = page("run.py", id=base.id)
    assert not at.exception
    kids = next(c.value for c in at.caption if "made from this one" in c.value)
    assert f"[again](run?id={rerun.id}) (re-run)" in kids
    assert f"[faster](run?id={clone.id}) (clone)" in kids
    assert f"[tuned](run?id={tuned.id}) (fine-tune)" in kids
    at = page("run.py", id=clone.id)
    assert any(f"clone of [base](run?id={base.id})" in c.value for c in at.caption)
    at = page("run.py", id=tuned.id)
    assert any(f"fine-tuned from [base](run?id={base.id})" in c.value for c in at.caption)


def test_many_children_link_to_the_runs_page_filtered_to_them(page, engine):
    base = seed_run(engine, "base")
    for i in range(12):
        repo.create_run(engine, dict(base.spec), name=f"child-{i:02d}", parent_id=base.id)
    at = page("run.py", id=base.id)
    kids = next(c.value for c in at.caption if "made from this one" in c.value)
    assert kids.count("](run?id=") == 10 and "12 run(s)" in kids
    assert f"and [2 more](runs?q={quote(f'parent == {base.id}')}&project=default)" in kids
    at = page("runs.py", q=f"parent == {base.id}")
    assert len(_table(at)) == 12 and "base" not in list(_table(at)["name"])


def test_names_in_lineage_links_are_their_text(page, engine):
    name = "[evil](https://elsewhere/) ![i](https://elsewhere/i.png)"
    base = seed_run(engine, name)
    child = repo.create_run(engine, dict(base.spec), name="kid", parent_id=base.id)
    at = page("run.py", id=child.id)
    line = next(c.value for c in at.caption if "re-run of" in c.value)
    links = [attrs.get("href") for tag, attrs in shown(line).tags if tag == "a"]
    assert links == [f"run?id={base.id}"] and name in shown(line).text


# --- names ----------------------------------------------------------------------------------------------------
def test_a_run_submitted_without_a_name_gets_a_readable_one(engine, broker):
    spec = RunSpec.model_validate({**DIGITS, "name": None, "model": {"name": "mlp"}, "device": "cpu"})
    r = submit(spec, engine=engine)
    assert r.name == f"digits-mlp-{r.id[:6]}"
    assert submit(spec.model_copy(update={"name": "mine"}), engine=engine).name == "mine"


def test_the_readable_name_is_what_the_runs_page_shows(page, engine):
    r = repo.create_run(engine, _spec(model={"name": "resnet18"}))
    repo.append_metrics(engine, r.id, [MetricPoint("val/acc", 1, 0.5, 1)])
    row = _table(page("runs.py")).iloc[0]
    assert row["name"] == f"digits-resnet18-{r.id[:6]}" and row["id"] == r.id
