"""New run: the form mirrors the schema, shows each invalid field's error beside it, fills from
presets, YAML and clones, and launching stores a queued run whose message lands in Redis."""

from __future__ import annotations

import json

import pytest
from seeding import error_beside, seed_run, widget

from app.present.form_schema import FIELDS
from db import repo


def _click(at, label: str):
    next(b for b in at.button if b.label == label).click()
    return at.run()


def test_every_schema_field_has_a_widget_with_its_default_and_help(page):
    at = page("new_run.py")
    assert not at.exception
    for f in FIELDS:
        if f.kind == "pair":  # optim.betas, data.augment.rrc_scale, ...
            assert widget(at, f"nr.f.{f.path}.0").value == pytest.approx(f.default[0]), f.path
            assert widget(at, f"nr.f.{f.path}.1").value == pytest.approx(f.default[1]), f.path
            continue
        w = widget(at, f"nr.f.{f.path}")
        assert w.help and f.help[:30] in w.help, f.path
        if f.kind in ("int", "float", "bool", "choice"):
            assert w.value == f.default, f.path
    titles = [m.value for m in at.markdown]
    for group in (
        "Data",
        "Model & transfer learning",
        "Optimization",
        "Schedule",
        "Precision & stability",
        "Early stopping",
        "Checkpoints & export",
        "Resources",
    ):
        assert f"**{group}**" in titles


def test_invalid_fields_show_their_errors_beside_them_and_nothing_is_queued(page, engine):
    at = page("new_run.py")
    at.number_input(key="nr.f.train.grad_clip.max").set_value(0.0)
    at.selectbox(key="nr.f.data.name").set_value("imagefolder")  # needs data.path
    at.checkbox(key="nr.f.optim.nesterov").check()  # needs sgd
    at.text_input(key="nr.f.schedule.milestones").input("3, x")
    at = _click(at, "Launch run")
    assert "greater than 0" in error_beside(at, "nr.f.train.grad_clip.max")
    assert "data.path is required" in error_beside(at, "nr.f.data.path")
    assert "nesterov needs optim.name=sgd" in error_beside(at, "nr.f.optim.nesterov")
    assert "whole numbers" in error_beside(at, "nr.f.schedule.milestones")
    assert error_beside(at, "nr.f.train.epochs") is None
    assert any("problem(s)" in e.value for e in at.error)
    assert repo.list_runs(engine).total == 0


def test_launch_stores_a_queued_run_enqueues_it_and_opens_its_page(page, engine, broker):
    at = page("new_run.py")
    at.text_input(key="nr.f.name").input("form-run")
    at.number_input(key="nr.f.train.epochs").set_value(2)
    at.multiselect(key="nr.f.export.formats").set_value(["onnx"])
    at.text_input(key="nr.tags").input("ui, smoke")
    at = _click(at, "Launch run")
    assert not at.exception
    runs = repo.list_runs(engine).runs
    assert [r.name for r in runs] == ["form-run"]
    run = runs[0]
    assert run.status == "queued" and set(run.tags) == {"ui", "smoke"}
    assert run.spec["train"]["epochs"] == 2 and run.spec["export"]["formats"] == ["onnx"]
    messages = broker.lrange("gpu", 0, -1)  # device auto → the gpu queue (a CPU run never waits for a GPU)
    assert len(messages) == 1
    headers = json.loads(messages[0])["headers"]
    assert headers["task"] == "torchdeck.execute_run" and run.id in headers["argsrepr"]
    assert at.title[0].value == "form-run"  # the run's own page


def test_launch_without_a_broker_says_so(page, engine):
    at = _click(page("new_run.py"), "Launch run")
    assert any("broker is unreachable" in e.value for e in at.error)


def test_preset_fills_the_form(page):
    at = page("new_run.py")
    at.selectbox(key="nr.preset").set_value("digits_simple_cnn").run()
    at = _click(at, "Load preset")
    assert at.number_input(key="nr.f.optim.lr").value == pytest.approx(0.003)
    assert at.number_input(key="nr.f.data.image_size").value == 16
    assert at.selectbox(key="nr.f.schedule.name").value == "cosine"
    assert any("preset digits_simple_cnn" in i.value for i in at.info)


