"""An event's data is capped before it is stored (worker.sink.bounded, MAX_EVENT_DATA = 64 KB): a run that
attaches a huge traceback, a per-sample list or many medium fields to an event stores the small fields,
names what it left out, and every viewer of the Run page reads at most 64 KB per event."""

from __future__ import annotations

import json

import pytest
from hypothesis import event, given, settings
from hypothesis import strategies as st

from db.engine import make_engine
from db.migrate import upgrade
from db.repo import claim_run, create_run, list_events
from worker.settings import WorkerSettings
from worker.sink import MAX_EVENT_DATA, DbSink, bounded


def _size(data: dict) -> int:
    return len(json.dumps(data, default=str))


def test_data_that_fits_in_64_kb_is_kept_whole_and_more_is_capped():
    """What a viewer of the Run page reads per event: at most 64 KB, and data that fits is stored as it was."""
    fits = {"code": "log", "text": "a" * (64 * 1024 - 100)}
    assert bounded(fits) is fits
    over = {"code": "log", "text": "a" * (64 * 1024 + 100)}
    assert bounded(over) == {"code": "log", "truncated": ["text"]}


def test_small_data_is_left_exactly_as_it_is():
    data = {
        "code": "evaluation",
        "epoch": 3,
        "per_class_acc": [0.5] * 50,
        "class_names": [f"c{i}" for i in range(50)],
        "confusion": [[1] * 50 for _ in range(50)],
    }
    assert _size(data) < MAX_EVENT_DATA
    assert bounded(data) is data


def test_one_huge_field_is_dropped_and_named_the_rest_kept():
    data = {"code": "failed", "epoch": 2, "traceback": "Traceback...\n" + "  frame\n" * 200_000, "step": 17}
    out = bounded(data)
    assert _size(out) <= MAX_EVENT_DATA
    assert out == {"code": "failed", "epoch": 2, "step": 17, "truncated": ["traceback"]}


def test_many_medium_fields_that_add_up_are_capped_too():
    """Each field under 2 KB, 150 KB together: still at most 64 KB stored, the small ones kept."""
    data = {"code": "data", **{f"file_{i}": "x" * 1500 for i in range(100)}, "count": 100}
    out = bounded(data)
    assert _size(out) <= MAX_EVENT_DATA, _size(out)
    assert out["code"] == "data" and out["count"] == 100
    kept = [k for k in out if k.startswith("file_")]
    assert kept and len(kept) + len(out["truncated"]) == 100
    assert set(out["truncated"]).isdisjoint(kept)


def _value(n: int, c: str, shape: str):
    """A JSON value of about n characters of c, as a string, a list of strings, a nested dict or a number."""
    return {"str": c * n, "list": [c * (n // 10)] * 10, "dict": {"a": {"b": c * n}}, "num": n * 0.5}[shape]


def _fields(sizes, **kw):
    keys = st.text(min_size=1, max_size=60).filter(lambda k: k != "truncated")  # the one name bounded() uses
    return st.lists(
        st.tuples(
            keys, sizes, st.sampled_from(["a", "é", '"', "\\", "\n"]), st.sampled_from(["str", "list", "dict", "num"])
        ),
        **kw,
    )


# A few fields from bytes to 40 KB each, or many of up to 2 KB (that add up); some characters JSON escapes
# to 2 or 6 bytes.
_FIELDS = _fields(st.integers(0, 40_000), max_size=12) | _fields(st.integers(0, 2000), min_size=30, max_size=120)


@settings(max_examples=200, deadline=None)
@given(_FIELDS)
def test_any_event_data_is_stored_within_the_cap(fields):
    data = {k: _value(n, c, shape) for k, n, c, shape in fields}
    out = bounded(data)
    assert _size(out) <= MAX_EVENT_DATA
    if _size(data) <= MAX_EVENT_DATA:
        event("within the cap")
        assert out == data
    else:
        event("over the cap")
        # what is kept is kept whole, and what is not is named (as far as names fit)
        assert all(out[k] == data[k] for k in out if k != "truncated")
        assert set(out["truncated"]) <= {k[:100] for k in data}
        assert len(out["truncated"]) == min(100, len(data) - len(out) + 1)


@pytest.fixture
def engine(tmp_path):
    url = f"sqlite:///{tmp_path / 'db.sqlite'}"
    upgrade(url)
    e = make_engine(url)
    yield e
    e.dispose()


def test_a_run_process_stores_a_huge_event_within_the_cap(engine, tmp_path):
    run = claim_run(engine, create_run(engine, {"device": "cpu"}, name="big-events").id, "w1")
    sink = DbSink(engine, run.id, "w1", WorkerSettings(flush_s=0.05, heartbeat_s=0.1), run_dir=tmp_path / "run")
    try:
        sink.event("lifecycle", "error", "RuntimeError: boom", {"code": "failed", "traceback": "x" * 5_000_000}, step=3)
        sink.event(
            "data",
            "warning",
            "3000 unreadable image(s) skipped",
            {"code": "skipped_images", **{f"f{i}": f"cat/{i:04d}.png " * 100 for i in range(3000)}},
        )
        sink.event("evaluation", "info", "epoch 1", {"code": "evaluation", "per_class_acc": [0.9, 0.8]}, step=4)
        assert sink.flush(60)
    finally:
        sink.close()
    events = {e.code: e for e in list_events(engine, run.id)}
    assert events["failed"].message == "RuntimeError: boom"
    assert events["failed"].data == {"code": "failed", "truncated": ["traceback"]}
    assert _size(dict(events["skipped_images"].data)) <= MAX_EVENT_DATA
    assert events["skipped_images"].data["code"] == "skipped_images"
    assert dict(events["evaluation"].data) == {"code": "evaluation", "per_class_acc": [0.9, 0.8]}
