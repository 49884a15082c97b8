"""The live charts of a running run: figures sent once they changed, stamps after that, everything
again when the browser's frame asks; one set of series per dashboard process for all viewers."""

from __future__ import annotations

import json
import uuid

from seeding import plotly_figures, seed_run

from app.live import series
from app.live.chart import RESENDS
from db import repo
from db.types import MetricPoint


def _sent(at) -> dict[str, bool]:
    """Chart title -> whether this run's message carried its figure (else its stamp only)."""
    el = next(e for e in at.get("component_instance") if e.proto.component_name.endswith("torchdeck_live_chart"))
    return {c["title"]: c["spec"] is not None for c in json.loads(el.proto.json_args)["charts"]}


def test_an_unchanged_figure_is_sent_a_few_times_then_by_its_stamp_and_again_when_asked(page, engine):
    r = seed_run(engine, "live", status="running", steps=30, epochs=1)
    at = page("run.py", id=r.id)
    assert _sent(at)["Loss"]
    for _ in range(RESENDS):
        at.run()
    assert not any(_sent(at).values())  # nothing changed: titles and stamps only
    repo.append_metrics(engine, r.id, [MetricPoint("train/loss", 31, 0.1, 2)])
    at.run()
    sent = _sent(at)
    assert sent["Loss"] and not sent["Epoch time (s)"]  # only the chart whose series grew
    at.session_state["run.charts"] = uuid.uuid4().hex  # a re-created frame asks for every figure
    at.run()
    assert all(_sent(at).values())
    assert plotly_figures(at)["Loss"]["data"]


def test_viewers_of_a_run_share_its_series(page, engine, monkeypatch):
    r = seed_run(engine, "shared", status="running", steps=30, epochs=1)
    reads = []
    real = repo.series_many

    def spy(engine, run_id, since, max_points=2000):
        reads.append(dict(since))
        return real(engine, run_id, since, max_points=max_points)

    monkeypatch.setattr(repo, "series_many", spy)
    page("run.py", id=r.id)
    first = len(reads)
    page("run.py", id=r.id)  # a second viewer, another session
    assert first >= 1 and len(reads) == first  # nothing grew: no series read again
    repo.append_metrics(engine, r.id, [MetricPoint("train/loss", 31, 0.1, 2)])
    page("run.py", id=r.id)
    assert reads[-1] == {"train/loss": 30}


def test_a_wait_for_new_points_ends_when_a_series_grows_or_when_told(engine):
    r = seed_run(engine, "wait", status="running", steps=5, epochs=0)
    live = series.SharedRun(r.id)
    counts = live.refresh(engine)
    live.wait_for_growth(engine, {**counts, "train/loss": 0}, timeout_s=600, interrupted=lambda: False)  # grown
    live.wait_for_growth(engine, counts, timeout_s=600, interrupted=lambda: True)  # a click
    live.wait_for_growth(engine, counts, timeout_s=0.2, interrupted=lambda: False)  # nothing: the timeout
    assert not series.fragment_rerun() and not series.preempted()  # outside a script run
