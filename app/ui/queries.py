"""Database reads of the dashboard. One engine per database URL (st.cache_resource); the
reads that may be shared between reruns are cached briefly (st.cache_data with a TTL) and keyed
by the database URL, so two databases in one process never share answers.

Live views (a running run's charts) bypass the caches: they ask the database for the new
points only (`since_step`), which is cheaper than any cache."""

from __future__ import annotations

import functools
import os
from collections.abc import Callable, Sequence
from typing import Any, Concatenate, ParamSpec, TypeVar

import streamlit as st
from sqlalchemy import Engine

from app.services.broker import engine_for
from app.ui import run_units
from core.names import TEST_EVENT
from db import repo
from db.engine import database_url
from db.types import (
    DatasetRecord,
    EventRecord,
    RunPage,
    RunRecord,
    Series,
    SweepRecord,
    WorkerRecord,
)

# A live view polls this often (seconds); a metric is visible within about this long after
# its worker's sink flushed it. TORCHDECK_UI_REFRESH_S tunes it for slow shared machines.
REFRESH_S = float(os.environ.get("TORCHDECK_UI_REFRESH_S", "1.0"))
# A running run's charts poll faster: a refresh where nothing was written reads one short range of
# an index (app/live/series.py) and sends a few stamps, so a new point is drawn within about this
# long after its worker's sink wrote it.
LIVE_S = min(float(os.environ.get("TORCHDECK_UI_LIVE_S", "0.25")), REFRESH_S)


def db_url() -> str:
    return database_url()


def engine() -> Engine:
    return engine_for(db_url())


def clear() -> None:
    """After a write (submit, cancel, delete...): the next read must see it."""
    st.cache_data.clear()


P, T = ParamSpec("P"), TypeVar("T")


def shared(ttl: float, **cache: Any) -> Callable[[Callable[Concatenate[Engine, P], T]], Callable[P, T]]:
    """A read of the database, `read(engine, *args)`, as the pages call it, `read(*args)`: on the engine of the
    database URL, its answers shared between reruns and viewers for `ttl` seconds (st.cache_data, keyed by the
    database URL and the arguments, so two databases in one process never share answers)."""

    def wrap(read: Callable[Concatenate[Engine, P], T]) -> Callable[P, T]:
        @functools.wraps(read)  # the cache's key: the read's own name and source
        def by_url(url: str, *args: P.args, **kwargs: P.kwargs) -> T:
            return read(engine_for(url), *args, **kwargs)

        cached = st.cache_data(ttl=ttl, show_spinner=False, **cache)(by_url)

        @functools.wraps(read)
        def call(*args: P.args, **kwargs: P.kwargs) -> T:
            return cached(db_url(), *args, **kwargs)

        return call

    return wrap


@st.cache_data(ttl=2, show_spinner=False)
def _runs_page(
    url: str,
    status: tuple[str, ...],
    tag: tuple[str, ...],
    owner: str | None,
    text: str | None,
    sweep_id: str | None,
    expression: str | None,
    sort: str,
    descending: bool,
    limit: int,
    offset: int,
    project: str | None,
) -> RunPage:
    return repo.list_runs(
        engine_for(url),
        status=status or None,
        tag=tag or None,
        owner=owner,
        text=text,
        sweep_id=sweep_id,
        project=project,
        expression=expression,
        sort=sort,
        descending=descending,
        limit=limit,
        offset=offset,
    )


def runs_page(
    *,
    status: Sequence[str] = (),
    tag: Sequence[str] = (),
    owner: str | None = None,
    text: str | None = None,
    sweep_id: str | None = None,
    expression: str | None = None,
    sort: str = "created_at",
    descending: bool = True,
    limit: int = 50,
    offset: int = 0,
    project: str | None = None,
) -> RunPage:
    """A page of runs (of one project, or of all); `expression` is a filter expression (db.filters;
    repo.FilterError when unreadable)."""
    return _runs_page(
        db_url(),
        tuple(status),
        tuple(tag),
        owner or None,
        text or None,
        sweep_id or None,
        expression or None,
        sort,
        descending,
        limit,
        offset,
        project,
    )


