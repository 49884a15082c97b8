"""A queued run always says what it waits for: the New run page and the Run page name the live workers
that serve the run's queue, or say that none does and how to fix it."""

from __future__ import annotations

from datetime import timedelta

from markdown_view import shown
from seeding import seed_run
from sqlalchemy import update

from db import repo
from db.models import Worker
from db.types import utcnow


def _click(at, label: str):
    next(b for b in at.button if b.label == label).click()
    return at.run()


def _worker(engine, worker_id: str, queues: list[str], *, age_s: float = 0.0) -> None:
    repo.upsert_worker(engine, worker_id, hostname="host-a", queues=queues, devices=[{"kind": "cpu", "cores": 2}])
    if age_s:
        with engine.begin() as c:
            c.execute(
                update(Worker).where(Worker.id == worker_id).values(heartbeat_at=utcnow() - timedelta(seconds=age_s))
            )


def test_the_new_run_page_says_no_worker_serves_the_gpu_queue_and_how_to_fix_it(page, engine):
    _worker(engine, "cpu@host-a/1-aa", ["cpu"])  # a CPU worker only: a device=auto run goes to the gpu queue
    at = _click(page("new_run.py"), "Validate")
    text = " ".join(w.value for w in at.warning)
    assert "no live worker serves the 'gpu' queue" in text.lower()
    assert "torchdeck worker --gpus 0" in text and "device: cpu" in text
    at.selectbox(key="nr.f.device").set_value("cpu")
    at = _click(at, "Validate")
    served = " ".join(shown(i.value).text for i in at.info)  # worker names are shown as text
    assert "queue 'cpu' is served by 1 live worker(s): cpu@host-a/1-aa on host-a" in served.lower()
    assert not any("no live worker" in w.value.lower() for w in at.warning)


def test_the_run_page_of_a_queued_run_names_its_workers_or_says_there_are_none(page, engine):
    r = seed_run(engine, "waiting", status="queued", spec={"device": "cpu"})
    _worker(engine, "cpu@host-a/2-bb", ["cpu"], age_s=3600)  # gone an hour ago: does not count
    at = page("run.py", id=r.id)
    assert not at.exception
    assert any(
        "no live worker serves the 'cpu' queue" in w.value.lower() and "torchdeck worker --queues cpu" in w.value
        for w in at.warning
    )
    _worker(engine, "cpu@host-a/3-cc", ["cpu", "gpu"])
    at = page("run.py", id=r.id)
    assert any("served by 1 live worker(s): cpu@host-a/3-cc" in shown(i.value).text for i in at.info)
    done = seed_run(engine, "done")
    at = page("run.py", id=done.id)
    assert not any("live worker" in x.value for x in [*at.info, *at.warning])  # only a queued run waits


def test_a_degraded_run_says_its_record_may_be_incomplete(page, engine):
    r = seed_run(engine, "partial", steps=5)
    repo.mark_degraded(engine, r.id, "the database did not store this run's metrics within 60 s at step 5")
    at = page("run.py", id=r.id)
    assert any("Incomplete record: the database did not store" in w.value for w in at.warning)


# --- `torchdeck submit` right after `make up` ------------------------------------------------------------------
def _submit(tmp_path):
    import yaml
    from typer.testing import CliRunner

    from app.cli import app as cli

    spec = tmp_path / "spec.yaml"
    spec.write_text(yaml.safe_dump({"name": "early", "data": {"name": "digits"}, "device": "cpu"}))
    return CliRunner().invoke(cli, ["submit", str(spec)])


def _fresh_stack(home, broker_url: str, age_s: float = 0.0) -> None:
    """What `torchdeck up` leaves as it starts: the private broker's URL under TORCHDECK_HOME (its workers register
    a few seconds later)."""
    import os
    import time

    recorded = home / "broker.url"
    recorded.write_text(broker_url)
    os.utime(recorded, (time.time() - age_s, time.time() - age_s))


def test_submit_right_after_up_waits_for_the_workers_to_register(engine, broker, home, redis_url, tmp_path):
    import threading

    _fresh_stack(home, redis_url)
    late = threading.Timer(2.0, _worker, (engine, "cpu@laptop/1-aa", ["gpu", "cpu"]))  # registers 2 s later
    late.start()
    try:
        done = _submit(tmp_path)
    finally:
        late.cancel()
    assert done.exit_code == 0, done.output
    assert "waiting up to 15 s for the workers of the stack just started" in done.output
    assert "queue 'cpu' is served by 1 live worker(s): cpu@laptop/1-aa on host-a" in done.output
    assert "warning" not in done.output and done.output.strip().splitlines()[-1] == repo.list_runs(engine).runs[0].id


def test_submit_waits_a_bounded_time_and_only_on_a_fresh_stack(engine, broker, home, redis_url, tmp_path, monkeypatch):
    import time

    from app.services import broker as broker_service

    monkeypatch.setattr(broker_service, "WORKERS_WAIT_S", 1.0)
    _fresh_stack(home, redis_url)
    began = time.monotonic()
    done = _submit(tmp_path)  # nobody comes: the warning, after the wait
    assert "waiting up to 1 s" in done.output and "warning: no live worker serves the 'cpu' queue" in done.output
    assert 1.0 <= time.monotonic() - began < 30
    _fresh_stack(home, redis_url, age_s=3600)  # a stack up for an hour: its workers would be there by now
    done = _submit(tmp_path)
    assert "waiting" not in done.output and "warning: no live worker serves the 'cpu' queue" in done.output
