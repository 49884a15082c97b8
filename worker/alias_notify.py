"""Alias-move notifications: when a registered model's alias moves (app/services/registry.py), the dashboard sends
this task by name to the jobs queue, and a jobs worker posts to the run-end webhook (TORCHDECK_WEBHOOK_URL) a
message built and sent as worker/notify.py builds and sends a run's end: a one-line Slack `text` whose `&`, `<` and
`>` are escaped (a model's or a person's name can neither ping a channel nor hide a link), credentials redacted,
within Slack's 3,000 characters, retried, and given up with one warning; plus the move itself for a program."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any
from urllib.parse import quote

from core.names import ALIAS_MOVED_TASK
from core.redact import redact
from worker.celery_app import app
from worker.notify import NAME_LIMIT, TEXT_LIMIT, _bounded, _bounded_markup, send_with_retry, slack_escape
from worker.settings import WorkerSettings


def models_url(public_url: str | None, model: str) -> str | None:
    """The model on the dashboard's Models page (TORCHDECK_PUBLIC_URL), or None when its address is not known."""
    if not public_url:
        return None
    return redact(f"{public_url.rstrip('/')}/models?name={quote(model, safe='')}")


def alias_payload(move: Mapping[str, Any], public_url: str | None = None) -> dict[str, Any]:
    """{"text": one line, "alias_move": {model, alias, from_version, to_version, moved_by, moved_at, url}}."""
    model, alias = _bounded(redact(str(move["model"])), NAME_LIMIT), _bounded(redact(str(move["alias"])), NAME_LIMIT)
    who = _bounded(redact(str(move.get("moved_by_name") or move.get("moved_by") or "someone")), NAME_LIMIT)
    before = move.get("from_version")
    url = models_url(public_url, str(move["model"]))
    text = f'torchdeck model "{model}": {alias} → version {move["to_version"]}'
    text += f" (was {before})" if before is not None else " (new alias)"
    text += f" by {who}" + (f" · {url}" if url else "")
    return {
        "text": _bounded_markup(slack_escape(text), TEXT_LIMIT),
        "alias_move": {
            "model": model,
            "alias": alias,
            "from_version": before,
            "to_version": move["to_version"],
            "moved_by": redact(str(move.get("moved_by") or "")),
            "moved_at": move.get("moved_at"),
            "url": url,
        },
    }


@app.task(name=ALIAS_MOVED_TASK, ignore_result=True)
def alias_moved(move: dict[str, Any]) -> bool:
    """Post the move to the webhook; True once delivered, False when none is set or it was not delivered."""
    s = WorkerSettings()
    if not s.webhook_url:
        return False
    return send_with_retry(s.webhook_url, alias_payload(move, s.public_url))
