"""The database sink of a run's process, on a real SQLite file and a real Postgres: a refused point never
jams a run, heartbeats never wait behind metric writes, a failed checkpoint flush is visible, an outage
longer than the memory window loses nothing, events are stored once across attempts, and a process that
lost its run writes nothing more into it."""

from __future__ import annotations

import shutil
import threading
import time
import uuid
from datetime import timedelta
from pathlib import Path

import pytest
from sqlalchemy import func, select, text, update

from core.config import RunSpec
from core.train import run_training
from db.engine import make_engine
from db.migrate import upgrade
from db.models import Metric, Run
from db.repo import (
    claim_run,
    create_run,
    delete_run,
    get_run,
    list_artifacts,
    list_events,
    mark_lost,
)
from db.types import utcnow
from tests._servers import start_postgres
from tests.worker.conftest import pg_ctl, wait_for
from worker.settings import WorkerSettings
from worker.sink import DbSink

FAST = {"flush_s": 0.05, "heartbeat_s": 0.1}


@pytest.fixture(params=("sqlite", "postgres"))
def engine(request, tmp_path, postgres):
    url = (
        f"sqlite:///{tmp_path / 'db.sqlite'}"
        if request.param == "sqlite"
        else postgres.create_database(f"s_{uuid.uuid4().hex[:10]}")
    )
    upgrade(url)
    engine = make_engine(url)
    yield engine
    engine.dispose()


def _running(engine, worker: str = "w1"):
    run = create_run(engine, {"device": "cpu"}, name="sink")
    return claim_run(engine, run.id, worker)


def _count(engine, run_id: str) -> int:
    with engine.connect() as c:
        return c.execute(select(func.count()).select_from(Metric).where(Metric.run_id == run_id)).scalar()


def test_a_point_the_store_refuses_is_dropped_alone_and_reported_once(engine, tmp_path):
    run = _running(engine)
    sink = DbSink(engine, run.id, "w1", WorkerSettings(**FAST), run_dir=tmp_path / "run")
    too_long = "val/acc_class/" + "x" * 190
    for step in range(1, 101):
        sink.metrics(step, 1, {"train/loss": 1.0 / step, too_long: 0.5})
    sink.event("evaluation", "info", "epoch 1", {"code": "evaluation"}, step=100)
    (tmp_path / "samples.png").write_bytes(b"png")
    sink.artifact("sample_grid", str(tmp_path / "samples.png"))
    assert sink.flush(60), "a refused point must not keep the batch back"
    assert _count(engine, run.id) == 100  # every train/loss point, none of the refused key's
    events = list_events(engine, run.id)
    refused = [e for e in events if e.code == "metric_refused"]
    assert len(refused) == 1 and refused[0].data["key"] == too_long and "limit is 200" in refused[0].data["reason"]
    assert "evaluation" in {e.code for e in events}
    assert [a.kind for a in list_artifacts(engine, run.id)] == ["sample_grid"]
    assert get_run(engine, run.id).degraded is None
    sink.close()


def test_heartbeats_and_events_go_on_while_metric_writes_fail_and_a_failed_flush_degrades_the_run(engine, tmp_path):
    run = _running(engine)
    with engine.begin() as c:  # every metric write now fails, as in an outage of that table alone
        c.execute(text("ALTER TABLE metric RENAME TO metric_away"))
    sink = DbSink(engine, run.id, "w1", WorkerSettings(**FAST), run_dir=tmp_path / "run")
    for step in range(1, 51):
        sink.metrics(step, 1, {"train/loss": 1.0})
    sink.event("diagnosis", "warning", "seen", {"code": "overfitting"}, step=50)
    beats = set()

    def beating() -> bool:
        beats.add(get_run(engine, run.id).heartbeat_at)
        return len(beats) >= 3

    wait_for(beating, 60, "the run's heartbeat did not advance while its metric writes failed")
    wait_for(
        lambda: "overfitting" in {e.code for e in list_events(engine, run.id)},
        60,
        "an event waited behind the failing metric writes",
    )
    assert sink.flush(timeout=1.0) is False
    wait_for(lambda: get_run(engine, run.id).degraded is not None, 60, "the run was not marked degraded")
    assert "did not store this run's metrics" in get_run(engine, run.id).degraded
    assert "degraded" in {e.code for e in list_events(engine, run.id)}
    assert list((tmp_path / "run" / "spill").glob("*.jsonl")), "held points were not kept on disk at the checkpoint"
    with engine.begin() as c:  # the table is back: the spilled points are stored, once
        c.execute(text("ALTER TABLE metric_away RENAME TO metric"))
    assert sink.flush(60)
    assert _count(engine, run.id) == 50
    assert not list((tmp_path / "run" / "spill").glob("*.jsonl"))
    sink.close()


