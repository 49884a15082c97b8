"""What the dashboard holds stays bounded whatever a run or a user sends it: uploads of images whose few KB
declare gigapixels are refused naming the file and the limit; evaluations of many classes show the most
confused pairs instead of a matrix; the Run page keeps only the events it shows (and the newest ones, however
many a run has); Compare takes at most 100 runs from a URL and says so."""

from __future__ import annotations

import io
import re
import tracemalloc
import zipfile

import pytest
from seeding import plotly_figures, seed_run

from app.services import datasets as ds
from app.ui.run_view import EventLog
from db import repo
from db.types import EventInput


def shown(text: str) -> str:
    """Text as the browser shows it (the pages escape Markdown)."""
    return re.sub(r"\\+", "", text)


def _png(size: tuple[int, int], mode: str = "RGB", color=0) -> bytes:
    from PIL import Image

    buf = io.BytesIO()
    Image.new(mode, size, color).save(buf, format="PNG")
    return buf.getvalue()


@pytest.fixture(scope="module")
def png_12000() -> bytes:
    """12000×12000 1-bit: ~20 KB of PNG, 144 MP (432 MB as RGB) once decoded; PIL itself only warns."""
    data = _png((12000, 12000), "1")
    assert len(data) < 100_000
    return data


@pytest.fixture(scope="module")
def png_15000() -> bytes:
    """15000×15000: over twice PIL's own limit, where PIL refuses to open it at all."""
    return _png((15000, 15000), "1")


def _zip(entries: dict[str, bytes]) -> io.BytesIO:
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", zipfile.ZIP_DEFLATED) as zf:
        for name, data in entries.items():
            zf.writestr(name, data)
    buf.seek(0)
    return buf


def _good() -> dict[str, bytes]:
    return {"pets/cat/1.png": _png((12, 12), color="red"), "pets/dog/1.png": _png((12, 12), color="blue")}


# --- uploads ----------------------------------------------------------------------------------------------


def test_a_zip_of_12000_square_pngs_is_refused_naming_each_file_and_the_limit(engine, home, png_12000):
    entries = {**_good(), **{f"pets/cat/huge{i}.png": png_12000 for i in range(3)}}
    buf = _zip(entries)
    assert len(buf.getvalue()) < 200_000  # what the user uploads is tiny
    tracemalloc.start()
    try:
        with pytest.raises(ds.UploadRefused) as e:
            ds.store_upload(engine, "huge", buf, len(buf.getvalue()), owner="local")
        peak = tracemalloc.get_traced_memory()[1] / 2**20
    finally:
        tracemalloc.stop()
    message = str(e.value)
    assert message.startswith("3 file(s) could not be read as images"), message
    for i in range(3):
        assert f"cat/huge{i}.png: 12000×12000 pixels, more than the 64 MP accepted" in message, message
    assert peak < 50, f"checking the upload took {peak:.0f} MB: the images were decoded"
    assert list((home / "datasets").iterdir()) == [] and repo.list_datasets(engine) == []


def test_a_png_beyond_pils_own_limit_is_refused_with_the_same_kind_of_message(engine, home, png_15000):
    buf = _zip({**_good(), "pets/dog/giant.png": png_15000})
    with pytest.raises(ds.UploadRefused) as e:
        ds.store_upload(engine, "giant", buf, len(buf.getvalue()), owner="local")
    assert "dog/giant.png: 225,000,000 pixels, more than the 64 MP accepted" in str(e.value), str(e.value)
    assert "DecompressionBomb" not in str(e.value)
    assert list((home / "datasets").iterdir()) == [] and repo.list_datasets(engine) == []


def test_images_up_to_the_limit_are_accepted(engine, home):
    buf = _zip({**_good(), "pets/dog/photo.png": _png((8000, 8000), "1")})  # 64 MP exactly: a big camera's photo
    record = ds.store_upload(engine, "photos", buf, len(buf.getvalue()), owner="local")
    assert record.counts == {"cat": 1, "dog": 2} and record.status == "ready"


def test_the_datasets_page_shows_the_refusal(page, png_12000):
    at = page("datasets.py")
    at.text_input(key="ds.name").input("huge")
    at.file_uploader(key="ds.file").upload(
        "huge.zip", _zip({**_good(), "pets/cat/big.png": png_12000}).getvalue(), "application/zip"
    )
    next(b for b in at.button if b.label == "Upload and check").click()
    at.run()
    assert not at.exception
    errors = [shown(e.value) for e in at.error]
    assert any("cat/big.png: 12000×12000 pixels, more than the 64 MP accepted" in e for e in errors), errors


# --- evaluation of many classes on the Run page -----------------------------------------------------------


def _tab(at, label: str):
    at.session_state["run.tab"] = label
    return at.run()


def test_an_evaluation_of_many_classes_shows_the_most_confused_pairs(page, engine):
    r = seed_run(engine, "imagenet-ish", epochs=1)
    names = [f"class_{i:02d}" for i in range(60)]
    pairs = [["class_03", "class_07", 9], ["class_10", "class_11", 4], ["class_59", "class_00", 1]]
    repo.append_events(
        engine,
        r.id,
        [
            EventInput(
                "evaluation",
                "info",
                "epoch 1: val/acc 0.7",
                code="evaluation",
                data={
                    "code": "evaluation",
                    "epoch": 1,
                    "per_class_acc": [0.7] * 60,
                    "class_names": names,
                    "top_confusions": pairs,
                },
            )
        ],
    )
    at = _tab(page("run.py", id=r.id), "Diagnosis & evaluation")
    assert not at.exception
    table = next(d.value for d in at.dataframe if list(d.value.columns) == ["true", "predicted", "count"])
    assert table.values.tolist() == pairs
    figs = plotly_figures(at)
    assert "Confusion matrix (validation)" not in figs
    assert figs["Per-class accuracy (validation)"]["data"][0]["x"] == names
    assert any("After epoch 1" in c.value for c in at.caption)


