"""Credentials never shown: every URL's password (and token-like query parameters) masked in a text.

Torch-free and importing nothing of ours: the dashboard, the CLI, the database layer (errors and events
it stores) and the workers' log handlers all pass what they show or keep through `redact`.
"""

from __future__ import annotations

import logging
import re

MASK = "***"
# scheme://user:password@host: the user info ends at the last '@' before the path (the first '@' followed by a
# non-empty host free of '@'), so passwords may hold '@' and '/', and users '@' (me@corp.com:pw@host).
_URL = re.compile(r"\b(?P<scheme>[a-zA-Z][a-zA-Z0-9+.\-]*://)(?P<rest>\S+)")
_HOST = re.compile(r"[^/?#]*")  # what follows the user info, up to the path
_TOKEN_SCHEMES = ("http://", "https://")  # https://<token>@host: a user name alone is a credential there
_QUERY = re.compile(
    r"(?P<head>[?&](?:password|passwd|pwd|secret|token|access_key|secret_key|client_secret)=)"
    r"(?P<secret>[^&\s#]+)",
    re.IGNORECASE,
)


def redact(text: object) -> str:
    """`text` with the password of every URL in it, and secret query parameters, replaced by ***."""
    s = str(text)
    if "://" not in s and "=" not in s:
        return s
    s = _URL.sub(_masked_url, s)
    return _QUERY.sub(lambda m: f"{m['head']}{MASK}", s)


def _userinfo_end(rest: str) -> int | None:
    at = rest.find("@")
    while at >= 0:
        host = _HOST.match(rest, at + 1)[0]  # type: ignore[index] - the pattern matches ''
        if host and "@" not in host:
            return at
        at = rest.find("@", at + 1)
    return None


def _masked_url(m: re.Match[str]) -> str:
    scheme, rest = m["scheme"], m["rest"]
    at = _userinfo_end(rest)
    if at is None:
        return m[0]
    user, colon, password = rest[:at].partition(":")
    if "/" in user:  # an '@' in the path, not user info
        return m[0]
    if colon:
        return f"{scheme}{user}:{MASK}@{rest[at + 1 :]}" if password else m[0]
    if scheme.lower() in _TOKEN_SCHEMES and user:
        return f"{scheme}{MASK}@{rest[at + 1 :]}"
    return m[0]


def redact_data(value: object) -> object:
    """Every string inside a JSON-like value redacted (event data: tracebacks, messages, URLs)."""
    if isinstance(value, str):
        return redact(value)
    if isinstance(value, dict):
        return {k: redact_data(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [redact_data(v) for v in value]
    return value


class RedactingFilter(logging.Filter):
    """A logging filter that masks credentials in every record's final message (arguments included)."""

    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        masked = redact(message)
        if masked != message:
            record.msg, record.args = masked, None
        if record.exc_info and not record.exc_text:  # the traceback, formatted once here as handlers would
            record.exc_text = logging.Formatter().formatException(record.exc_info)
        if record.exc_text:
            record.exc_text = redact(record.exc_text)
        return True


def redact_logs() -> None:
    """Mask credentials in everything this process logs, whichever handler writes it (Celery, Streamlit and
    logging.basicConfig install their own): every handler filters through RedactingFilter first."""
    if getattr(logging.Handler.handle, "_torchdeck_redacts", False):
        return
    original = logging.Handler.handle
    flt = RedactingFilter()

    def handle(self: logging.Handler, record: logging.LogRecord) -> bool:
        flt.filter(record)
        return original(self, record)

    handle._torchdeck_redacts = True  # type: ignore[attr-defined]
    logging.Handler.handle = handle  # type: ignore[method-assign]
