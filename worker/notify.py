"""Run-end notifications: a JSON POST to TORCHDECK_WEBHOOK_URL when a run ends (TORCHDECK_WEBHOOK_ON says
which final statuses), its `text` a one-line summary that Slack's incoming webhooks (and the chat tools that
copy them) show as the message, its `run` the same figures for a program.

Sent from a background daemon thread, a few seconds per attempt, retried, then given up with one warning:
a slow, failing or unreachable endpoint never holds up or breaks a worker. Nothing sent holds a credential
(every text goes through core.redact), and the text stays within Slack's 3,000 characters.

The `text` is Slack markup: `<!channel>` pings a whole channel and `<https://…|words>` shows words over a
link. A run's name and error are anyone's words, so `&`, `<` and `>` in the text are escaped as Slack
documents (`&amp;`, `&lt;`, `&gt;`): they show as typed and mean nothing. The `run` object keeps them as
they are (a program reads them as data).
"""

from __future__ import annotations

import base64
import json
import logging
import math
import re
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Mapping, Sequence
from typing import Any
from urllib.parse import quote, unquote, urlsplit, urlunsplit

from sqlalchemy import Engine

from core.redact import redact
from db.repo import get_run
from db.types import RunRecord
from worker.settings import WorkerSettings

log = logging.getLogger("torchdeck.worker.notify")

ATTEMPTS = 3
TIMEOUT_S = 5.0  # per attempt
BACKOFF_S = (1.0, 2.0)  # before the 2nd and the 3rd attempt
TEXT_LIMIT = 3000  # Slack truncates a message's text beyond this
NAME_LIMIT = 200
ERROR_LIMIT = 500
RESPONSE_LIMIT = 64 * 1024  # of an answer we read (and ignore)
_RETRIED_4XX = (408, 425, 429)  # a client error worth another try; any other one is final


def where(url: str | None) -> str:
    """A webhook URL as logged: scheme, host and port only (Slack's and most services' URLs hold their secret in
    the path or the query)."""
    from urllib.parse import urlsplit

    try:
        parts = urlsplit(url or "")
        host = parts.hostname or "?"
        return f"{parts.scheme}://{host}{':' + str(parts.port) if parts.port else ''}/…"
    except ValueError:
        return "(an unreadable URL)"


def build_payload(run: RunRecord, public_url: str | None = None) -> dict[str, Any]:
    """What is POSTed for a finished run: {"text": <one line>, "run": {...}}, every string redacted."""
    best = _clean((run.summary or {}).get("best"))
    error = _first_line(run.error, ERROR_LIMIT)
    url = run_url(public_url, run.id)
    return {
        "text": summary_text(run, best if isinstance(best, Mapping) else None, error, url),
        "run": {
            "id": run.id,
            "name": redact(run.name),
            "owner": redact(run.owner),
            "status": run.status,
            "best": best,
            "error": error,
            "sweep_id": run.sweep_id,
            "url": url,
        },
    }


def run_url(public_url: str | None, run_id: str) -> str | None:
    """The run's page on the dashboard (TORCHDECK_PUBLIC_URL), or None when its address is not known."""
    if not public_url:
        return None
    return redact(f"{public_url.rstrip('/')}/run?id={quote(run_id, safe='')}")


def summary_text(run: RunRecord, best: Mapping[str, Any] | None, error: str | None, url: str | None) -> str:
    """One line: name, status, best metric, duration, link (then the error), at most TEXT_LIMIT characters."""
    name = _first_line(run.name, NAME_LIMIT) or run.id
    parts = [f'torchdeck run "{name}" {run.status.replace("_", " ")}']
    if best and best.get("value") is not None:
        value = best["value"]
        shown = f"{value:.4g}" if isinstance(value, (int, float)) else str(value)
        epoch = f" (epoch {best['epoch']})" if best.get("epoch") is not None else ""
        parts.append(f"best {best.get('metric') or 'metric'} {shown}{epoch}")
    duration = _duration_s(run)
    if duration is not None:
        parts.append(f"took {format_duration(duration)}")
    if url:
        parts.append(url)
    if error:
        parts.append(f"error: {error}")
    return slack_line(parts)


def slack_line(parts: Sequence[str]) -> str:
    """Parts joined by ` · ` as one Slack message: escaped (slack_escape), at most TEXT_LIMIT characters."""
    return _bounded_markup(slack_escape(" · ".join(parts)), TEXT_LIMIT)


def slack_escape(text: str) -> str:
    """Text as Slack shows it literally: its three control characters as the entities Slack documents."""
    return text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


def _bounded_markup(text: str, limit: int) -> str:
    """_bounded, never cutting an entity (`&lt;`) in two."""
    if len(text) <= limit:
        return text
    return re.sub(r"&[a-z]*$", "", text[: limit - 1]) + "…"


def format_duration(seconds: float) -> str:
    s = int(round(max(seconds, 0.0)))
    if s < 60:
        return f"{s}s"
    if s < 3600:
        return f"{s // 60}m {s % 60:02d}s"
    return f"{s // 3600}h {s % 3600 // 60:02d}m"


def _duration_s(run: RunRecord) -> float | None:
    if run.started_at is not None and run.finished_at is not None:
        try:
            return (run.finished_at - run.started_at).total_seconds()
        except TypeError:  # one aware, one naive: fall back on the run's own clock
            pass
    wall = (run.summary or {}).get("wall_time_s")
    return float(wall) if isinstance(wall, (int, float)) and math.isfinite(wall) else None


