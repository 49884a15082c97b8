"""The New run form guides a new user: the choices that shape it (dataset, model, transfer mode, optimizer,
schedule, clipping) come first and take effect at once; each section then shows the fields that matter for
them, labelled in words with their units, its rarely changed ones under "Advanced"; fields that do not
matter wait, with their values, under "Not used", and stay in the spec that is validated and launched."""

from __future__ import annotations

import pytest

from app.present import form_rules
from app.present.form_schema import FIELD_PATHS, FIELDS
from db import repo

MAIN, ADVANCED, UNUSED = "in its section", "under Advanced", "under Not used"


def _click(at, label: str):
    next(b for b in at.button if b.label == label).click()
    return at.run()


def _trail(block, key: str, trail: tuple[str, ...] = ()) -> tuple[str, ...] | None:
    """The labels of the expanders around the widget with `key` (outermost first), or None if it is not drawn."""
    for node in getattr(block, "children", {}).values():
        if getattr(node, "key", None) == key:
            return trail
        inner = trail + (node.label,) if getattr(node, "type", None) == "expander" else trail
        found = _trail(node, key, inner)
        if found is not None:
            return found
    return None


def where(at, path: str) -> str:
    """Where a user finds the field: in its section, under its section's Advanced, or under Not used."""
    key = f"nr.f.{path}" + (".0" if path == "optim.betas" else "")
    trail = _trail(at.main, key)
    assert trail is not None, f"{path} is not drawn at all"
    if any(t.startswith("Not used") for t in trail):
        return UNUSED
    return ADVANCED if "Advanced" in trail else MAIN


def _choose(at, path: str, value):
    at.selectbox(key=f"nr.f.{path}").set_value(value)
    return at.run()  # a choice above the form takes effect at once, without pressing a button


def test_the_synthetic_sets_fields_appear_only_when_synthetic_is_chosen(page):
    at = page("new_run.py")
    assert at.selectbox(key="nr.f.data.name").value == "digits"
    for path in ("data.num_samples", "data.noise", "data.num_classes", "data.channels", "data.path"):
        assert where(at, path) == UNUSED, path
    assert where(at, "data.image_size") == MAIN
    at = _choose(at, "data.name", "synthetic")
    for path in ("data.num_samples", "data.noise", "data.num_classes", "data.channels"):
        assert where(at, path) == MAIN, path
    assert where(at, "data.path") == UNUSED
    at = _choose(at, "data.name", "imagefolder")
    assert where(at, "data.path") == MAIN and where(at, "data.noise") == UNUSED


def test_adam_hides_momentum_and_nesterov_and_sgd_shows_them(page):
    at = page("new_run.py")
    assert at.selectbox(key="nr.f.optim.name").value == "adam"
    assert where(at, "optim.momentum") == UNUSED and where(at, "optim.nesterov") == UNUSED
    assert where(at, "optim.betas") == MAIN
    at = _choose(at, "optim.name", "sgd")
    assert where(at, "optim.momentum") == MAIN and where(at, "optim.nesterov") == MAIN
    assert where(at, "optim.betas") == UNUSED
    at = _choose(at, "optim.name", "rmsprop")
    assert where(at, "optim.momentum") == MAIN and where(at, "optim.nesterov") == UNUSED


def test_no_schedule_hides_its_settings_and_step_shows_step_size_and_gamma(page):
    at = page("new_run.py")
    assert at.selectbox(key="nr.f.schedule.name").value == "none"
    for path in ("schedule.step_size", "schedule.gamma", "schedule.milestones", "schedule.patience"):
        assert where(at, path) == UNUSED, path
    at = _choose(at, "schedule.name", "step")
    assert where(at, "schedule.step_size") == MAIN and where(at, "schedule.gamma") == MAIN
    assert where(at, "schedule.milestones") == UNUSED and where(at, "schedule.patience") == UNUSED
    assert at.number_input(key="nr.f.schedule.step_size").label == "Decay every (epochs)"
    at = _choose(at, "schedule.name", "multistep")
    assert where(at, "schedule.milestones") == MAIN and where(at, "schedule.step_size") == UNUSED