def test_an_outage_longer_than_the_memory_window_spills_to_disk_and_loses_nothing(tmp_path):
    pg = start_postgres()
    try:
        url = pg.create_database("outage")
        upgrade(url)
        engine = make_engine(url)
        run = _running(engine)
        run_dir = tmp_path / "run"
        sink = DbSink(engine, run.id, "w1", WorkerSettings(**FAST, sink_buffer_points=50), run_dir=run_dir)
        sink.metrics(1, 1, {"train/loss": 1.0})
        assert sink.flush(60)
        pg_ctl(pg, "stop", "-m", "fast")
        for step in range(2, 602):
            sink.metrics(step, 1, {"train/loss": 1.0 / step})
            if step % 100 == 0:
                sink.event("evaluation", "info", f"step {step}", {"code": "evaluation"}, step=step)
        wait_for(lambda: list((run_dir / "spill").glob("*.jsonl")), 60, "nothing was spilled during the outage")
        assert len(sink._points) <= 2 * 50 + 1  # memory stayed bounded by the window
        pg_ctl(
            pg,
            "start",
            "-o",
            f"-p {pg.port} -k {pg.socket_dir} -c listen_addresses=127.0.0.1 -c fsync=off",
            "-l",
            str(pg.root / "server.log"),
        )
        assert sink.flush(120)
        with engine.connect() as c:
            steps = list(c.execute(select(Metric.step).where(Metric.run_id == run.id).order_by(Metric.step)).scalars())
        assert steps == list(range(1, 602))
        assert [e.message for e in list_events(engine, run.id) if e.code == "evaluation"] == [
            f"step {s}" for s in range(100, 601, 100)
        ]
        assert not list((run_dir / "spill").glob("*.jsonl"))
        sink.close()
        engine.dispose()
    finally:
        pg.stop()


def test_a_process_that_lost_its_run_writes_nothing_more_into_it(engine, tmp_path):
    run = _running(engine)
    gave_up = threading.Event()
    sink = DbSink(engine, run.id, "w1", WorkerSettings(**FAST), run_dir=tmp_path, on_abandon=lambda why: gave_up.set())
    sink.metrics(1, 1, {"train/loss": 1.0})
    assert sink.flush(60)

    def taken_over() -> bool:  # w1 was too slow: the reaper marked it lost and w2 took it over
        with engine.begin() as c:
            c.execute(update(Run).where(Run.id == run.id).values(heartbeat_at=utcnow() - timedelta(hours=1)))
        # w1's heartbeat thread may beat between these statements and rightly bring its run back: try again
        if mark_lost(engine, 60) != [run.id]:
            return False
        claimed = claim_run(engine, run.id, "w2")
        return claimed is not None and claimed.attempt == 2

    wait_for(taken_over, 60, "w2 never took the run over")
    assert gave_up.wait(60), "the sink did not notice that another worker owns the run"
    assert sink.should_stop() and "no longer owned" in sink.abandoned
    sink.metrics(2, 1, {"train/loss": 0.5})
    assert sink.flush(5) is False
    sink.close()
    assert _count(engine, run.id) == 1


def test_a_deleted_run_is_given_up(engine, tmp_path):
    run = _running(engine)
    gave_up = threading.Event()
    sink = DbSink(engine, run.id, "w1", WorkerSettings(**FAST), run_dir=tmp_path, on_abandon=lambda why: gave_up.set())
    delete_run(engine, run.id, force=True)
    sink.metrics(1, 1, {"train/loss": 1.0})
    assert gave_up.wait(60), "the sink kept writing into a deleted run"
    assert "not found" in sink.abandoned and sink.should_stop()
    sink.close()


TINY = {
    "name": "replay",
    "data": {"name": "synthetic", "num_classes": 3, "num_samples": 300, "size": 8, "channels": 1},
    "model": {"name": "simple_cnn", "hidden": 8},
    "train": {"epochs": 3, "batch_size": 32, "log_every": 1, "early_stopping": {"enabled": False}},
    "export": {"formats": []},
    "device": "cpu",
    "seed": 0,
}


class KeepEpochOne:
    """Delegates to the sink; keeps a copy of last.pt as it was after epoch 1 (core flushes before every
    checkpoint: at the second flush, last.pt still holds epoch 1)."""

    def __init__(self, sink, out: Path):
        self.sink, self.out, self.flushes = sink, out, 0

    def __getattr__(self, name):
        return getattr(self.sink, name)

    def flush(self) -> bool:
        self.flushes += 1
        if self.flushes == 2:
            shutil.copy(self.out / "checkpoints" / "last.pt", self.out / "epoch1.pt")
        return self.sink.flush()