def _first_line(text: str | None, limit: int) -> str | None:
    if not text or not text.strip():
        return None
    return _bounded(redact(text.strip().splitlines()[0].strip()), limit)


def _bounded(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[: limit - 1] + "…"


def _clean(value: Any) -> Any:
    """A JSON-safe copy: strings redacted, non-finite numbers (which JSON cannot hold) as null."""
    if isinstance(value, str):
        return redact(value)
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, Mapping):
        return {str(k): _clean(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_clean(v) for v in value]
    return value if value is None or isinstance(value, (bool, int, float)) else redact(value)


class _Final(Exception):
    """An answer that another attempt would not change (a 4xx such as 404)."""


def _without_userinfo(url: str) -> tuple[str, dict[str, str]]:
    """https://user:password@host/path (urllib cannot open it) as the plain URL and a Basic authorization."""
    parts = urlsplit(url)
    if parts.username is None:
        return url, {}
    host = parts.netloc.rpartition("@")[2]
    token = base64.b64encode(f"{unquote(parts.username)}:{unquote(parts.password or '')}".encode()).decode()
    return urlunsplit(parts._replace(netloc=host)), {"Authorization": f"Basic {token}"}


def _post(url: str, body: bytes, timeout_s: float) -> None:
    plain, auth = _without_userinfo(url)
    req = urllib.request.Request(
        plain,
        data=body,
        method="POST",
        headers={"Content-Type": "application/json", "User-Agent": "torchdeck-webhook", **auth},
    )
    try:
        with urllib.request.urlopen(req, timeout=timeout_s) as answer:  # noqa: S310 - http(s) only (settings)
            answer.read(RESPONSE_LIMIT)
    except urllib.error.HTTPError as e:
        reason = f"HTTP {e.code} {e.reason}".strip()
        e.close()
        if 400 <= e.code < 500 and e.code not in _RETRIED_4XX:
            raise _Final(reason) from None
        raise OSError(reason) from None


def _reason(e: BaseException) -> str:
    if isinstance(e, urllib.error.URLError):
        return f"cannot connect: {e.reason}"
    if isinstance(e, TimeoutError):
        return "no answer (timed out)"
    return str(e) or type(e).__name__


def send_with_retry(
    url: str,
    payload: Mapping[str, Any],
    *,
    attempts: int = ATTEMPTS,
    timeout_s: float = TIMEOUT_S,
    backoff_s: Sequence[float] = BACKOFF_S,
) -> bool:
    """POST `payload` as JSON; True once an attempt gets a 2xx. Up to `attempts` tries, waiting backoff_s[i]
    between them; then one WARNING naming the (redacted) URL and why. Never raises."""
    try:
        body = json.dumps(_clean(payload), ensure_ascii=False, allow_nan=False).encode()
    except (TypeError, ValueError) as e:
        log.warning("run-end webhook %s not sent: the payload is not JSON (%s)", where(url), e)
        return False
    reason, tried = "no attempt", 0
    for tried in range(1, max(attempts, 1) + 1):
        try:
            _post(url, body, timeout_s)
            return True
        except _Final as e:
            reason = str(e)
            break
        except Exception as e:  # noqa: BLE001 - whatever goes wrong, the worker goes on
            reason = _reason(e)
        if tried < attempts and backoff_s:
            time.sleep(backoff_s[min(tried - 1, len(backoff_s) - 1)])
    log.warning("run-end webhook %s not delivered after %d attempt(s): %s", where(url), tried, redact(reason))
    return False


def should_notify(run: RunRecord, settings: WorkerSettings, worker_id: str | None = None) -> bool:
    """A finished run whose status TORCHDECK_WEBHOOK_ON names, ended by `worker_id` when one is given (a
    worker whose run was taken over leaves the notification to the run's new owner)."""
    if not settings.webhook_url or not run.finished or run.status not in settings.webhook_statuses:
        return False
    return worker_id is None or run.worker_id == worker_id


def notify_run_end(
    engine: Engine, run_id: str, *, worker_id: str | None = None, settings: WorkerSettings | None = None
) -> threading.Thread | None:
    """Notify the end of run `run_id` in a background daemon thread (returned; None when no webhook is set).
    Reads the run there: it notifies only a finished run (see should_notify). Never raises, never blocks."""
    try:
        s = settings or WorkerSettings()
        if not s.webhook_url:
            return None
        t = threading.Thread(target=_notify, args=(engine, run_id, worker_id, s), name=f"webhook-{run_id}", daemon=True)
        t.start()
        return t
    except Exception as e:  # noqa: BLE001 - a notification never breaks a worker
        log.warning("run-end webhook for run %s not sent: %s", run_id, redact(e))
        return None


def _notify(engine: Engine, run_id: str, worker_id: str | None, s: WorkerSettings) -> None:
    try:
        run = get_run(engine, run_id)
        if should_notify(run, s, worker_id):
            send_with_retry(s.webhook_url or "", build_payload(run, s.public_url))
    except Exception as e:  # noqa: BLE001 - the database may be away: the worker goes on
        log.warning("run-end webhook %s for run %s not sent: %s", where(s.webhook_url), run_id, redact(e))
