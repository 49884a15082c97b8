"""The runs table: filters, sorting, pages, summary metrics, a bounded number of queries."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import pytest
from sqlalchemy import Engine, event

from db import repo
from db.types import MetricPoint

SPEC = {"model": {"name": "mlp"}}


@pytest.fixture
def runs(engine: Engine) -> dict[str, repo.RunRecord]:
    """Six runs of two owners in several states, with a val/acc each."""
    made = {}
    for i, (name, owner, tags) in enumerate(
        [
            ("resnet lr=0.1", "ada", ["sweep", "resnet"]),
            ("resnet lr=0.01", "ada", ["sweep", "resnet"]),
            ("mlp baseline", "bob", ["baseline"]),
            ("mlp 50% dropout", "bob", []),
            ("vit tiny", "ada", ["sweep"]),
            ("cnn_small", "bob", []),
        ]
    ):
        run = repo.create_run(engine, SPEC, name=name, owner=owner, tags=tags)
        repo.append_metrics(engine, run.id, [MetricPoint("val/acc", s, 0.5 + i * 0.05 + s * 0.001) for s in range(10)])
        made[name] = run
    repo.claim_run(engine, made["resnet lr=0.1"].id, "w1")
    repo.claim_run(engine, made["mlp baseline"].id, "w1")
    repo.finish_run(engine, made["mlp baseline"].id, "completed")
    repo.request_cancel(engine, made["cnn_small"].id)
    return made


def _names(page: repo.RunPage) -> list[str]:
    return [r.name for r in page.runs]


def test_newest_first_by_default_with_the_total(engine: Engine, runs: dict) -> None:
    page = repo.list_runs(engine)
    assert page.total == 6
    assert _names(page) == list(reversed(list(runs)))


def test_filters_combine(engine: Engine, runs: dict) -> None:
    assert set(_names(repo.list_runs(engine, owner="ada"))) == {"resnet lr=0.1", "resnet lr=0.01", "vit tiny"}
    assert _names(repo.list_runs(engine, status="running")) == ["resnet lr=0.1"]
    finished = repo.list_runs(engine, status=["completed", "cancelled"])
    assert set(_names(finished)) == {"mlp baseline", "cnn_small"}
    assert set(_names(repo.list_runs(engine, tag="sweep"))) == {"resnet lr=0.1", "resnet lr=0.01", "vit tiny"}
    assert set(_names(repo.list_runs(engine, tag=["sweep", "resnet"]))) == {"resnet lr=0.1", "resnet lr=0.01"}
    narrow = repo.list_runs(engine, tag="sweep", owner="ada", status="queued", text="RESNET")
    assert _names(narrow) == ["resnet lr=0.01"]
    assert repo.list_runs(engine, owner="nobody").total == 0


def test_text_search_takes_wildcards_literally(engine: Engine, runs: dict) -> None:
    assert _names(repo.list_runs(engine, text="50%")) == ["mlp 50% dropout"]
    assert _names(repo.list_runs(engine, text="_small")) == ["cnn_small"]
    assert repo.list_runs(engine, text="%").total == 1
    run_id = runs["vit tiny"].id
    assert _names(repo.list_runs(engine, text=run_id[:6])) == ["vit tiny"]


def test_pages_cover_every_run_once(engine: Engine, runs: dict) -> None:
    seen = []
    for offset in range(0, 6, 4):
        page = repo.list_runs(engine, sort="name", descending=False, limit=4, offset=offset)
        assert page.total == 6 and page.limit == 4 and page.offset == offset
        seen += _names(page)
    assert seen == sorted(runs)


def test_sort_by_a_metric_puts_runs_without_it_last(engine: Engine, runs: dict) -> None:
    extra = repo.create_run(engine, SPEC, name="no metrics yet")
    best_first = _names(repo.list_runs(engine, sort="metric:val/acc"))
    assert best_first[0] == "cnn_small" and best_first[-1] == extra.name
    worst_first = _names(repo.list_runs(engine, sort="metric:val/acc", descending=False))
    assert worst_first[0] == "resnet lr=0.1" and worst_first[-1] == extra.name


def test_sort_by_start_time_puts_unstarted_runs_last(engine: Engine, runs: dict) -> None:
    names = _names(repo.list_runs(engine, sort="started_at"))
    assert names[:2] == ["mlp baseline", "resnet lr=0.1"]


def test_each_run_carries_its_summary_metrics(engine: Engine, runs: dict) -> None:
    page = repo.list_runs(engine, text="vit")
    acc = page.runs[0].metrics["val/acc"]
    assert acc.count == 10 and acc.last_step == 9
    assert acc.last_value == pytest.approx(0.5 + 4 * 0.05 + 0.009)
    assert acc.max_value == acc.last_value and acc.min_value == pytest.approx(0.7)
    assert page.runs[0].tags == ("sweep",)


@contextmanager
def _count_queries(engine: Engine) -> Iterator[list[str]]:
    seen: list[str] = []

    def count(conn, cursor, statement, *args) -> None:  # noqa: ANN001
        if statement.lstrip().upper().startswith("SELECT"):
            seen.append(statement)

    event.listen(engine, "before_cursor_execute", count)
    try:
        yield seen
    finally:
        event.remove(engine, "before_cursor_execute", count)


def test_a_page_costs_the_same_few_queries_whatever_its_size(engine: Engine, runs: dict) -> None:
    for i in range(40):
        repo.create_run(engine, SPEC, name=f"bulk {i}", tags=["bulk"])
    with _count_queries(engine) as small:
        assert len(repo.list_runs(engine, limit=2).runs) == 2
    with _count_queries(engine) as large:
        assert len(repo.list_runs(engine, limit=46).runs) == 46
    assert len(small) == len(large) <= 4


def test_bad_listing_arguments_say_what_is_allowed(engine: Engine) -> None:
    with pytest.raises(ValueError, match="unknown run status 'done'"):
        repo.list_runs(engine, status="done")
    with pytest.raises(ValueError, match="cannot sort by 'speed'"):
        repo.list_runs(engine, sort="speed")
    with pytest.raises(ValueError, match="limit"):
        repo.list_runs(engine, limit=0)
    with pytest.raises(ValueError, match="offset"):
        repo.list_runs(engine, offset=-1)


def test_the_newest_first_page_is_read_from_an_index_filtered_or_not(engine: Engine, runs: dict) -> None:
    """However many runs there are, the default page never sorts them all: the database walks the
    (created_at, id) index and stops after the page (its plan has no sort step)."""
    pages: list[tuple[str, object]] = []

    def keep(conn, cursor, statement, parameters, *args) -> None:  # noqa: ANN001
        if statement.lstrip().upper().startswith("SELECT RUN.ID"):
            pages.append((statement, parameters))

    event.listen(engine, "before_cursor_execute", keep)
    try:
        repo.list_runs(engine, limit=2)
        repo.list_runs(engine, limit=2, expression="val/acc > 0.6")
    finally:
        event.remove(engine, "before_cursor_execute", keep)
    assert len(pages) == 2
    with engine.connect() as conn:
        for statement, params in pages:
            if engine.dialect.name == "sqlite":
                plan = " | ".join(str(r[-1]) for r in conn.exec_driver_sql("EXPLAIN QUERY PLAN " + statement, params))
                assert "ix_run_created_at_id" in plan and "TEMP B-TREE" not in plan, plan
            elif statement == pages[0][0]:  # Postgres weighs a filter by its statistics: only the plain page
                conn.exec_driver_sql("SET enable_seqscan = off")  # a six-run table: the planner would scan it
                plan = " | ".join(r[0] for r in conn.exec_driver_sql("EXPLAIN " + statement, params))
                assert "ix_run_created_at_id" in plan and "Sort" not in plan.replace("Incremental Sort", ""), plan
