"""The Run page says which preprocessing the run used (its Spec tab): whose it was, the resize, the centre crop,
the interpolation and the mean/std, from the run's `data` event; a run that has not loaded its data yet says so."""

from __future__ import annotations

from seeding import seed_run

from db import repo
from db.types import EventInput

RECORD = {
    "source": "weights",
    "weights": "torchvision mobilenet_v3_small IMAGENET1K_V1",
    "image_size": 224,
    "resize": 256,
    "crop": "centre",
    "interpolation": "bilinear",
    "mean": [0.485, 0.456, 0.406],
    "std": [0.229, 0.224, 0.225],
    "stats_from": "weights",
    "overridden": ["data.preprocess.interpolation"],
}


def _spec_tab(page, run_id: str):
    at = page("run.py", id=run_id)
    at.session_state["run.tab"] = "Spec"
    return at.run()


def _text(at) -> str:
    return " ".join(m.value for m in [*at.markdown, *at.caption]).replace("\\", "")  # Markdown escapes aside


def test_the_spec_tab_names_the_weights_preprocessing(page, engine):
    r = seed_run(engine, "pretrained", steps=10, epochs=1)
    data = {"code": "data", "name": "imagefolder", "image_size": 224, "preprocessing": RECORD}
    repo.append_events(engine, r.id, [EventInput("lifecycle", "info", "data imagefolder", code="data", data=data)])
    at = _spec_tab(page, r.id)
    assert not at.exception
    text = _text(at)
    assert "the pretrained weights' (torchvision mobilenet_v3_small IMAGENET1K_V1)" in text
    assert "shorter side resized to 256 px (bilinear), centre crop 224×224" in text
    assert "mean (0.485, 0.456, 0.406), std (0.229, 0.224, 0.225)" in text
    assert "overridden by data.preprocess.interpolation" in text


def test_a_run_before_its_data_loaded_and_an_old_run_say_so(page, engine):
    waiting = seed_run(engine, "waiting", status="running", steps=0)
    assert "known once the run has loaded its data" in _text(_spec_tab(page, waiting.id))
    old = seed_run(engine, "old", steps=10, epochs=1)
    repo.append_events(engine, old.id, [EventInput("lifecycle", "info", "data digits", code="data", data={})])
    assert "not recorded" in _text(_spec_tab(page, old.id))
