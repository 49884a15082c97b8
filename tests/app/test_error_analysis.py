"""The Run page's error analysis from a real tiny run stored like a worker stores it: per-class
precision/recall/F1 with its CSV, the gallery of confident mistakes with the confused pairs, and the
weight and gradient histograms as heat maps over steps."""

from __future__ import annotations

import io
from pathlib import Path

import pandas as pd
import pytest
import torch
from markdown_view import shown
from seeding import plotly_figures, seed_run

from core.config import RunSpec
from core.events import MemorySink
from core.names import HIST_BINS, MISCLASSIFIED
from core.train import run_training
from db import repo
from db.types import EventInput

SPEC = {
    "data": {"name": "digits", "image_size": 8},
    "model": {"name": "simple_cnn", "hidden": 16},
    "train": {"epochs": 2, "batch_size": 64, "log_every": 5, "diag_every": 5},
    "export": {"formats": []},
    "device": "cpu",
    "seed": 0,
}


@pytest.fixture
def trained(engine, home: Path):
    """A run whose events and artifacts are those of a real 2-epoch training, in the artifact folder."""
    torch.set_num_threads(1)
    r = seed_run(engine, "errors", epochs=2)
    out = home / "artifacts" / "runs" / r.id
    sink = MemorySink()
    run_training(RunSpec.from_dict(SPEC), out, sink)
    repo.append_events(
        engine,
        r.id,
        [
            EventInput(e["kind"], e["level"], e["message"], code=e["data"].get("code"), data=e["data"])
            for e in sink.events
        ],
    )
    for a in sink.artifacts:
        path = Path(a["path"])
        repo.add_artifact(engine, r.id, a["kind"], path.as_uri(), size=path.stat().st_size, meta=a["meta"])
    return r, sink


def _details(page, r):
    at = page("run.py", id=r.id)
    at.session_state["run.tab"] = "Diagnosis & evaluation"
    at = at.run()
    assert not at.exception
    return at


def test_per_class_table_csv_gallery_and_histograms(page, trained):
    r, sink = trained
    at = _details(page, r)
    last = [e for e in sink.events if e["kind"] == "evaluation"][-1]["data"]
    table = next(d.value for d in at.dataframe if "precision" in d.value.columns)
    assert list(table["class"]) == last["class_names"] and list(table["support"]) == last["support"]
    assert table["recall"].tolist() == pytest.approx([100 * v for v in last["recall"]])  # shown in percent
    csv = next(d for d in at.get("download_button") if d.proto.label == "Per-class metrics as CSV")
    assert csv.proto.label == "Per-class metrics as CSV"
    from app.ui.error_view import class_table

    exported = pd.read_csv(io.StringIO(class_table(last).to_csv(index=False)))
    assert list(exported.columns) == ["class", "precision", "recall", "f1", "support"]

    gallery = next(a for a in reversed(sink.artifacts) if a["kind"] == MISCLASSIFIED)["meta"]
    images = at.image
    assert len(images) == 1, [c.value for c in at.caption]
    captions = [i.caption for i in images[0].proto.imgs]
    first = gallery["items"][0]
    assert len(captions) == len(gallery["items"])
    assert shown(captions[0]).text == f"{first['true']} → {first['predicted']} ({first['confidence']:.0%})"
    pairs = next(d.value for d in at.dataframe if list(d.value.columns) == ["true", "predicted", "count"])
    assert pairs.values.tolist()[0] == list(gallery["top_confusions"][0])

    figs = plotly_figures(at)
    steps = [e["step"] for e in sink.events if e["kind"] == "histogram"]
    for title in ("Weights: conv1", "Gradients: conv1"):
        heat = figs[title]["data"][0]
        assert heat["type"] == "heatmap" and heat["x"] == steps and len(heat["z"]) == HIST_BINS
        assert sum(heat["z"][b][-1] for b in range(HIST_BINS)) == pytest.approx(1.0)  # each step's shares
    at.selectbox(key=f"run.hist_group.{r.id}").set_value("head").run()
    assert "Gradients: head" in plotly_figures(at)
    log = next(d.value for d in at.dataframe if "message" in d.value.columns)
    assert not any("histograms at step" in m for m in log["message"])  # heat maps, not log lines


def test_a_run_that_stored_only_the_matrix_gets_its_scores_from_it(page, engine):
    r = seed_run(engine, "old", epochs=1)
    repo.append_events(
        engine,
        r.id,
        [
            EventInput(
                "evaluation",
                "info",
                "epoch 1",
                data={
                    "epoch": 1,
                    "confusion": [[5, 1], [0, 6]],
                    "per_class_acc": [0.83, 1.0],
                    "class_names": ["*cat*", "dog"],
                },
            )
        ],
    )
    at = _details(page, r)
    table = next(d.value for d in at.dataframe if "precision" in d.value.columns)
    assert list(table["class"]) == ["*cat*", "dog"]  # the name as text
    assert table["precision"].tolist() == pytest.approx([100.0, 600 / 7], abs=0.01)
    assert any("most confident mistakes appear" in c.value for c in at.caption)
    assert any("histograms appear" in c.value for c in at.caption)


def test_the_page_holds_a_bounded_evenly_spaced_share_of_the_histograms():
    from datetime import datetime

    from app.ui.run_view import EventLog
    from db.types import EventRecord

    log = EventLog()
    for i in range(1, 1001):
        log.add_histogram(EventRecord(i, "r", datetime.now(), "histogram", "info", "histograms", "", {"step": i}))
    ids = [e.id for e in log.histograms]
    assert len(ids) <= EventLog.HISTOGRAMS and ids[0] == 1
    assert len({b - a for a, b in zip(ids, ids[1:])}) == 1  # one stride throughout
