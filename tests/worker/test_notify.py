"""Run-end webhooks (worker/notify.py): the payload, the retry against a real local HTTP server, the
settings, and a real worker notifying the end of a real run."""

from __future__ import annotations

import base64
import json
import logging
import threading
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from types import SimpleNamespace

import pytest
from pydantic import ValidationError

import worker.notify as notify
from core.names import FINISHED_STATUSES
from db.engine import make_engine
from db.migrate import upgrade
from db.repo import claim_run, create_run, finish_run, get_run
from db.types import RunRecord
from tests._servers import free_port
from tests.worker.conftest import wait_for
from worker.notify import build_payload, notify_run_end, send_with_retry, should_notify
from worker.settings import WorkerSettings

NOTIFY_LOG = "torchdeck.worker.notify"
START = datetime(2025, 1, 2, 3, 4, 5, tzinfo=UTC)


class Hook:
    """A webhook receiver on 127.0.0.1: answers `statuses` in turn (then `then`), records every POST."""

    def __init__(self, statuses: tuple[int, ...] = (), then: int = 200) -> None:
        self.requests: list[dict] = []
        self._answers, self._then, self._lock = list(statuses), then, threading.Lock()
        hook = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802 - http.server's name
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                with hook._lock:
                    hook.requests.append({"path": self.path, "headers": dict(self.headers), "body": body})
                    status = hook._answers.pop(0) if hook._answers else hook._then
                self.send_response(status)
                self.send_header("Content-Length", "2")
                self.end_headers()
                self.wfile.write(b"ok")

            def log_message(self, *args: object) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server.server_address[1]}/hook"

    def payloads(self) -> list[dict]:
        with self._lock:
            return [json.loads(r["body"]) for r in self.requests]

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def hooks():
    made: list[Hook] = []

    def make(*statuses: int, then: int = 200) -> Hook:
        made.append(Hook(statuses, then))
        return made[-1]

    yield make
    for h in made:
        h.close()


def record(**changes) -> RunRecord:
    base = RunRecord(
        id="r0123456789",
        name="digits cnn",
        owner="https://idp.example.com#alice",
        status="completed",
        spec={},
        spec_hash="h",
        created_at=START,
        started_at=START,
        finished_at=START + timedelta(seconds=65),
        heartbeat_at=None,
        worker_id="w1",
        device="cpu",
        attempt=1,
        progress=1.0,
        summary={"best": {"metric": "val/loss", "value": 0.123456, "epoch": 3}, "wall_time_s": 64.2},
        error=None,
        tags=(),
        parent_id=None,
        cancel_requested=False,
    )
    return replace(base, **changes)


def warnings_of(caplog) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == NOTIFY_LOG and r.levelno == logging.WARNING]


# --- the payload ----------------------------------------------------------------------------------------


def test_payload_of_a_completed_run():
    p = build_payload(record(), "https://td.example.com/")
    assert p["run"] == {
        "id": "r0123456789",
        "name": "digits cnn",
        "owner": "https://idp.example.com#alice",
        "status": "completed",
        "best": {"metric": "val/loss", "value": 0.123456, "epoch": 3},
        "error": None,
        "sweep_id": None,
        "url": "https://td.example.com/run?id=r0123456789",
    }
    assert p["text"] == (
        'torchdeck run "digits cnn" completed · best val/loss 0.1235 (epoch 3) · took 1m 05s'
        " · https://td.example.com/run?id=r0123456789"
    )
    assert "\n" not in p["text"]
    json.dumps(p, allow_nan=False)


def test_payload_of_a_failed_run_has_the_first_line_of_its_error_and_no_link_without_a_public_url():
    run = record(
        status="failed",
        summary={"best": None},
        finished_at=START + timedelta(hours=2, minutes=3),
        error="CUDA out of memory. Tried to allocate 2.00 GiB\nTraceback (most recent call last):\n  ...",
    )
    p = build_payload(run)
    assert p["run"]["status"] == "failed" and p["run"]["best"] is None and p["run"]["url"] is None
    assert p["run"]["error"] == "CUDA out of memory. Tried to allocate 2.00 GiB"
    assert p["text"] == (
        'torchdeck run "digits cnn" failed · took 2h 03m · error: CUDA out of memory. Tried to allocate 2.00 GiB'
    )


