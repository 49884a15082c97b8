"""The Runs, Run and Compare pages show a run's name, its tags, class names and what a run wrote (errors,
diagnosis) as their text: a name that is Markdown for a remote image, a tag with backticks, a class name
that is HTML. What the pages send is rendered (tests/app/markdown_view.py) and compared with the text."""

from __future__ import annotations

import html

from markdown_view import shown
from seeding import plotly_figures, seed_run

from db import repo
from db.types import EventInput

NAME = "![x](https://elsewhere/p.png)"
TAGS = ("`tick`", "a``b ` c", "![t](https://elsewhere/t.png)")
HTML_NAME = "<b>bold</b> & <img src=https://elsewhere/q.png> ![x](https://elsewhere/p.png)"
CLASSES = ["<b>cat</b>", "dog & co", "![c](https://elsewhere/c.png)"]
MESSAGE = "loss is `flat` ![i](https://elsewhere/i.png) <b>see</b>"
ADVICE = "**not bold**, _not italic_, [not a link](https://elsewhere/)"
ERROR = "RuntimeError: [boom](https://elsewhere/)\n  File `train.py`, line 3\n    x = *y*"


def _tab(at, key: str, label: str):
    at.session_state[key] = label
    return at.run()


def _plain(markdown: str) -> str:
    """The text a Markdown string shows, refusing any element that is not our own formatting."""
    view = shown(markdown)
    assert not ({"img", "a", "em", "h1", "h2", "ul", "ol", "blockquote"} & {t for t, _ in view.tags}), view.html
    assert not view.rewritten(), view.raw_text
    return view.text


def _plotly_shows(text: str) -> str:
    """What Plotly shows for a title, legend or tick text: its HTML tags are markup, entities are decoded."""
    assert "<" not in text and ">" not in text, text
    return html.unescape(text)


def test_run_page_shows_the_name_and_tags_as_text(page, engine):
    r = seed_run(engine, NAME, tags=TAGS, steps=20, epochs=2)
    at = page("run.py", id=r.id)
    assert not at.exception
    assert _plain(at.title[0].value) == NAME
    caption = next(c.value for c in at.caption if "tags" in c.value)
    assert sorted(r.tags) == sorted(TAGS)
    assert shown(caption).code[-3:] == list(r.tags)  # each tag one code span, backticks and all
    assert _plain(caption).endswith("tags " + ", ".join(r.tags))


def test_run_page_shows_errors_diagnosis_and_class_names_as_text(page, engine):
    r = seed_run(engine, "broken", status="running", steps=10, epochs=1)
    repo.finish_run(engine, r.id, "failed", error=ERROR)
    repo.append_events(
        engine,
        r.id,
        [
            EventInput("diagnosis", "warning", MESSAGE, code="loss_not_decreasing", data={"advice": ADVICE}),
            EventInput(
                "evaluation",
                "info",
                "epoch 1",
                data={
                    "epoch": 1,
                    "confusion": [[1, 0, 0], [0, 1, 0], [0, 0, 1]],
                    "per_class_acc": [1.0, 1.0, 1.0],
                    "class_names": CLASSES,
                },
            ),
        ],
    )
    at = page("run.py", id=r.id)
    assert _plain(next(e.value for e in at.error if "RuntimeError" in e.value)) == ERROR  # line breaks kept
    at = _tab(at, "run.tab", "Diagnosis & evaluation")
    warning = next(w.value for w in at.warning if "loss_not_decreasing" in w.value)
    assert _plain(warning) == f"loss_not_decreasing — {MESSAGE}What to do: {ADVICE}"
    assert [t for t, _ in shown(warning).tags] == ["p", "strong", "p", "strong"]  # our bold labels still work
    figs = plotly_figures(at)
    for title in ("Confusion matrix (validation)", "Per-class accuracy (validation)"):
        assert [_plotly_shows(x) for x in figs[title]["data"][0]["x"]] == CLASSES, title


def test_runs_page_shows_the_name_and_tags_as_text(page, engine):
    r = seed_run(engine, NAME, tags=TAGS)
    at = page("runs.py")
    row = at.dataframe[0].value.iloc[0]
    assert row["name"] == NAME and sorted(row["tags"]) == sorted(TAGS)  # table cells are text already
    at.session_state["runs.table"] = {"selection": {"rows": [0], "columns": [], "cells": []}}
    at = at.run()
    next(b for b in at.button if b.label == "Delete").click()
    at = at.run()
    warning = next(w.value for w in at.warning if "cannot be undone" in w.value)
    assert f"Delete 1 run(s) — {NAME} ({r.id}) — with" in _plain(warning)  # what is deleted, by name


def test_compare_page_shows_run_names_as_text_in_its_charts(page, engine):
    a = seed_run(engine, HTML_NAME, tags=TAGS, steps=20, epochs=2, lr=0.001)
    b = seed_run(engine, NAME, steps=20, epochs=2, lr=0.01)
    at = page("compare.py", ids=f"{a.id},{b.id}")
    assert not at.exception
    assert at.multiselect(key="cmp.ids").value == [a.id, b.id]
    options = set(at.multiselect(key="cmp.ids").options)
    assert {f"{HTML_NAME} ({a.id})", f"{NAME} ({b.id})"} <= options  # option labels are plain text in Streamlit
    figs = plotly_figures(at)
    for key in ("train/loss", "val/acc"):
        assert [_plotly_shows(t["name"]) for t in figs[key]["data"]] == [HTML_NAME, NAME], key
