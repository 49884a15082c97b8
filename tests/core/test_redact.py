"""core.redact: the password of any URL, and secret query parameters, never survive into what torchdeck
shows, stores or logs; text without credentials is left exactly as it was."""

from __future__ import annotations

import logging
import string

from hypothesis import given, settings
from hypothesis import strategies as st

from core.redact import MASK, RedactingFilter, redact, redact_data, redact_logs

SECRET = "s3cr3t-pw"

# A password as people write them in a URL: anything but whitespace and '/', '@' included (unencoded
# passwords hold '@' too), percent-escapes included.
_PASSWORD = st.text(alphabet=string.ascii_letters + string.digits + "-._~!$&'()*+,;=%:@", min_size=1, max_size=30)
_USER = st.text(alphabet=string.ascii_letters + string.digits + "-._~", max_size=12)
_SCHEME = st.sampled_from(["redis", "rediss", "postgresql", "postgresql+psycopg", "amqp", "s3", "https", "sqla+mysql"])
_HOST = st.from_regex(r"[a-z][a-z0-9-]{0,15}(\.[a-z][a-z0-9-]{0,10}){0,3}", fullmatch=True) | st.sampled_from(
    ["127.0.0.1", "10.0.0.7", "[::1]", "localhost"]
)
_PORT = st.none() | st.integers(1, 65535)
_PATH = st.from_regex(r"(/[a-z0-9_.-]{0,12}){0,3}", fullmatch=True)
# Words around a URL in a message: no ':', '@', '/' or '=' (they are what a URL or a query parameter is made of).
_WORDS = st.text(alphabet=string.ascii_letters + string.digits + " ,.;()[]'\"!-_", max_size=40)


def _url(scheme: str, user: str, password: str, host: str, port: int | None, path: str) -> tuple[str, str]:
    """(the URL, the URL as redact must show it)."""
    rest = f"{host}{f':{port}' if port else ''}{path}"
    return f"{scheme}://{user}:{password}@{rest}", f"{scheme}://{user}:{MASK}@{rest}"


@settings(max_examples=300, deadline=None)
@given(_SCHEME, _USER, _PASSWORD, _HOST, _PORT, _PATH, _WORDS, _WORDS)
def test_any_url_with_a_password_is_shown_with_the_password_masked(
    scheme, user, password, host, port, path, before, after
):
    url, shown = _url(scheme, user, password, host, port, path)
    text = f"{before} {url} {after}"
    assert redact(text) == f"{before} {shown} {after}"


@settings(max_examples=100, deadline=None)
@given(st.lists(st.tuples(_SCHEME, _USER, _PASSWORD, _HOST, _PORT, _PATH), min_size=2, max_size=4))
def test_every_url_of_a_message_is_masked(urls):
    pairs = [_url(*u) for u in urls]
    text = "; ".join(f"tried {u}" for u, _ in pairs)
    assert redact(text) == "; ".join(f"tried {s}" for _, s in pairs)


@settings(max_examples=300, deadline=None)
@given(st.text(max_size=200).filter(lambda s: "@" not in s and "=" not in s))
def test_text_without_credentials_is_unchanged(text):
    assert redact(text) == text


_PLAIN_KEY = st.sampled_from(["lr", "epochs", "key", "db", "timeout", "name", "id", "page"])
_HARMLESS = st.lists(
    _WORDS
    | st.builds("{}@{}.org".format, _USER.filter(bool), _HOST)
    | st.builds("{}={}".format, _PLAIN_KEY, _WORDS.map(lambda w: w.replace(" ", ""))),
    max_size=6,
)


@settings(max_examples=300, deadline=None)
@given(_HARMLESS)
def test_emails_and_key_values_are_unchanged(parts):
    text = " ".join(parts)
    assert redact(text) == text


@settings(max_examples=200, deadline=None)
@given(_SCHEME, _USER, _HOST, _PORT, _PATH, _WORDS)
def test_urls_without_a_password_are_unchanged(scheme, user, host, port, path, words):
    rest = f"{host}{f':{port}' if port else ''}{path}"
    named = f"{scheme}://{user}@{rest}" if user and scheme != "https" else f"{scheme}://{rest}"  # https: a token
    for url in (f"{scheme}://{rest}", named, f"{scheme}://{rest}?timeout=5&db=0"):
        assert redact(f"{words} {url} {words}") == f"{words} {url} {words}"