def test_a_resumed_attempt_stores_the_events_of_the_steps_it_replays_once(engine, tmp_path):
    spec = RunSpec.model_validate(TINY)
    run = create_run(engine, spec.model_dump(mode="json"), name="replay")
    claim_run(engine, run.id, "w1")
    out = tmp_path / "run"
    first = DbSink(engine, run.id, "w1", WorkerSettings(**FAST), run_dir=out, attempt=1)
    assert run_training(spec, out, KeepEpochOne(first, out))["status"] == "completed"
    first.close()
    # attempt 1 died after epoch 3's events were stored, with last.pt still at epoch 1
    shutil.move(out / "epoch1.pt", out / "checkpoints" / "last.pt")
    with engine.begin() as c:
        c.execute(update(Run).where(Run.id == run.id).values(status="lost"))
    assert claim_run(engine, run.id, "w2").attempt == 2
    second = DbSink(engine, run.id, "w2", WorkerSettings(**FAST), run_dir=out, attempt=2)
    summary = run_training(spec, out, second, resume=True)
    second.close()
    assert summary["status"] == "completed"
    events = list_events(engine, run.id)
    codes = [e.code for e in events]
    assert [e.data["epoch"] for e in events if e.code == "evaluation"] == [1, 2, 3]  # epochs 2-3 replayed, kept once
    assert codes.count("completed") == 1 and codes.count("resumed") == 1 and codes.count("shape_check") == 1
    assert codes.count("data") == 2  # each attempt's start-up is its own
    with engine.connect() as c:
        steps = list(
            c.execute(
                select(Metric.step).where(Metric.run_id == run.id, Metric.key == "train/loss").order_by(Metric.step)
            ).scalars()
        )
    assert steps == list(range(1, summary["global_step"] + 1))


def test_system_metrics_are_sampled_when_a_run_starts_and_stops(tmp_path):
    from core.events import MemorySink
    from worker.child import SystemMonitor

    sink = MemorySink()
    monitor = SystemMonitor(sink, period_s=3600).start()  # the periodic sample never comes
    monitor.stop()
    steps = [s for s, _, v in sink.metric_rows if "sys/cpu_percent" in v and "sys/rss_mb" in v]
    assert len(steps) == 2 and steps[0] < steps[1] and steps[0] >= int(time.time()) - 60


def test_a_class_name_of_190_characters_never_jams_the_run(engine, tmp_path):
    """A user's class folder name longer than a metric key may be: the run stores its epoch metrics, events
    and exports, and each checkpoint flush returns at once."""
    from PIL import Image

    long_name = "a_very_long_class_name_" + "x" * 167
    data = tmp_path / "images"
    for i, (name, colour) in enumerate(((long_name, (250, 10, 10)), ("short", (10, 10, 250)))):
        (data / name).mkdir(parents=True)
        for j in range(12):
            Image.new("RGB", (8, 8), tuple(max(0, c - 5 * j) for c in colour)).save(data / name / f"{i}_{j}.png")
    spec = RunSpec.model_validate(
        {
            "name": "long classes",
            "data": {"name": "imagefolder", "path": str(data), "image_size": 8, "val_fraction": 0.25},
            "model": {"name": "simple_cnn", "hidden": 8},
            "train": {"epochs": 2, "batch_size": 8},
            "export": {"formats": ["torchscript"]},
            "device": "cpu",
            "seed": 0,
        }
    )
    run = create_run(engine, spec.model_dump(mode="json"), name="long")
    claim_run(engine, run.id, "w1")
    sink = DbSink(engine, run.id, "w1", WorkerSettings(**FAST, flush_timeout_s=60), run_dir=tmp_path / "run")
    assert run_training(spec, tmp_path / "run", sink)["status"] == "completed"
    sink.close()
    assert sink.degraded is None and sink.dropped == 0
    from core.names import class_acc_key
    from db.repo import metric_keys

    keys = set(metric_keys(engine, run.id))
    assert {"val/acc", "val/loss", class_acc_key(long_name), "val/acc_class/short"} <= keys
    assert all(len(k) <= 200 for k in keys)
    evals = [e for e in list_events(engine, run.id) if e.code == "evaluation"]
    assert len(evals) == 2 and evals[0].data["class_keys"] == {class_acc_key(long_name): long_name}
    assert long_name in evals[0].data["class_names"]
    assert "torchscript" in {a.kind for a in list_artifacts(engine, run.id)}
    assert not [e for e in list_events(engine, run.id) if e.code in ("metric_refused", "degraded")]
