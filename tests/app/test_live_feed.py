"""The live Run page's chart route (app/live_feed.py), over real HTTP requests against a real SQLite
database: a grant serves its run's charts, a frame that has them all waits for new points and gets
only the charts that grew, an unknown or expired grant is refused, and a finished run says so."""

from __future__ import annotations

import threading

import orjson
import pytest
from starlette.applications import Starlette
from starlette.testclient import TestClient

from app import live_feed
from db import repo
from db.types import MetricPoint
from tests.app.seeding import seed_run


@pytest.fixture
def client():
    with TestClient(Starlette(routes=live_feed.routes())) as c:
        yield c


def ask(client, token: str, have: list[str] | None = None):
    return client.get(live_feed.PATH + token, params={"have": ",".join(have or [])})


def test_a_grant_serves_its_running_runs_charts_with_every_figure(client, engine):
    r = seed_run(engine, "live", status="running", steps=20, epochs=1)
    resp = ask(client, live_feed.grant(r.id, "step", 0.0))
    assert resp.status_code == 200 and resp.headers["cache-control"] == "no-store"
    body = resp.json()
    assert body["finished"] is False
    charts = {c["title"]: c for c in body["charts"]}
    loss = orjson.loads(charts["Loss"]["spec"])
    train = next(t for t in loss["data"] if t["name"] == "train/loss")
    assert train["x"][-1] == 20 and len(train["x"]) == 20


def test_a_frame_with_every_figure_gets_only_what_grew_once_it_grows(client, engine):
    r = seed_run(engine, "live", status="running", steps=20, epochs=1)
    token = live_feed.grant(r.id, "step", 0.0)
    first = ask(client, token).json()["charts"]
    have = [c["stamp"] for c in first]
    unchanged = ask(client, token, have).json()["charts"]  # nothing written: a bounded wait, then stamps only
    assert all(c["spec"] is None for c in unchanged) and [c["stamp"] for c in unchanged] == have
    writer = threading.Timer(0.2, lambda: repo.append_metrics(engine, r.id, [MetricPoint("train/loss", 21, 1.5, 1)]))
    writer.start()
    try:
        grown = None
        for _ in range(20):  # the answer comes with the new point, or (on a slow machine) after the wait: ask again
            charts = ask(client, token, have).json()["charts"]
            grown = next((c for c in charts if c["spec"] is not None), None)
            if grown is not None:
                break
    finally:
        writer.join()
    assert grown is not None and grown["title"] == "Loss"
    assert [c["title"] for c in charts if c["spec"] is not None] == ["Loss"]  # the others are stamps only
    train = next(t for t in orjson.loads(grown["spec"])["data"] if t["name"] == "train/loss")
    assert train["x"][-1] == 21 and train["y"][-1] == 1.5


def test_an_unknown_or_expired_grant_is_refused(client, engine, monkeypatch):
    r = seed_run(engine, "live", status="running", steps=5)
    assert ask(client, "not-a-grant").status_code == 404
    token = live_feed.grant(r.id, "step", 0.0)
    assert live_feed.valid(token)
    monkeypatch.setattr(live_feed, "GRANT_IDLE_S", -1.0)  # every grant is now past its idle time
    assert not live_feed.valid(token)
    assert ask(client, token).status_code == 404
    monkeypatch.setattr(live_feed, "GRANT_IDLE_S", 600.0)
    assert ask(client, token).status_code == 404  # dropped for good, not revived


def test_grants_are_bounded_and_unguessable(engine, monkeypatch):
    r = seed_run(engine, "live", status="running", steps=5)
    monkeypatch.setattr(live_feed, "MAX_GRANTS", 3)
    monkeypatch.setattr(live_feed, "_grants", {})
    tokens = [live_feed.grant(r.id, "step", 0.0) for _ in range(5)]
    assert len(set(tokens)) == 5 and all(len(t) >= 32 for t in tokens)
    assert len(live_feed._grants) == 3 and not live_feed.valid(tokens[0]) and live_feed.valid(tokens[-1])


def test_a_finished_or_deleted_run_says_so(client, engine):
    r = seed_run(engine, "done", status="running", steps=5)
    token = live_feed.grant(r.id, "step", 0.0)
    repo.finish_run(engine, r.id, "completed")
    assert ask(client, token).json() == {"finished": True, "charts": []}
    gone = live_feed.grant("no-such-run", "step", 0.0)
    assert ask(client, gone).json()["finished"] is True


def test_the_dashboard_entry_mounts_the_route_beside_the_pages():
    from app import launcher

    command = launcher.ui_command(launcher.Path("/tmp"), 8599)
    assert command[command.index("run") + 1].endswith("app/server.py")
    source = (launcher.ROOT / "app" / "server.py").read_text()
    assert "st.App(" in source and f'"{live_feed.PATH}{{token}}"' in source and "live_feed.live(request)" in source
    assert 'os.environ["TORCHDECK_LIVE_FEED"] = "1"' in source
