"""What the broker holds: which runs still have a message, waiting or delivered but not acknowledged.

The database is the truth about runs; the broker only carries their ids. A message can vanish (a Redis
restarted without persistence, a reaper that died between marking a run lost and sending it), and a
run without one would wait forever. The reaper compares the two and sends again only what is missing,
so a long queue is never flooded with duplicates (a duplicate would be harmless: the claim is atomic).

Kombu's Redis transport keeps a queue as a list (one per priority step: `<queue>`, `<queue>\\x06\\x163`,
...) and a delivered, unacknowledged message in the `unacked` hash; both hold the message as JSON with
a base64 body `[args, kwargs, embed]` (Celery's message protocol 2); the `unacked_index` sorted set
holds each delivery's time. The key names come from the transport's own channel, so a global key prefix
is honoured.
"""

from __future__ import annotations

import base64
import json
import logging
import time
from collections.abc import Iterable
from typing import Any

log = logging.getLogger("torchdeck.broker")


def run_ids_in_broker(app: Any, queues: Iterable[str], task: str, delivered_within_s: float = 60.0) -> set[str] | None:
    """Run ids of `task` messages waiting in `queues`, or delivered less than `delivered_within_s` ago and not
    acknowledged yet (a worker is about to claim the run; one delivered earlier to a worker that died is no
    message for anyone until Redis's visibility timeout); None when the broker cannot be read (unreachable,
    or not Redis): then the caller must not conclude anything."""
    try:
        with app.connection_for_read() as conn:
            channel = conn.default_channel
            client = channel.client
            keys = {channel._q_for_pri(q, pri) for q in queues for pri in channel.priority_steps}
            found: set[str] = set()
            for key in sorted(keys):
                for raw in client.lrange(key, 0, -1):
                    found |= _run_ids(json.loads(raw), task)
            recent = time.time() - delivered_within_s
            delivered = {
                _text(tag): stamp for tag, stamp in client.zrange(channel.unacked_index_key, 0, -1, withscores=True)
            }
            for tag, raw in client.hgetall(channel.unacked_key).items():
                if delivered.get(_text(tag), 0.0) >= recent:
                    found |= _run_ids(json.loads(raw)[0], task)
            return found
    except Exception as e:  # noqa: BLE001 - an unreadable broker says nothing about any run
        log.warning("cannot read the broker's queues: %s", e)
        return None


def _text(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else value


def _run_ids(message: dict[str, Any], task: str) -> set[str]:
    headers = message.get("headers") or {}
    if headers.get("task") != task:
        return set()
    body = message.get("body")
    if (message.get("properties") or {}).get("body_encoding") == "base64":
        body = base64.b64decode(body)
    try:
        args = json.loads(body)[0]
    except (ValueError, TypeError, IndexError, KeyError):
        return set()
    return {args[0]} if args and isinstance(args[0], str) else set()
