"""No password of a URL ever reaches what torchdeck stores or shows: a broker URL with its password used to
be written into run.error (and shown on the Run page, printed by the CLI) when the queue was unreachable.

Each test uses real parts: a real Redis (with a password where the case needs one), the SQLite file the
dashboard uses, the Run page rendered by Streamlit's AppTest, the CLI and a Celery worker as processes.
Then everything a person could read is searched for the password: every table of the database file, the
captured logs, the processes' output and the rendered page."""

from __future__ import annotations

import logging
import os
import re
import sqlite3
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml
from seeding import free_port, seed_run

from app.services.runs import submit
from core.config import RunSpec
from db import repo
from db.types import EventInput
from tests._servers import start_redis

ROOT = Path(__file__).resolve().parents[2]
TORCHDECK = str(Path(sys.executable).parent / "torchdeck")
SECRET = "s3cr3t-pw"
TINY = {
    "name": "secret-test",
    "data": {"name": "synthetic", "num_classes": 3, "num_samples": 96, "size": 8, "channels": 1},
    "model": {"name": "simple_cnn", "hidden": 16},
    "train": {"epochs": 1, "batch_size": 16},
    "export": {"formats": []},
    "device": "cpu",
    "seed": 0,
}


def closed_port() -> int:
    """A port nothing listens on (it was free a moment ago; nothing of ours binds it)."""
    return free_port()


def database_dump(home: Path) -> str:
    """Every row of every table of the dashboard's SQLite file, as SQL text."""
    with sqlite3.connect(home / "torchdeck.db") as conn:
        return "\n".join(conn.iterdump())


def shown(text: str) -> str:
    """Text as the browser shows it: Streamlit renders messages as Markdown, which the pages escape."""
    return re.sub(r"\\+", "", text)


def page_text(at) -> str:
    """Everything the rendered page holds (each element's message, labels, table data), as text with every
    backslash removed: neither Markdown nor protobuf escaping can hide the password from the search."""
    parts: list[str] = []

    def walk(node) -> None:
        proto = getattr(node, "proto", None)
        if proto is not None:
            parts.append(str(proto))
        for child in getattr(node, "children", {}).values():
            walk(child)

    walk(at._tree)
    return shown("\n".join(parts))


def _tab(at, label: str):
    at.session_state["run.tab"] = label
    return at.run()


@pytest.fixture(scope="module")
def redis_with_password(tmp_path_factory) -> Iterator[int]:
    """A real redis-server that requires the password SECRET; yields its port."""
    proc, port = start_redis(tmp_path_factory.mktemp("redis-pw"), password=SECRET)
    yield port
    proc.terminate()
    proc.wait(10)


@pytest.fixture
def unreachable(home, monkeypatch) -> str:
    """TORCHDECK_BROKER_URL with a password, on a port where nothing listens: every enqueue fails."""
    url = f"redis://:{SECRET}@127.0.0.1:{closed_port()}/0"
    monkeypatch.setenv("TORCHDECK_BROKER_URL", url)
    return url


def _failed_submit(engine, caplog) -> tuple[repo.RunRecord, str]:
    with caplog.at_level(logging.DEBUG), pytest.raises(RuntimeError) as e:
        submit(RunSpec.model_validate(TINY), engine=engine)
    (run,) = repo.list_runs(engine).runs
    return repo.get_run(engine, run.id), str(e.value)


def test_an_unreachable_broker_is_reported_with_its_password_masked(unreachable, engine, home, page, caplog):
    run, raised = _failed_submit(engine, caplog)
    masked = unreachable.replace(SECRET, "***")
    assert run.status == "failed"
    assert run.error.startswith(f"could not reach the queue at {masked}: "), run.error
    assert f"the broker is unreachable ({masked})" in raised
    assert SECRET not in raised
    assert SECRET not in database_dump(home)
    assert SECRET not in caplog.text

    at = page("run.py", id=run.id)
    assert not at.exception
    assert any(masked in shown(e.value) for e in at.error), [e.value for e in at.error]
    assert SECRET not in page_text(at)


