"""The tracking endpoint's HTTP side (app/tracking/__init__.py says what it answers): its routes for st.App, who
the request is, the body read, the handler run in the thread pool (the database work never blocks the dashboard's
event loop), and every refusal in MLflow's error shape.

Who: local mode, the person at this machine (the front door, app/web/front_door.py, has already refused any other
machine, a proxied request and another site's page); team mode, the person of the personal API token in the
`Authorization: Bearer` header (MLFLOW_TRACKING_TOKEN), still a member of the dashboard, with their projects'
roles looked up at this request (UNAUTHENTICATED otherwise: a missing, unknown or revoked token). A token may also
come as the password of HTTP basic auth (MLFLOW_TRACKING_PASSWORD), as some tools only offer that."""

from __future__ import annotations

import base64
import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from app import auth
from app.tracking import PATH
from app.tracking.protocol import MlflowError

log = logging.getLogger("torchdeck.tracking")
API = "/api/2.0/mlflow/"
ARTIFACTS = "/api/2.0/mlflow-artifacts/artifacts"
MAX_BODY = 32 << 20  # a log-batch at its bounds is ~10 MB of JSON


@dataclass(frozen=True)
class Ctx:
    user: auth.User
    engine: Any


def endpoints() -> dict[tuple[str, str], Callable[[Ctx, Mapping[str, Any]], dict[str, Any]]]:
    """(method, name under /api/2.0/mlflow/) → handler: the endpoints answered."""
    from app.tracking import experiments, ingest, runs

    return {
        ("POST", "experiments/create"): experiments.create,
        ("GET", "experiments/get"): experiments.get,
        ("GET", "experiments/get-by-name"): experiments.get_by_name,
        ("POST", "experiments/search"): experiments.search,
        ("GET", "experiments/search"): experiments.search,
        ("POST", "runs/create"): runs.create,
        ("GET", "runs/get"): runs.get,
        ("POST", "runs/update"): runs.update,
        ("POST", "runs/delete"): runs.delete,
        ("POST", "runs/search"): runs.search,
        ("POST", "runs/log-metric"): ingest.log_metric,
        ("POST", "runs/log-parameter"): ingest.log_param,
        ("POST", "runs/set-tag"): ingest.set_tag,
        ("POST", "runs/delete-tag"): ingest.delete_tag,
        ("POST", "runs/log-batch"): ingest.log_batch,
        ("GET", "metrics/get-history"): runs.history,
        ("POST", "logged-models/search"): runs.logged_models,
    }


def routes() -> list:
    """For st.App(routes=...): everything under PATH."""
    from starlette.routing import Route

    return [
        Route(PATH, lambda request: _links(), methods=["GET"]),
        Route(PATH + "/{rest:path}", serve, methods=["GET", "POST", "PUT", "DELETE", "PATCH"]),
    ]


# The client prints a link to each run it ends, `<tracking URI>/#/experiments/<id>/runs/<run id>`, for MLflow's own
# UI; the part after # never reaches a server, so this page reads it and opens torchdeck's page of that run (or the
# Runs page of that experiment's project).
LINKS_PAGE = """<!doctype html><meta charset="utf-8"><title>torchdeck</title>
<p>Opening torchdeck&hellip; (<a href="../../runs">the Runs page</a>)</p>
<script>
const base = location.pathname.replace(/\\/_torchdeck\\/mlflow\\/?$/, "");
const m = location.hash.match(/^#\\/experiments\\/([\\w-]+)(?:\\/runs\\/([\\w-]+))?/);
const experiment = m && m[1] !== "0" ? m[1] : "default";
location.replace(m && m[2] ? `${base}/run?id=${m[2]}` : `${base}/runs?project=${experiment}`);
</script>"""


def _links():
    from starlette.responses import HTMLResponse

    return HTMLResponse(LINKS_PAGE, headers={"Cache-Control": "no-store"})


def error(e: MlflowError):
    from starlette.responses import JSONResponse

    return JSONResponse(e.body(), status_code=e.status, headers={"Cache-Control": "no-store"})