def test_payload_of_a_pruned_sweep_trial():
    run = record(
        status="pruned",
        sweep_id="s42",
        trial=7,
        started_at=None,
        finished_at=None,
        summary={"best": {"metric": "val/acc", "value": 0.5, "epoch": 1}, "wall_time_s": 12.4},
    )
    p = build_payload(run, "https://td.example.com")
    assert p["run"]["status"] == "pruned" and p["run"]["sweep_id"] == "s42"
    assert p["text"].startswith('torchdeck run "digits cnn" pruned · best val/acc 0.5 (epoch 1) · took 12s')


def test_a_non_finite_best_value_is_null_and_the_payload_stays_json():
    p = build_payload(record(summary={"best": {"metric": "val/loss", "value": float("nan"), "epoch": 1}}))
    assert p["run"]["best"]["value"] is None
    json.dumps(p, allow_nan=False)


def test_text_stays_within_slacks_3000_characters():
    run = record(status="failed", name="n" * 10_000, error="e" * 10_000)
    p = build_payload(run, "https://td.example.com/" + "x" * 5000)
    assert len(p["text"]) <= notify.TEXT_LIMIT and p["text"].endswith("…")
    assert len(p["run"]["error"]) <= notify.ERROR_LIMIT


PHISH = "<!channel> <https://login.evil.example/sso|Your GPU quota expires: sign in again>"


def test_slack_markup_in_a_runs_name_and_error_is_shown_as_typed_never_acted_on():
    """Slack reads `<!channel>` as a ping of everyone and `<url|words>` as words over a link: a run's name and
    error line are escaped as Slack documents (&amp; &lt; &gt;), so Slack shows them as typed."""
    run = record(
        status="failed",
        name=PHISH,
        error="bad <input> & <@U123ABC> here\nTraceback …",
        summary={"best": {"metric": "val/<acc>", "value": "<!here>", "epoch": 1}},
    )
    p = build_payload(run, "https://td.example.com")
    text = p["text"]
    assert "<" not in text and ">" not in text, text
    assert text.startswith(
        'torchdeck run "&lt;!channel&gt; &lt;https://login.evil.example/sso|Your GPU quota '
        'expires: sign in again&gt;" failed · best val/&lt;acc&gt; &lt;!here&gt; (epoch 1)'
    ), text
    assert "error: bad &lt;input&gt; &amp; &lt;@U123ABC&gt; here" in text
    assert p["run"]["name"] == PHISH and p["run"]["error"] == "bad <input> & <@U123ABC> here"  # data stays data
    # cut to Slack's limit, an entity is never left half (`&l…`)
    long = build_payload(record(status="failed", name="<" * 200, error="&" * 500), None)["text"]
    assert len(long) <= notify.TEXT_LIMIT and long.endswith("&amp;…") and "<" not in long


def test_no_credential_reaches_the_payload():
    run = record(
        status="failed",
        name="copy of postgresql://td:hunter2@db/x",
        error="could not connect to redis://:s3cr3t@redis:6379/0 (https://tok3n@api.example.com/?token=abc)",
        summary={"best": {"metric": "https://u:pw9@x/y", "value": 1.0, "epoch": 1}},
    )
    sent = json.dumps(build_payload(run, "https://admin:pub1ic@td.example.com"))
    for secret in ("hunter2", "s3cr3t", "tok3n", "token=abc", "pw9", "pub1ic"):
        assert secret not in sent, secret
    assert "***" in sent


# --- delivery -------------------------------------------------------------------------------------------


def test_a_failed_first_attempt_is_retried_once_and_the_body_is_the_json(hooks):
    hook = hooks(500)
    payload = build_payload(record())
    assert send_with_retry(hook.url, payload) is True  # the real backoff (1 s) between the two
    assert len(hook.requests) == 2
    assert hook.payloads() == [payload, payload]
    assert hook.requests[-1]["headers"]["Content-Type"] == "application/json" and hook.requests[-1]["path"] == "/hook"


def test_a_server_that_always_fails_gets_three_attempts_and_one_warning(hooks, caplog):
    hook = hooks(then=503)
    with caplog.at_level(logging.WARNING, logger=NOTIFY_LOG):
        assert send_with_retry(hook.url, build_payload(record()), backoff_s=(0.01, 0.01)) is False
    assert len(hook.requests) == 3
    (line,) = warnings_of(caplog)
    host = hook.url.rsplit("/", 1)[0]
    assert f"{host}/…" in line and "/hook" not in line and "3 attempt" in line and "HTTP 503" in line


def test_the_default_backoff_is_one_then_two_seconds(hooks, monkeypatch):
    sleeps: list[float] = []
    monkeypatch.setattr(notify, "time", SimpleNamespace(sleep=sleeps.append))
    hook = hooks(then=500)
    assert send_with_retry(hook.url, {"text": "x"}) is False
    assert sleeps == [1.0, 2.0] and len(hook.requests) == 3


