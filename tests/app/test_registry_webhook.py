"""An alias move announced on the run-end webhook: the dashboard sends the move by task name to the jobs queue (a
real Redis) only when a webhook is set, the jobs worker's task posts it (to a real local HTTP server) with the
run-end message's escaping, and a broker that cannot be reached never fails the move."""

from __future__ import annotations

import base64
import json

from test_registry import exported_run

from app import auth
from app.services import registry
from core.names import ALIAS_MOVED_TASK, JOBS_QUEUE, WEBHOOK_URL_ENV
from tests.worker.test_notify import Hook


def _queued(broker) -> list[tuple[str, dict]]:
    """(task name, kwargs) of each message waiting in the jobs queue (Celery's Redis transport: a list of JSON)."""
    out = []
    for raw in broker.lrange(JOBS_QUEUE, 0, -1):
        message = json.loads(raw)
        args, kwargs, _ = json.loads(base64.b64decode(message["body"]))
        out.append((message["headers"]["task"], kwargs))
    return out


def test_a_move_is_posted_once_with_names_escaped(engine, home, broker, monkeypatch):
    from worker.alias_notify import alias_moved

    hook = Hook()
    try:
        eve = auth.User(id="eve", name="<!channel> Eve & co", is_admin=True)
        registry.register(exported_run(engine, home, b"onnx").id, "digits", eve, engine)
        registry.set_alias("digits", "production", 1, eve, engine)
        assert _queued(broker) == []  # no webhook set: nothing sent
        monkeypatch.setenv(WEBHOOK_URL_ENV, hook.url)
        monkeypatch.setenv("TORCHDECK_PUBLIC_URL", "https://td.example.com")
        registry.set_alias("digits", "production", 1, eve, engine)
        [(task, kwargs)] = _queued(broker)
        assert task == ALIAS_MOVED_TASK and kwargs["move"]["to_version"] == 1
        assert alias_moved(kwargs["move"]) is True  # what the jobs worker runs for that message
        [posted] = hook.payloads()
        assert posted["text"] == (
            'torchdeck model "digits": production → version 1 (was 1) by &lt;!channel&gt; Eve &amp; co (eve) · '
            "https://td.example.com/models?name=digits"
        )
        assert posted["alias_move"]["moved_by"] == "eve" and posted["alias_move"]["from_version"] == 1
    finally:
        hook.close()


def test_a_broker_that_cannot_be_reached_never_fails_the_move(engine, home, monkeypatch):
    monkeypatch.setenv(WEBHOOK_URL_ENV, "http://127.0.0.1:9/hook")  # TORCHDECK_BROKER_URL: a closed port (conftest)
    registry.register(exported_run(engine, home, b"onnx").id, "digits", auth.local_user(), engine)
    move = registry.set_alias("digits", "production", 1, auth.local_user(), engine)
    assert move.to_version == 1 and registry.resolve("digits", "production", engine).version == 1
