"""The tracking endpoint's rules, asked as the MLflow client asks them (JSON over HTTP, through Starlette's test
client on the routes app/server.py mounts): in team mode a request needs a personal API token of a member (a missing,
unknown or revoked one is refused as UNAUTHENTICATED), logs as the token's person into the projects they may
contribute to, and sees only what they may read (another project's run is "not found", as a run nobody made); a
person writes only their own runs (a maintainer any of the project's), and never a torchdeck run; experiments are
projects; searches filter and page as MLflow's do; what is not understood is refused, not ignored."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from starlette.applications import Starlette
from starlette.testclient import TestClient
from streamlit_session import ISSUER

from app.tracking import PATH
from app.tracking import route as tracking
from db import external, projects, repo, tokens
from db.types import MetricPoint

API = f"{PATH}/api/2.0/mlflow"
ANA, BOB, ROOT = f"{ISSUER}#ana", f"{ISSUER}#bob", f"{ISSUER}#root"


@pytest.fixture
def team(home, monkeypatch) -> None:
    monkeypatch.setenv("TORCHDECK_MODE", "team")
    monkeypatch.setenv("TORCHDECK_ADMINS", "root@example.com")


@pytest.fixture
def client(home) -> Iterator[TestClient]:
    with TestClient(Starlette(routes=tracking.routes()), client=("127.0.0.1", 50000)) as c:
        yield c


def token(engine, person: str) -> str:
    name = person.rsplit("#", 1)[1]
    return tokens.create_token(
        engine, person=person, person_name=name.title(), email=f"{name}@example.com", groups=[], label="laptop"
    )[1]


def call(client: TestClient, secret: str | None, method: str, endpoint: str, body: dict | None = None):
    headers = {"Authorization": f"Bearer {secret}"} if secret else {}
    if method == "GET":
        return client.get(f"{API}/{endpoint}", params=body or {}, headers=headers)
    return client.request(method, f"{API}/{endpoint}", json=body or {}, headers=headers)


def test_team_mode_refuses_a_missing_an_unknown_and_a_revoked_token(team, client, engine) -> None:
    for secret in (None, "tdk_nope_nope"):
        answer = call(client, secret, "POST", "runs/create", {"experiment_id": "0"})
        assert answer.status_code == 401 and answer.json()["error_code"] == "UNAUTHENTICATED"
    secret = token(engine, ANA)
    assert call(client, secret, "POST", "runs/create", {"experiment_id": "0"}).status_code == 200
    (made,) = tokens.list_tokens(engine, ANA)
    tokens.revoke(engine, made.id, ANA)
    answer = call(client, secret, "POST", "runs/create", {"experiment_id": "0"})
    assert answer.status_code == 401 and "revoked" in answer.json()["message"]


def test_a_tokens_run_is_its_persons_and_only_they_or_a_maintainer_write_it(team, client, engine) -> None:
    ana, bob, root = token(engine, ANA), token(engine, BOB), token(engine, ROOT)
    run = call(client, ana, "POST", "runs/create", {"experiment_id": "0", "run_name": "ana's"}).json()["run"]
    assert run["info"]["user_id"] == ANA and repo.get_run(engine, run["info"]["run_id"]).owner == ANA
    body = {"run_id": run["info"]["run_id"], "key": "lr", "value": "0.1"}
    refused = call(client, bob, "POST", "runs/log-parameter", body)
    assert refused.status_code == 403 and refused.json()["error_code"] == "PERMISSION_DENIED"
    assert call(client, root, "POST", "runs/log-parameter", body).status_code == 200  # an admin may
    ours = repo.create_run(engine, {"data": {"name": "digits"}}, owner=ANA)
    answer = call(client, ana, "POST", "runs/log-metric", {"run_id": ours.id, "key": "x", "value": 1, "step": 0})
    assert answer.status_code == 400 and answer.json()["error_code"] == "INVALID_STATE"
    assert "launched by torchdeck" in answer.json()["message"]


def test_another_projects_runs_and_experiments_are_not_found_as_if_nobody_made_them(team, client, engine) -> None:
    projects.create_project(engine, "vision", by=BOB)  # Bob maintains it; Ana is not in it
    ana, bob = token(engine, ANA), token(engine, BOB)
    made = call(client, bob, "POST", "runs/create", {"experiment_id": "vision"}).json()["run"]["info"]["run_id"]
    hidden = call(client, ana, "GET", "runs/get", {"run_id": made})
    nobody = call(client, ana, "GET", "runs/get", {"run_id": "000000000000"})
    assert hidden.status_code == nobody.status_code == 404
    assert hidden.json()["message"].replace(made, "ID") == nobody.json()["message"].replace("000000000000", "ID")
    refused = call(client, ana, "POST", "runs/create", {"experiment_id": "vision"})
    assert refused.status_code == 404 and refused.json()["error_code"] == "RESOURCE_DOES_NOT_EXIST"
    names = [e["name"] for e in call(client, ana, "POST", "experiments/search", {}).json()["experiments"]]
    assert names == ["Default"]
    found = call(client, ana, "POST", "runs/search", {"experiment_ids": ["0", "vision"]}).json()
    assert found.get("runs", []) == []


def test_an_experiment_is_a_project_its_maker_maintains(team, client, engine) -> None:
    ana = token(engine, ANA)
    made = call(client, ana, "POST", "experiments/create", {"name": "Object Detection!"}).json()
    assert made == {"experiment_id": "object-detection"}
    assert projects.members(engine, "object-detection")[0].person == ANA
    again = call(client, ana, "POST", "experiments/create", {"name": "object detection"})
    assert again.json()["error_code"] == "RESOURCE_ALREADY_EXISTS"
    by_name = call(client, ana, "GET", "experiments/get-by-name", {"experiment_name": "Object Detection!"}).json()
    assert by_name["experiment"]["experiment_id"] == "object-detection"
    default = call(client, ana, "GET", "experiments/get", {"experiment_id": "0"}).json()["experiment"]
    assert default["name"] == "Default"


def test_search_filters_orders_and_pages_as_mlflow_does(home, client, engine) -> None:
    for i in range(5):
        run = external.create_run(engine, owner="me", name=f"run-{i}")
        external.log(
            engine,
            run.id,
            params={"lr": str(0.1 * i)},
            tags={"even": str(i % 2 == 0)},
            points=[MetricPoint("acc", 0, i / 10)],
        )

    def names(**body):
        answer = call(client, None, "POST", "runs/search", {"experiment_ids": ["0"], **body}).json()
        return [r["info"]["run_name"] for r in answer.get("runs", [])], answer.get("next_page_token")

    assert names(filter="metrics.acc >= 0.2 and tags.even = 'True'")[0] == ["run-4", "run-2"]
    assert names(filter="attributes.run_name LIKE 'run-%' AND params.lr = '0.1'")[0] == ["run-1"]
    assert names(filter="attributes.run_name IN ('run-0', 'run-3')", order_by=["metrics.acc ASC"])[0] == [
        "run-0",
        "run-3",
    ]
    first, token_ = names(max_results=2, order_by=["metrics.acc DESC"])
    second, _ = names(max_results=2, order_by=["metrics.acc DESC"], page_token=token_)
    assert (first, second) == (["run-4", "run-3"], ["run-2", "run-1"])
    for bad in ("metrics.acc > 0.1 OR metrics.acc < 0", "datasets.name = 'x'", "metrics.acc LIKE 'x'"):
        answer = call(client, None, "POST", "runs/search", {"experiment_ids": ["0"], "filter": bad})
        assert answer.status_code == 400 and answer.json()["error_code"] == "INVALID_PARAMETER_VALUE", bad


def test_a_request_that_is_not_json_or_not_answered_gets_mlflows_error_shape(home, client) -> None:
    answer = client.post(f"{API}/runs/create", content=b"{not json")
    assert answer.status_code == 400 and answer.json()["error_code"] == "MALFORMED_REQUEST"
    for method, path in (("POST", f"{API}/model-versions/create"), ("GET", f"{PATH}/api/2.0/preview/x")):
        answer = client.request(method, path)
        assert answer.status_code == 404 and answer.json()["error_code"] == "ENDPOINT_NOT_FOUND"


def test_a_persons_scripts_are_refused_a_run_over_their_limit_in_mlflows_shape(home, client, monkeypatch) -> None:
    monkeypatch.setenv("TORCHDECK_MAX_SCRIPT_RUNS_PER_OWNER", "1")
    assert call(client, None, "POST", "runs/create", {"experiment_id": "0"}).status_code == 200
    refused = call(client, None, "POST", "runs/create", {"experiment_id": "0"})
    assert refused.status_code == 400 and refused.json()["error_code"] == "INVALID_STATE"
    assert "the most one person may (1)" in refused.json()["message"]