def test_the_messages_torchdeck_writes_are_masked_where_they_show_the_url():
    cases = {
        f"could not reach the queue at redis://:{SECRET}@127.0.0.1:6379/0: Error 111 connecting to 127.0.0.1:6379.": (
            "could not reach the queue at redis://:***@127.0.0.1:6379/0: Error 111 connecting to 127.0.0.1:6379."
        ),
        f"the run was stored but the broker is unreachable (redis://:{SECRET}@127.0.0.1:1/0): refused": (
            "the run was stored but the broker is unreachable (redis://:***@127.0.0.1:1/0): refused"
        ),
        f"postgresql+psycopg://torchdeck:{SECRET}@db:5432/torchdeck": "postgresql+psycopg://torchdeck:***@db:5432/torchdeck",
        f"redis://:p@ss{SECRET}@redis:6379": "redis://:***@redis:6379",  # an unencoded '@' in the password
        f"s3 at https://minio:9000/bucket?access_key=AKIA&secret_key={SECRET}#x": "s3 at https://minio:9000/bucket?access_key=***&secret_key=***#x",
        f"callback https://app/cb?code=1&token={SECRET}": "callback https://app/cb?code=1&token=***",
        "e-mail ada@example.com, key=value, ratio 3:4": "e-mail ada@example.com, key=value, ratio 3:4",
    }
    for text, shown in cases.items():
        assert redact(text) == shown
        assert SECRET not in redact(text)


def test_redact_data_masks_every_string_of_an_event_and_keeps_the_rest():
    data = {
        "code": "failed",
        "epoch": 3,
        "ok": False,
        "value": 1.5,
        "none": None,
        "traceback": f"Traceback...\nConnectionError: redis://:{SECRET}@h:1/0 refused",
        "attempts": [{"url": f"amqp://u:{SECRET}@mq//"}, "plain text", 7],
        "nested": {"deeper": (f"postgresql://u:{SECRET}@db/x",)},
    }
    out = redact_data(data)
    assert SECRET not in repr(out)
    assert out["code"] == "failed" and out["epoch"] == 3 and out["ok"] is False and out["value"] == 1.5
    assert out["none"] is None and out["attempts"][1:] == ["plain text", 7]
    assert out["attempts"][0]["url"] == "amqp://u:***@mq//"
    assert out["nested"]["deeper"] == ["postgresql://u:***@db/x"]
    assert out["traceback"].endswith("redis://:***@h:1/0 refused")


def test_log_records_are_masked_arguments_included(caplog):
    logger = logging.getLogger("torchdeck.test_redact")
    record = logger.makeRecord(
        logger.name,
        logging.WARNING,
        __file__,
        1,
        "cannot reach %s (%d tries)",
        (f"redis://:{SECRET}@h:6379/0", 3),
        None,
    )
    assert RedactingFilter().filter(record) is True
    assert record.getMessage() == "cannot reach redis://:***@h:6379/0 (3 tries)"
    plain = logger.makeRecord(logger.name, logging.INFO, __file__, 1, "step %d", (5,), None)
    RedactingFilter().filter(plain)
    assert plain.msg == "step %d" and plain.args == (5,)  # records without credentials are left alone

    redact_logs()  # what the dashboard, the CLI and every worker process do at start
    redact_logs()  # twice is harmless
    with caplog.at_level(logging.INFO, logger=logger.name):
        logger.warning("broker %s unreachable", f"redis://:{SECRET}@127.0.0.1:1/0")
        logger.info("database postgresql://u:%s@db/x", SECRET)
    assert SECRET not in caplog.text
    assert "redis://:***@127.0.0.1:1/0" in caplog.text and "postgresql://u:***@db/x" in caplog.text


def test_logged_tracebacks_are_masked_too(caplog):
    """log.exception(...) prints the exception's message below the record's: a URL in it is masked as well."""
    redact_logs()
    logger = logging.getLogger("torchdeck.test_redact.tb")
    with caplog.at_level(logging.INFO, logger=logger.name):
        try:
            raise ConnectionError(f"cannot connect to redis://:{SECRET}@127.0.0.1:1/0")
        except ConnectionError:
            logger.exception("export of run %s failed", "abc")
    assert "export of run abc failed" in caplog.text and "ConnectionError: cannot connect to" in caplog.text
    assert SECRET not in caplog.text
    assert "redis://:***@127.0.0.1:1/0" in caplog.text


def test_the_hard_cases_are_masked_too():
    """Passwords holding '/' or '@', user names holding '@' (Azure's me@corp.com), a token as the only user
    info of an https URL, a URL in quotes; an '@' in a path is not user info."""
    cases = {
        f"redis://:pa/{SECRET}@h": "redis://:***@h",
        f"postgresql://me@corp.com:{SECRET}@h/db": "postgresql://me@corp.com:***@h/db",
        f"https://{SECRET}@github.com/org/repo.git": "https://***@github.com/org/repo.git",
        f"url='redis://:{SECRET}@host:6379/0'": "url='redis://:***@host:6379/0'",
        f"redis://:p@{SECRET}@host/0": "redis://:***@host/0",
        "https://host/people/@ana": "https://host/people/@ana",
        "postgresql://me@host/db": "postgresql://me@host/db",
    }
    for text, shown in cases.items():
        assert redact(text) == shown