def test_yaml_upload_fills_the_form_and_a_bad_one_names_the_fields(page):
    at = page("new_run.py")
    at.file_uploader(key="nr.upload").upload("spec.yaml", b"optim: {name: sgd, lr: 0.05}\ntrain: {epochs: 7}\n")
    at.run()
    assert at.number_input(key="nr.f.optim.lr").value == pytest.approx(0.05)
    assert at.number_input(key="nr.f.train.epochs").value == 7
    assert at.selectbox(key="nr.f.optim.name").value == "sgd"
    at = page("new_run.py")
    at.file_uploader(key="nr.upload").upload("bad.yaml", b"optim: {lr: -1, nme: adam}\n")
    at.run()
    errors = " ".join(e.value for e in at.error)
    assert "optim.lr" in errors and "optim.nme" in errors and "unknown key" in errors


def test_valid_spec_can_be_downloaded_as_yaml(page):
    at = _click(page("new_run.py"), "Validate")
    assert any("Valid spec" in s.value for s in at.success)
    assert any(b.label == "Download spec as YAML" for b in at.get("download_button"))


def test_clone_prefills_from_the_run_and_links_the_new_run_to_it(page, engine, broker):
    parent = seed_run(engine, "sweep-a", lr=0.02, tags=("sweep",))
    at = page("new_run.py", clone=parent.id)
    assert at.number_input(key="nr.f.optim.lr").value == pytest.approx(0.02)
    assert at.text_input(key="nr.f.name").value == "sweep-a (clone)"
    assert any(parent.id in i.value for i in at.info)
    at.number_input(key="nr.f.optim.lr").set_value(0.005)
    at = _click(at, "Launch run")
    child = next(r for r in repo.list_runs(engine).runs if r.id != parent.id)
    assert child.parent_id == parent.id and child.spec["optim"]["lr"] == pytest.approx(0.005)
    assert child.tags == ("sweep",)


def test_preflight_runs_the_shape_check_the_overfit_check_and_shows_the_labelled_grid(page, jobs_worker):
    """Real pre-flight on a real jobs worker (torch stays out of the UI): digits data, the reference CNN."""
    at = page("new_run.py", timeout=240)
    at.number_input(key="nr.f.data.image_size").set_value(16)
    at.selectbox(key="nr.f.device").set_value("cpu")
    assert at.checkbox(key="nr.overfit").value  # overfit-one-batch is on by default
    at = _click(at, "Pre-flight check")
    assert any("Shape check passed" in s.value and "[10]" in s.value for s in at.success), [e.value for e in at.error]
    assert len(at.image) == 1
    verdicts = [m.value for m in [*at.success, *at.warning] if m.value.startswith("Overfit one batch")]
    assert len(verdicts) == 1 and "from " in verdicts[0] and " steps" in verdicts[0], verdicts
    at.checkbox(key="nr.overfit").uncheck()
    at = _click(at, "Pre-flight check")
    assert any("Shape check passed" in s.value for s in at.success)
    assert not [m.value for m in [*at.success, *at.warning, *at.info] if m.value.startswith("Overfit one batch")]


def test_a_clone_left_unlaunched_does_not_leak_into_the_next_form(page, engine, broker):
    parent = seed_run(engine, "sweep-a", lr=0.02)
    at = page("new_run.py", clone=parent.id)
    assert at.number_input(key="nr.f.optim.lr").value == pytest.approx(0.02)
    at = _click(at, "Validate")  # reruns keep the clone's values
    assert at.number_input(key="nr.f.optim.lr").value == pytest.approx(0.02)
    at.switch_page("app_pages/runs.py").run()
    at.switch_page("app_pages/new_run.py").run()
    assert at.number_input(key="nr.f.optim.lr").value == pytest.approx(0.001) and not at.info
    _click(at, "Launch run")
    fresh = next(r for r in repo.list_runs(engine).runs if r.id != parent.id)
    assert fresh.parent_id is None