def test_re_run_from_the_run_page_with_the_broker_down_shows_the_url_masked(unreachable, engine, home, page, caplog):
    first = seed_run(engine, "done", spec={"device": "cpu"}, epochs=1)
    at = page("run.py", id=first.id)
    with caplog.at_level(logging.DEBUG):
        next(b for b in at.button if b.label == "Re-run").click().run()
    assert not at.exception
    errors = shown(" ".join(e.value for e in at.error))
    assert f"the broker is unreachable ({unreachable.replace(SECRET, '***')})" in errors, errors
    assert SECRET not in page_text(at)
    assert SECRET not in caplog.text
    assert SECRET not in database_dump(home)
    rerun = next(r for r in repo.list_runs(engine).runs if r.id != first.id)
    assert rerun.status == "failed" and "redis://:***@" in rerun.error


def test_export_now_with_the_broker_down_shows_the_url_masked(unreachable, engine, home, page, caplog):
    r = seed_run(engine, "exportable", spec={"device": "cpu"}, epochs=1)
    at = _tab(page("run.py", id=r.id), "Artifacts")
    with caplog.at_level(logging.DEBUG):
        next(b for b in at.button if b.label == "Export now").click().run()
    assert not at.exception
    assert any("Export failed" in e.value for e in at.error)
    said = shown(" ".join(c.value for c in at.code))
    assert f"could not reach the queue at {unreachable.replace(SECRET, '***')}" in said, said
    assert SECRET not in page_text(at) and SECRET not in caplog.text and SECRET not in database_dump(home)


def test_a_wrong_password_for_a_real_redis_is_reported_masked(
    redis_with_password, home, engine, page, monkeypatch, caplog
):
    wrong = f"redis://:not-{SECRET}@127.0.0.1:{redis_with_password}/0"
    monkeypatch.setenv("TORCHDECK_BROKER_URL", wrong)
    run, raised = _failed_submit(engine, caplog)
    assert "redis://:***@127.0.0.1" in run.error and "password" in run.error, run.error  # Redis says why
    for text in (raised, run.error, caplog.text, database_dump(home), page_text(page("run.py", id=run.id))):
        assert SECRET not in text


def test_torchdeck_submit_and_status_print_the_url_masked(unreachable, engine, home, tmp_path):
    spec = tmp_path / "spec.yaml"
    spec.write_text(yaml.safe_dump(TINY))
    env = {**os.environ, "OMP_NUM_THREADS": "1", "CUDA_VISIBLE_DEVICES": ""}  # TORCHDECK_* set by the fixtures
    done = subprocess.run(
        [TORCHDECK, "submit", str(spec)], capture_output=True, text=True, env=env, cwd=tmp_path, timeout=300
    )
    assert done.returncode == 1, done.stdout + done.stderr
    masked = unreachable.replace(SECRET, "***")
    assert f"the broker is unreachable ({masked})" in done.stderr, done.stderr
    assert SECRET not in done.stdout + done.stderr
    (run,) = repo.list_runs(engine).runs
    status = subprocess.run(
        [TORCHDECK, "status", run.id], capture_output=True, text=True, env=env, cwd=tmp_path, timeout=300
    )
    assert status.returncode == 0, status.stderr
    assert f"error: could not reach the queue at {masked}" in status.stdout, status.stdout
    as_json = subprocess.run(
        [TORCHDECK, "status", run.id, "--json"], capture_output=True, text=True, env=env, cwd=tmp_path, timeout=300
    )
    assert SECRET not in status.stdout + status.stderr + as_json.stdout + as_json.stderr
    assert SECRET not in database_dump(home)