@shared(ttl=2)
def children(engine: Engine, run_id: str, limit: int = 20) -> RunPage:
    """The runs made from this one (clones, re-runs, seed copies, fine-tunes), oldest first, with their total."""
    return repo.list_runs(engine, parent_id=run_id, sort="created_at", descending=False, limit=limit)


@st.cache_data(ttl=2, show_spinner=False)
def _units_page(
    url: str,
    status: tuple[str, ...],
    tag: tuple[str, ...],
    owner: str | None,
    text: str | None,
    sweep_id: str | None,
    sort: str,
    descending: bool,
    limit: int,
    offset: int,
    project: str | None,
) -> run_units.UnitPage:
    return run_units.list_units(
        engine_for(url),
        status=status,
        tag=tag,
        owner=owner,
        text=text,
        sweep_id=sweep_id,
        sort=sort,
        descending=descending,
        limit=limit,
        offset=offset,
        project=project,
    )


def units_page(
    *,
    status: Sequence[str] = (),
    tag: Sequence[str] = (),
    owner: str | None = None,
    text: str | None = None,
    sweep_id: str | None = None,
    sort: str = "created_at",
    descending: bool = True,
    limit: int = 50,
    offset: int = 0,
    project: str | None = None,
) -> run_units.UnitPage:
    """The Runs page grouped: one row per sweep, per seed group, per other run (app.ui.run_units.UnitPage), of one
    project (or of all)."""
    return _units_page(
        db_url(),
        tuple(status),
        tuple(tag),
        owner or None,
        text or None,
        sweep_id or None,
        sort,
        descending,
        limit,
        offset,
        project,
    )


def runs_by_id(run_ids: Sequence[str]) -> dict[str, RunRecord]:
    """The runs that still exist, by id (one query for the lot)."""
    return _runs_by_id(tuple(run_ids))


@shared(ttl=2)
def _runs_by_id(engine: Engine, run_ids: tuple[str, ...]) -> dict[str, RunRecord]:
    return run_units.load(engine, run_ids)


def unit_members(units: Sequence[run_units.Unit]) -> run_units.Members:
    """The runs of a page of grouped rows and the rows' sweeps, read for the whole page at once."""
    return _unit_members(tuple(units))


@shared(ttl=2)
def _unit_members(engine: Engine, units: tuple[run_units.Unit, ...]) -> run_units.Members:
    return run_units.members(engine, units)


@shared(ttl=10)
def sweeps(engine: Engine, project: str | None = None) -> list[SweepRecord]:
    """The newest sweeps (at most 500) of one project (or of all), newest first."""
    return repo.list_sweeps(engine, project=project)


@shared(ttl=5)
def sweep(engine: Engine, sweep_id: str) -> SweepRecord | None:
    try:
        return repo.get_sweep(engine, sweep_id)
    except repo.SweepNotFound:
        return None


@shared(ttl=5, max_entries=256)
def sweep_runs(engine: Engine, sweep_id: str) -> list[RunRecord]:
    """A sweep's runs by trial."""
    return repo.sweep_runs(engine, sweep_id)


@shared(ttl=5, max_entries=256)
def group_runs(engine: Engine, group_id: str) -> list[RunRecord]:
    """A seed group's runs, oldest first."""
    return repo.group_runs(engine, group_id)


@shared(ttl=30)
def owners_and_tags(engine: Engine, project: str | None = None) -> tuple[list[str], list[str]]:
    """The owners and tags of one project's runs (or of all): the Runs page's filter choices."""
    return repo.owners_and_tags(engine, project=project)


@st.cache_data(ttl=2, show_spinner=False)
def _run(url: str, run_id: str) -> RunRecord | None:
    try:
        return repo.get_run(engine_for(url), run_id)
    except repo.RunNotFound:
        return None


def run(run_id: str, fresh: bool = False) -> RunRecord | None:
    """A run or None. `fresh` skips the cache (live views)."""
    if fresh:
        try:
            return repo.get_run(engine(), run_id)
        except repo.RunNotFound:
            return None
    return _run(db_url(), run_id)


@st.cache_data(ttl=5, show_spinner=False)
def _metric_keys(url: str, run_id: str, finished_at: Any) -> list[str]:
    return repo.metric_keys(engine_for(url), run_id)