def test_a_client_error_is_not_retried(hooks, caplog):
    hook = hooks(then=404)
    with caplog.at_level(logging.WARNING, logger=NOTIFY_LOG):
        assert send_with_retry(hook.url, {"text": "x"}, backoff_s=(0.01,)) is False
    assert len(hook.requests) == 1
    (line,) = warnings_of(caplog)
    assert "1 attempt" in line and "HTTP 404" in line


def test_an_unreachable_port_logs_one_line_and_never_raises(caplog):
    port = free_port()  # nothing listens there
    with caplog.at_level(logging.WARNING, logger=NOTIFY_LOG):
        assert (
            send_with_retry(f"http://127.0.0.1:{port}/hook?token=sup3rsecret", {"text": "x"}, backoff_s=(0.01,))
            is False
        )
    (line,) = warnings_of(caplog)
    assert f"http://127.0.0.1:{port}/…" in line and "3 attempt" in line and "cannot connect" in line
    assert "sup3rsecret" not in line and "token" not in line  # a URL's path and query hold its secret: never logged


def test_a_url_with_user_and_password_sends_basic_auth_and_logs_only_the_host(hooks, caplog):
    hook = hooks(then=500)
    url = hook.url.replace("http://", "http://hookuser:pa55word@")
    with caplog.at_level(logging.WARNING, logger=NOTIFY_LOG):
        assert send_with_retry(url, {"text": "x"}, attempts=1) is False
    auth = hook.requests[0]["headers"]["Authorization"]
    assert base64.b64decode(auth.removeprefix("Basic ")) == b"hookuser:pa55word"
    (line,) = warnings_of(caplog)
    assert "http://127.0.0.1:" in line and "pa55word" not in line and "hookuser" not in line


# --- settings and which runs notify -------------------------------------------------------------------


def test_settings_default_to_every_final_status_and_accept_a_comma_separated_list(monkeypatch):
    for k in ("TORCHDECK_WEBHOOK_URL", "TORCHDECK_WEBHOOK_ON", "TORCHDECK_PUBLIC_URL"):
        monkeypatch.delenv(k, raising=False)
    s = WorkerSettings()
    assert s.webhook_url is None and s.public_url is None
    assert s.webhook_statuses == FINISHED_STATUSES and "pruned" in s.webhook_statuses
    monkeypatch.setenv("TORCHDECK_WEBHOOK_URL", "https://hooks.slack.com/services/T0/B0/x")
    monkeypatch.setenv("TORCHDECK_WEBHOOK_ON", " Failed, diverged ,failed")
    s = WorkerSettings()
    assert s.webhook_url == "https://hooks.slack.com/services/T0/B0/x" and s.webhook_statuses == ("failed", "diverged")
    monkeypatch.setenv("TORCHDECK_WEBHOOK_URL", "")  # docker compose passes an unset variable as empty
    monkeypatch.setenv("TORCHDECK_WEBHOOK_ON", "")
    s = WorkerSettings()
    assert s.webhook_url is None and s.webhook_statuses == FINISHED_STATUSES


@pytest.mark.parametrize("url", ["ftp://example.com/hook", "hooks.slack.com/services/x", "https://", "javascript:x"])
def test_a_webhook_url_that_is_not_http_is_refused_clearly(url):
    with pytest.raises(ValidationError, match=r"TORCHDECK_WEBHOOK_URL must be an http:// or https:// URL"):
        WorkerSettings(webhook_url=url)


def test_an_unknown_status_in_webhook_on_is_refused_naming_the_choices():
    with pytest.raises(ValidationError, match=r"TORCHDECK_WEBHOOK_ON: running is not a final status.*pruned"):
        WorkerSettings(webhook_on="failed,running")


def test_should_notify_only_finished_runs_of_the_chosen_statuses_ended_by_this_worker():
    s = WorkerSettings(webhook_url="http://127.0.0.1:9/h", webhook_on="failed,diverged")
    assert should_notify(record(status="failed"), s) and should_notify(record(status="diverged"), s, "w1")
    assert not should_notify(record(status="completed"), s)
    assert not should_notify(record(status="running"), WorkerSettings(webhook_url="http://127.0.0.1:9/h"))
    assert not should_notify(record(status="failed"), s, "w2")  # taken over: its new owner notifies
    assert not should_notify(record(status="failed"), WorkerSettings())  # no URL