def not_found(method: str, path: str) -> MlflowError:
    return MlflowError(
        "ENDPOINT_NOT_FOUND",
        f"{method} {path}: torchdeck answers MLflow's tracking API 2.0 for experiments, runs, params, tags, metrics "
        "and artifacts (see its README, 'Track a script of your own'); not this endpoint",
    )


async def serve(request):
    from starlette.concurrency import run_in_threadpool
    from starlette.responses import JSONResponse

    path = "/" + request.path_params["rest"]
    if path == "/" and request.method == "GET":
        return _links()
    try:
        ctx = await run_in_threadpool(who, request)
        if path == ARTIFACTS or path.startswith(ARTIFACTS + "/"):
            return await _artifacts(ctx, request, path[len(ARTIFACTS) :].lstrip("/"))
        handler = endpoints().get((request.method, path[len(API) :])) if path.startswith(API) else None
        if handler is None:
            raise not_found(request.method, path)
        body = await _body(request)
        return JSONResponse(await run_in_threadpool(handler, ctx, body), headers={"Cache-Control": "no-store"})
    except MlflowError as e:
        return error(e)
    except Exception:  # noqa: BLE001 - a client gets MLflow's shape; the dashboard's log gets the traceback
        log.exception("tracking endpoint %s %s failed", request.method, path)
        return error(MlflowError("INTERNAL_ERROR", f"torchdeck could not answer {request.method} {path}: see its log"))


async def _artifacts(ctx: Ctx, request, path: str):
    from starlette.concurrency import run_in_threadpool
    from starlette.responses import JSONResponse

    from app.tracking import artifacts

    if request.method == "GET" and not path:
        listed = await run_in_threadpool(artifacts.listing, ctx, request.query_params.get("path", ""))
        return JSONResponse(listed, headers={"Cache-Control": "no-store"})
    if request.method == "GET":
        return await run_in_threadpool(artifacts.download, ctx, path)
    if request.method == "PUT":
        return JSONResponse(await artifacts.upload(ctx, path, request))
    raise not_found(request.method, ARTIFACTS + "/" + path)


async def _body(request) -> dict[str, Any]:
    """GET: the query's parameters (a repeated one as a list); otherwise the JSON body."""
    import orjson

    if request.method == "GET":
        params: dict[str, Any] = {}
        for key, value in request.query_params.multi_items():
            params[key] = [*params[key], value] if isinstance(params.get(key), list) else value
        return params
    raw = b""
    async for piece in request.stream():
        raw += piece
        if len(raw) > MAX_BODY:
            raise MlflowError("INVALID_PARAMETER_VALUE", f"a request body over {MAX_BODY >> 20} MB")
    if not raw.strip():
        return {}
    try:
        body = orjson.loads(raw)
    except orjson.JSONDecodeError as e:
        raise MlflowError("MALFORMED_REQUEST", f"the body is not JSON: {e}") from None
    if not isinstance(body, dict):
        raise MlflowError("MALFORMED_REQUEST", "the body is a JSON object")
    return body


def who(request) -> Ctx:
    """The acting person with their roles, or UNAUTHENTICATED (team mode)."""
    from app.services.broker import get_engine

    engine = get_engine()
    if not auth.team_mode():
        return Ctx(auth.local_user(), engine)
    token = bearer(request.headers.get("authorization", ""))
    if not token:
        raise MlflowError(
            "UNAUTHENTICATED",
            "torchdeck in team mode needs a personal API token: make one on the dashboard's API tokens page and set "
            "MLFLOW_TRACKING_TOKEN to it",
        )
    from app.services import tokens

    user = tokens.authenticate(token, engine=engine)
    if user is None:
        raise MlflowError(
            "UNAUTHENTICATED",
            "this API token is not known to torchdeck, was revoked, or its person is no longer a member: make a new "
            "one on the dashboard's API tokens page",
        )
    return Ctx(user, engine)  # with their projects' roles, looked up at this request


def bearer(header: str) -> str | None:
    scheme, _, value = header.strip().partition(" ")
    if scheme.lower() == "bearer":
        return value.strip() or None
    if scheme.lower() == "basic":
        try:
            return base64.b64decode(value.strip()).decode().partition(":")[2] or None
        except (ValueError, UnicodeDecodeError):
            return None
    return None