def metric_keys(r: RunRecord) -> list[str]:
    if r.finished:
        return _metric_keys(db_url(), r.id, r.finished_at)
    return repo.metric_keys(engine(), r.id)


@st.cache_data(ttl=600, show_spinner=False, max_entries=512)
def _final_series(url: str, run_id: str, key: str, finished_at: Any, max_points: int) -> Series:
    return repo.series(engine_for(url), run_id, key, max_points=max_points)


def final_series(r: RunRecord, key: str, max_points: int = 2000) -> Series:
    """A finished run's series never changes: cached for long, keyed by when it finished."""
    return _final_series(db_url(), r.id, key, r.finished_at, max_points)


@st.cache_data(ttl=10, show_spinner=False, max_entries=64)
def _compare(url: str, run_ids: tuple[str, ...], keys: tuple[str, ...], max_points: int) -> repo.Comparison:
    return repo.compare(engine_for(url), list(run_ids), list(keys), max_points=max_points)


def compare(run_ids: Sequence[str], keys: Sequence[str], max_points: int = 1000) -> repo.Comparison:
    return _compare(db_url(), tuple(run_ids), tuple(keys), max_points)


@st.cache_data(ttl=30, show_spinner=False, max_entries=64)
def _union_keys(url: str, run_ids: tuple[str, ...]) -> list[str]:
    keys: set[str] = set()
    for run_id in run_ids:
        keys.update(repo.metric_keys(engine_for(url), run_id))
    return sorted(keys)


def union_keys(run_ids: Sequence[str]) -> list[str]:
    return _union_keys(db_url(), tuple(run_ids))


def events(run_id: str, after_id: int = 0, limit: int = 2000) -> list[EventRecord]:
    return repo.list_events(engine(), run_id, after_id=after_id, limit=limit)


@shared(ttl=30)
def test_event(engine: Engine, run_id: str) -> EventRecord | None:
    """The run's test-split event (per-class scores, confusion), stored once at its end; None before or without."""
    found = repo.list_events(engine, run_id, kind=TEST_EVENT, limit=10)
    return found[-1] if found else None


@shared(ttl=3)
def artifacts(engine: Engine, run_id: str) -> list[repo.ArtifactRecord]:
    return repo.list_artifacts(engine, run_id)


@shared(ttl=2)
def workers(engine: Engine) -> list[WorkerRecord]:
    return repo.list_workers(engine)


@shared(ttl=5)
def datasets(engine: Engine, project: str | None = None) -> list[DatasetRecord]:
    """The uploaded datasets of one project (or of all), by name."""
    return repo.list_datasets(engine, project=project)


def epoch_anchors(run_id: str) -> list[tuple[int, int, float]]:
    """Step → epoch and wall-time anchors of a run (db.series.epoch_anchors): live, never cached."""
    return repo.epoch_anchors(engine(), run_id)


def metrics_csv(run_id: str) -> bytes:
    """Every stored point of a run as CSV (key, step, epoch, value, wall_time): what pandas reads."""
    import csv
    import io
    import math

    buf = io.StringIO()
    out = csv.writer(buf)
    out.writerow(["key", "step", "epoch", "value", "wall_time"])
    for key, step, epoch, value, wall in repo.iter_points(engine(), run_id):
        out.writerow([key, step, "" if epoch is None else epoch, "nan" if math.isnan(value) else repr(value), wall])
    return buf.getvalue().encode()


def metrics_jsonl(run_id: str) -> bytes:
    """Every stored point of a run as JSON Lines, one object per point (`key`, `step`, `epoch`, `value`, `wall_time`;
    NaN and ±inf as the strings "nan", "inf", "-inf"): `pandas.read_json(path, lines=True)` reads it."""
    import json
    import math

    lines = []
    for key, step, epoch, value, wall in repo.iter_points(engine(), run_id):
        v = value if math.isfinite(value) else ("nan" if math.isnan(value) else ("inf" if value > 0 else "-inf"))
        lines.append(json.dumps({"key": key, "step": step, "epoch": epoch, "value": v, "wall_time": wall}))
    return ("\n".join(lines) + ("\n" if lines else "")).encode()