def test_clipping_off_hides_its_threshold_and_labels_are_words(page):
    at = page("new_run.py")
    assert at.selectbox(key="nr.f.train.grad_clip.mode").label == "Clip gradients by"
    assert at.number_input(key="nr.f.train.grad_clip.max").label == "Max norm"
    assert where(at, "train.grad_clip.max") == MAIN
    assert at.number_input(key="nr.f.data.image_size").label == "Input size (px)"
    at = _choose(at, "train.grad_clip.mode", "none")
    assert where(at, "train.grad_clip.max") == UNUSED
    labels = {w.label for kind in ("number_input", "selectbox", "checkbox") for w in getattr(at, kind)}
    assert not labels & {"mode", "max", "rule", "last n"}


def test_transfer_controls_appear_only_for_models_with_pretrained_weights(page):
    at = page("new_run.py")
    assert at.selectbox(key="nr.f.model.name").value == "simple_cnn"
    for path in ("model.pretrained", "model.transfer", "model.backbone_lr_mult", "model.last_n"):
        assert where(at, path) == UNUSED, path
    assert where(at, "model.hidden") == MAIN
    at = _choose(at, "model.name", "resnet18")
    for path in ("model.pretrained", "model.transfer", "model.backbone_lr_mult"):
        assert where(at, path) == MAIN, path
    assert at.number_input(key="nr.f.model.backbone_lr_mult").label == "Backbone learning-rate multiplier"
    assert where(at, "model.last_n") == UNUSED and where(at, "model.hidden") == UNUSED
    at = _choose(at, "model.transfer", "finetune_last_n")
    assert where(at, "model.last_n") == MAIN


def test_each_section_keeps_its_rarely_changed_fields_under_advanced(page):
    at = page("new_run.py")
    for path in (
        "loader.num_workers",
        "loader.pin_memory",
        "loader.device_cache_mb",
        "checkpoint.save_last",
        "deterministic",
        "compile",
        "train.detect_anomaly",
    ):
        assert where(at, path) == ADVANCED, path
    for path in ("train.epochs", "optim.lr", "device", "train.log_every", "export.formats"):
        assert where(at, path) == MAIN, path
    assert at.number_input(key="nr.f.loader.device_cache_mb").label == "Keep on the device up to (MB)"


def test_a_hidden_fields_value_stays_in_the_launched_spec(page, engine, broker):
    at = _choose(page("new_run.py"), "optim.name", "sgd")
    at.number_input(key="nr.f.optim.momentum").set_value(0.5)
    at = _choose(_click(at, "Validate"), "optim.name", "adam")
    assert where(at, "optim.momentum") == UNUSED
    assert at.number_input(key="nr.f.optim.momentum").value == pytest.approx(0.5)
    at = _choose(at, "data.name", "synthetic")
    at.number_input(key="nr.f.data.num_samples").set_value(300)
    at = _click(at, "Validate")
    assert any("Valid spec" in s.value for s in at.success)
    at = _click(_choose(at, "data.name", "digits"), "Launch run")
    assert not at.exception
    (run,) = repo.list_runs(engine).runs
    assert run.spec["optim"]["name"] == "adam" and run.spec["optim"]["momentum"] == pytest.approx(0.5)
    assert run.spec["data"]["name"] == "digits" and run.spec["data"]["num_samples"] == 300


def test_an_invalid_value_under_not_used_is_also_said_with_the_other_errors(page, engine):
    at = page("new_run.py")
    at.checkbox(key="nr.f.optim.nesterov").check()  # under Not used: Adam has no Nesterov momentum
    at = _click(at, "Validate")
    said = " ".join(e.value for e in at.error)
    assert "Nesterov momentum" in said and "Not used" in said and "nesterov needs optim.name=sgd" in said
    assert repo.list_runs(engine).total == 0


def test_a_swept_optimizer_shows_the_fields_of_every_optimizer_it_tries(page):
    at = page("new_run.py")
    at.checkbox(key="nr.sw.on.optim.name").check()
    at = _click(at, "Set up sweep")
    assert "sgd" in at.multiselect(key="nr.sw.r.optim.name.values").value
    assert where(at, "optim.momentum") == MAIN and where(at, "optim.betas") == MAIN


def test_every_field_has_a_label_in_words_and_the_rules_name_real_fields():
    assert FIELD_PATHS <= set(form_rules.LABELS), FIELD_PATHS - set(form_rules.LABELS)
    assert set(form_rules.LABELS) | set(form_rules.UNITS) <= FIELD_PATHS
    kinds = {f.path: f.kind for f in FIELDS}
    assert all(kinds[p] == "choice" for p in form_rules.CHOOSERS)
    assert set(form_rules._RULES) <= FIELD_PATHS