# --- the Run page's event log -----------------------------------------------------------------------------


def _held(run_id: str, at) -> EventLog:
    return at.session_state[f"run.events.{run_id}"]


def test_the_event_log_keeps_what_it_shows_and_shows_the_newest_of_thousands(page, engine):
    r = seed_run(engine, "chatty", epochs=1)
    confusion = [[5, 1, 0], [0, 6, 0], [1, 0, 4]]
    repo.append_events(
        engine,
        r.id,
        [
            EventInput(
                "diagnosis",
                "warning",
                "early finding: the loss plateaued",
                code="loss_plateau",
                data={"code": "loss_plateau", "advice": "Lower the learning rate."},
            ),
            EventInput(
                "evaluation",
                "info",
                "epoch 1",
                code="evaluation",
                data={
                    "code": "evaluation",
                    "epoch": 1,
                    "confusion": confusion,
                    "per_class_acc": [0.8, 1.0, 0.8],
                    "class_names": ["a", "b", "c"],
                },
            ),
            *[EventInput("lifecycle", "info", f"step {i}", code="tick") for i in range(2600)],
            EventInput("lifecycle", "info", "the newest event", code="newest"),
        ],
    )
    at = _tab(page("run.py", id=r.id), "Diagnosis & evaluation")
    assert not at.exception
    cap = EventLog.RECENT + EventLog.FINDINGS + 1
    log = next(d.value for d in at.dataframe if "message" in d.value.columns)
    assert log.iloc[0]["message"] == "the newest event"  # newest first
    assert len(log) <= cap
    held = _held(r.id, at)
    assert len(held.recent) <= EventLog.RECENT and len(held.findings) <= EventLog.FINDINGS
    # what matters is kept however old: the finding and the latest evaluation
    assert any("early finding" in w.value for w in at.warning)
    assert plotly_figures(at)["Confusion matrix (validation)"]["data"][0]["text"] == confusion

    later = [[6, 0, 0], [0, 6, 0], [0, 0, 5]]
    repo.append_events(
        engine,
        r.id,
        [
            *[EventInput("lifecycle", "info", f"later {i}", code="tick") for i in range(10)],
            EventInput(
                "evaluation",
                "info",
                "epoch 2",
                code="evaluation",
                data={
                    "code": "evaluation",
                    "epoch": 2,
                    "confusion": later,
                    "per_class_acc": [1.0, 1.0, 1.0],
                    "class_names": ["a", "b", "c"],
                },
            ),
        ],
    )
    at.run()
    log = next(d.value for d in at.dataframe if "message" in d.value.columns)
    assert log.iloc[0]["message"] == "epoch 2" and len(log) <= cap
    assert plotly_figures(at)["Confusion matrix (validation)"]["data"][0]["text"] == later
    assert any("After epoch 2" in c.value for c in at.caption)
    held = _held(r.id, at)
    assert len(held.recent) <= EventLog.RECENT and len(held.findings) <= EventLog.FINDINGS


def test_findings_are_kept_up_to_their_cap(page, engine):
    r = seed_run(engine, "many-findings", epochs=1)
    repo.append_events(
        engine,
        r.id,
        [EventInput("diagnosis", "warning", f"finding {i}", code=f"f{i}", data={"code": f"f{i}"}) for i in range(300)],
    )
    at = _tab(page("run.py", id=r.id), "Diagnosis & evaluation")
    assert not at.exception
    held = _held(r.id, at)
    assert len(held.findings) == EventLog.FINDINGS  # the first 200 findings, in order
    assert held.findings[0].message == "finding 0" and held.findings[-1].message == "finding 199"
    assert [e.message for e in held.recent][-1] == "finding 299"


# --- compare ----------------------------------------------------------------------------------------------


def test_compare_with_105_ids_shows_the_first_100_and_says_so(page, engine):
    runs = [seed_run(engine, f"run-{i:03d}", steps=4, epochs=1, lr=0.001 * (i + 1)) for i in range(105)]
    ids = [r.id for r in runs]
    at = page("compare.py", ids=",".join(ids))
    assert not at.exception
    warnings = " ".join(w.value for w in at.warning)
    assert "at most 100 runs" in warnings and "the first 100 of the 105 named" in warnings, warnings
    assert at.multiselect(key="cmp.ids").value == ids[:100]
    figure = plotly_figures(at)["train/loss"]
    assert [t["name"] for t in figure["data"]] == [f"run-{i:03d}" for i in range(100)]
    # 100 names would bury the chart under its legend: hovering a line names its run instead.
    assert figure["layout"]["showlegend"] is False and figure["layout"]["hovermode"] == "closest"


def test_compare_with_20_ids_shows_them_all_with_their_legend(page, engine):
    ids = [seed_run(engine, f"r{i}", steps=2, epochs=1).id for i in range(20)]
    at = page("compare.py", ids=",".join(ids))
    assert not at.exception and not any("at most" in w.value for w in at.warning)
    assert at.multiselect(key="cmp.ids").value == ids
    assert plotly_figures(at)["train/loss"]["layout"].get("showlegend") is not False


def test_many_compared_runs_get_fewer_points_each_but_never_too_few(home):
    # Importing a page runs it: `home` gives it a database (without it, this test passed only after another test of
    # this module had imported the page in the same process, as a serial run happens to order them; not under xdist).
    from app.app_pages.compare import MAX_POINTS, points_per_run

    assert points_per_run(2) == points_per_run(40) == MAX_POINTS
    assert points_per_run(100) == 200 and 100 * points_per_run(100) <= 40 * MAX_POINTS
    assert points_per_run(10_000) == 100
