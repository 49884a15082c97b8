"""The live Run page's chart route (app/live/route.py), over real HTTP requests against a real SQLite
database: a grant serves its run's charts, a frame that has them all waits for new points and gets
only the charts that grew, an unknown grant is refused, and a finished run says so. Who may hold a grant and
for how long: tests/app/test_live_grants.py (on a real dashboard); here the grants' sessions are all taken as
still there, these tests being about what the route answers."""

from __future__ import annotations

import threading

import orjson
import pytest
from starlette.applications import Starlette
from starlette.testclient import TestClient

from app.live import route
from app.live.route import HEADER, PATH, Grants
from db import repo
from db.types import MetricPoint
from tests.app.seeding import seed_run


@pytest.fixture
def grants(monkeypatch) -> Grants:
    monkeypatch.delenv("TORCHDECK_MODE", raising=False)  # local mode: no identity
    return Grants(alive=lambda _session: True)


@pytest.fixture
def client(grants):
    # This machine's address: local mode refuses any other (app.auth.local_refusal).
    with TestClient(Starlette(routes=route.routes(grants)), client=("127.0.0.1", 50000)) as c:
        yield c


def ask(client, token: str, have: list[str] | None = None):
    return client.get(PATH, params={"have": ",".join(have or [])}, headers={HEADER: token})


def grant(grants: Grants, run_id: str) -> str:
    return grants.make("session", None, run_id, "step", 0.0)


def test_a_grant_serves_its_running_runs_charts_with_every_figure(client, grants, engine):
    r = seed_run(engine, "live", status="running", steps=20, epochs=1)
    resp = ask(client, grant(grants, r.id))
    assert resp.status_code == 200 and resp.headers["cache-control"] == "no-store"
    body = resp.json()
    assert body["finished"] is False
    charts = {c["title"]: c for c in body["charts"]}
    loss = orjson.loads(charts["Loss"]["spec"])
    train = next(t for t in loss["data"] if t["name"] == "train/loss")
    assert train["x"][-1] == 20 and len(train["x"]) == 20


def test_a_frame_with_every_figure_gets_only_what_grew_once_it_grows(client, grants, engine):
    r = seed_run(engine, "live", status="running", steps=20, epochs=1)
    token = grant(grants, r.id)
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


def test_an_unknown_grant_is_refused_and_tokens_are_unguessable(client, grants, engine):
    r = seed_run(engine, "live", status="running", steps=5)
    assert ask(client, "not-a-grant").status_code == 404
    assert client.get(PATH).status_code == 404  # none at all
    tokens = {grant(grants, r.id) for _ in range(5)}
    assert len(tokens) == 5 and all(len(t) >= 32 for t in tokens)


def test_a_finished_or_deleted_run_says_so(client, grants, engine):
    r = seed_run(engine, "done", status="running", steps=5)
    token = grant(grants, r.id)
    repo.finish_run(engine, r.id, "completed")
    assert ask(client, token).json() == {"finished": True, "charts": []}
    gone = grant(grants, "no-such-run")
    assert ask(client, gone).json()["finished"] is True