@pytest.fixture
def engine(tmp_path):
    url = f"sqlite:///{tmp_path / 'db.sqlite'}"
    upgrade(url)
    return make_engine(url)


def _ended(engine, status: str, worker: str = "w1") -> str:
    run = create_run(engine, {"device": "cpu"}, name=f"a {status} run")
    claim_run(engine, run.id, worker)
    finish_run(engine, run.id, status, error="boom" if status == "failed" else None, worker_id=worker)
    return run.id


def test_notify_run_end_filters_on_webhook_on_in_the_background(engine, hooks):
    hook = hooks()
    s = WorkerSettings(webhook_url=hook.url, webhook_on="failed")
    done, failed = _ended(engine, "completed"), _ended(engine, "failed")
    for run_id in (done, failed):
        t = notify_run_end(engine, run_id, worker_id="w1", settings=s)
        assert t is not None and t.daemon
        t.join(60)
        assert not t.is_alive()
    (sent,) = hook.payloads()
    assert sent["run"]["id"] == failed and sent["run"]["status"] == "failed" and sent["run"]["error"] == "boom"


def test_notify_run_end_skips_unfinished_runs_and_runs_of_another_worker(engine, hooks):
    hook = hooks()
    s = WorkerSettings(webhook_url=hook.url)
    running = create_run(engine, {"device": "cpu"}, name="still going")
    claim_run(engine, running.id, "w1")
    for run_id, worker in ((running.id, "w1"), (_ended(engine, "completed", "w2"), "w1")):
        notify_run_end(engine, run_id, worker_id=worker, settings=s).join(60)
    assert hook.requests == []


def test_notify_run_end_without_a_url_starts_nothing_and_a_broken_database_never_raises(engine, caplog, monkeypatch):
    monkeypatch.delenv("TORCHDECK_WEBHOOK_URL", raising=False)
    assert notify_run_end(engine, "nope") is None
    s = WorkerSettings(webhook_url=f"http://127.0.0.1:{free_port()}/h")
    with caplog.at_level(logging.WARNING, logger=NOTIFY_LOG):
        notify_run_end(engine, "no-such-run", settings=s).join(60)
    (line,) = warnings_of(caplog)
    assert "no-such-run" in line


def test_the_reaper_notifies_a_run_it_fails(engine, hooks):
    import time

    from worker import reaper

    hook = hooks()
    run = create_run(engine, {"device": "cpu"}, name="lost")
    claim_run(engine, run.id, "w1")
    time.sleep(0.05)  # its heartbeat is then older than stale_after_s below, however fast the machine
    reaper.reap(engine, WorkerSettings(stale_after_s=0.01, max_attempts=1, webhook_url=hook.url))
    (sent,) = wait_for(hook.payloads, 60, "the reaper sent no notification")
    assert sent["run"]["id"] == run.id and sent["run"]["status"] == "failed" and "lost 1 times" in sent["run"]["error"]
    assert get_run(engine, run.id).status == "failed"


# --- a real worker ------------------------------------------------------------------------------------


@pytest.mark.parametrize("stack", ["sqlite"], indirect=True)  # one backend: the database plays no part here
def test_a_worker_posts_the_end_of_its_run(stack, hooks):
    hook = hooks()
    stack.start_worker("w1", TORCHDECK_WEBHOOK_URL=hook.url, TORCHDECK_PUBLIC_URL="https://td.example.com")
    run_id = stack.submit("train.epochs=1", "data.num_samples=600", name="hooked")
    sent = wait_for(
        lambda: [p for p in hook.payloads() if p["run"]["id"] == run_id],
        120,
        f"no webhook POST for run {run_id}\n{stack.logs()}",
    )
    assert [p["run"]["status"] for p in sent] == ["completed"], sent
    assert sent[0]["run"]["name"] == "hooked" and sent[0]["run"]["best"]["metric"] == "val/loss"
    assert sent[0]["run"]["url"] == f"https://td.example.com/run?id={run_id}"
    assert sent[0]["text"].startswith('torchdeck run "hooked" completed · best val/loss ')
    assert get_run(stack.engine, run_id).status == "completed"
    # The next run's end comes after the first one's notification was sent: by then, a duplicate would show.
    div = stack.submit("optim.name=sgd", "optim.lr=1000", "train.grad_clip.mode=none", name="diverging")
    wait_for(
        lambda: any(p["run"]["id"] == div for p in hook.payloads()), 120, f"no webhook POST for {div}\n{stack.logs()}"
    )
    assert [(p["run"]["id"], p["run"]["status"]) for p in hook.payloads()] == [(run_id, "completed"), (div, "diverged")]