def test_events_and_errors_are_stored_with_urls_masked(engine, home, page):
    r = seed_run(engine, "with-events", status="running")
    repo.append_events(
        engine,
        r.id,
        [
            EventInput(
                "lifecycle",
                "error",
                f"could not upload to s3://AKIA:{SECRET}@minio:9000/bucket/x",
                code="upload_failed",
                data={
                    "code": "upload_failed",
                    "traceback": f"Traceback (most recent call last):\n  ...\nOperationalError: postgresql://td:{SECRET}@db:5432/td",
                    "attempts": [{"broker": f"redis://:{SECRET}@redis:6379/0", "n": 3}],
                    "query": f"https://minio:9000/b?X-Amz-Credential=k&token={SECRET}",
                },
            ),
            EventInput(
                "diagnosis",
                "warning",
                f"slow data: reading from https://ada:{SECRET}@files.example/x.zip",
                code="data_bound",
                data={"code": "data_bound", "advice": "Raise loader.num_workers."},
            ),
        ],
    )
    repo.finish_run(
        engine, r.id, "failed", error=f"OperationalError: could not connect to postgresql://td:{SECRET}@db/td"
    )
    events = repo.list_events(engine, r.id)
    upload = next(e for e in events if e.code == "upload_failed")
    assert upload.message == "could not upload to s3://AKIA:***@minio:9000/bucket/x"
    assert upload.data["traceback"].endswith("OperationalError: postgresql://td:***@db:5432/td")
    assert upload.data["attempts"] == [{"broker": "redis://:***@redis:6379/0", "n": 3}]
    assert upload.data["query"] == "https://minio:9000/b?X-Amz-Credential=k&token=***"
    assert repo.get_run(engine, r.id).error == "OperationalError: could not connect to postgresql://td:***@db/td"
    assert SECRET not in database_dump(home)

    at = _tab(page("run.py", id=r.id), "Diagnosis & evaluation")
    assert not at.exception
    # the error event, in the diagnosis panel
    assert any("s3://AKIA:***@minio:9000" in shown(e.value) for e in at.error), [e.value for e in at.error]
    assert SECRET not in page_text(at)


@pytest.mark.slow
def test_a_stack_on_a_broker_with_a_password_runs_without_ever_showing_it(
    redis_with_password, home, engine, page, monkeypatch, caplog
):
    """The happy path: the right password, a real worker process takes the run and trains it. Its log, the
    database and the Run page never show the password."""
    url = f"redis://:{SECRET}@127.0.0.1:{redis_with_password}/0"
    monkeypatch.setenv("TORCHDECK_BROKER_URL", url)
    import redis

    redis.Redis.from_url(url).flushdb()
    env = {**os.environ, "OMP_NUM_THREADS": "1", "CUDA_VISIBLE_DEVICES": "", "TORCHDECK_HEARTBEAT_S": "1"}
    log_path = home / "worker.log"
    with open(log_path, "ab") as log:
        worker = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "celery",
                "-A",
                "worker.celery_app",
                "worker",
                "-P",
                "solo",
                "-c",
                "1",
                "-Q",
                "cpu",
                "-n",
                "secrets@%h",
                "--without-gossip",
                "--without-mingle",
                "-l",
                "INFO",
            ],
            cwd=ROOT,
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
        )
    try:
        with caplog.at_level(logging.DEBUG):
            run = submit(RunSpec.model_validate(TINY), engine=engine)
        deadline = time.monotonic() + 600
        while (run := repo.get_run(engine, run.id)).status not in ("completed", "early_stopped", "failed", "diverged"):
            assert worker.poll() is None, log_path.read_text()[-3000:]
            assert time.monotonic() < deadline, f"run still {run.status}\n{log_path.read_text()[-3000:]}"
            time.sleep(0.3)
        assert run.status in ("completed", "early_stopped"), f"{run.error}\n{log_path.read_text()[-3000:]}"
    finally:
        worker.terminate()
        try:
            worker.wait(60)
        except subprocess.TimeoutExpired:
            worker.kill()
            worker.wait()
    worker_log = log_path.read_text()
    assert f"@127.0.0.1:{redis_with_password}/0" in worker_log, worker_log[-2000:]  # it shows the broker, masked
    assert SECRET not in worker_log
    assert SECRET not in caplog.text
    assert SECRET not in database_dump(home)
    at = page("run.py", id=run.id)
    assert not at.exception and SECRET not in page_text(at)
