"""New run guidance: `?dataset=` opens the form on that dataset; a finished run's best checkpoint can be the
weights to start from (its model, the suggested transfer settings, the new run linked to it); before Launch,
a line says which live worker takes the run and, from similar finished runs, its memory and time."""

from __future__ import annotations

import pytest
from markdown_view import shown
from seeding import seed_run

from app.present import new_run_hints
from app.services.artifacts import artifact_root
from db import repo
from db.types import MetricPoint


def _click(at, label: str):
    next(b for b in at.button if b.label == label).click()
    return at.run()


def _said(at) -> str:
    """The page's info and warning boxes, as a reader sees them."""
    return "\n".join(shown(x.value).text for x in [*at.info, *at.warning])


def _with_checkpoint(engine, name: str = "teacher", model: str = "mlp"):
    """A finished run whose best checkpoint is a file under the artifact root, registered like a worker does."""
    run = seed_run(engine, name, spec={"model": {"name": model}}, epochs=2)
    path = artifact_root() / "runs" / run.id / "checkpoints" / "best.pt"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(b"not really a state_dict")
    repo.add_artifact(engine, run.id, "checkpoint_best", path.as_uri(), size=path.stat().st_size)
    return run, path.resolve()


# --- ?dataset= ------------------------------------------------------------------------------------------
@pytest.mark.parametrize("name", ["digits", "cifar10"])
def test_a_built_in_dataset_in_the_address_is_chosen(page, name):
    at = page("new_run.py", dataset=name)
    assert not at.exception
    assert at.selectbox(key="nr.f.data.name").value == name
    assert at.selectbox(key="nr.dataset").value.startswith("— none")


def test_an_uploaded_dataset_in_the_address_is_chosen_and_an_unknown_one_is_said(page, engine, home):
    repo.create_dataset(
        engine,
        "pets <b>",
        str(home / "datasets" / "pets"),
        classes=["cat", "dog"],
        counts={"cat": 1, "dog": 1},
        status="ready",
    )
    at = page("new_run.py", dataset="pets <b>")
    assert at.selectbox(key="nr.dataset").value == "pets <b>"
    at = page("new_run.py", dataset="nowhere")
    assert any("nowhere" in w.value and "ready to train on" in w.value for w in at.warning)
    assert at.selectbox(key="nr.dataset").value.startswith("— none")


# --- start from a run's weights -------------------------------------------------------------------------
def test_a_finished_runs_weights_fill_the_form_and_link_the_new_run(page, engine, broker):
    parent, checkpoint = _with_checkpoint(engine)
    seed_run(engine, "no-checkpoint", epochs=1)  # finished, but nothing to start from
    seed_run(engine, "failed", status="failed")
    at = page("new_run.py")
    picker = at.selectbox(key="nr.weights_from")
    assert picker.options == ["teacher (mlp, completed)"]
    picker.set_value(parent.id).run()
    assert not at.exception
    assert at.text_input(key="nr.f.model.weights_file").value == str(checkpoint)
    assert at.selectbox(key="nr.f.model.name").value == "mlp"
    assert at.selectbox(key="nr.f.model.transfer").value == "feature_extract"
    assert at.number_input(key="nr.f.model.unfreeze_at_epoch").value == 2
    assert at.number_input(key="nr.f.model.backbone_lr_mult").value == pytest.approx(0.1)
    assert any("feature extraction first" in c.value and "teacher" in c.value for c in at.caption)
    at.number_input(key="nr.f.model.backbone_lr_mult").set_value(0.2)  # a suggestion: the user may change it
    at = _click(at, "Launch run")
    assert not at.exception, at.exception
    child = next(r for r in repo.list_runs(engine).runs if r.name not in ("teacher", "no-checkpoint", "failed"))
    assert child.parent_id == parent.id
    model = child.spec["model"]
    assert model["weights_file"] == str(checkpoint) and model["name"] == "mlp"
    assert model["transfer"] == "feature_extract" and model["backbone_lr_mult"] == pytest.approx(0.2)


def test_clearing_the_choice_undoes_what_it_filled(page, engine):
    parent, _ = _with_checkpoint(engine)
    at = page("new_run.py")
    at.selectbox(key="nr.weights_from").set_value(parent.id).run()
    at.selectbox(key="nr.weights_from").set_value(None).run()
    assert at.text_input(key="nr.f.model.weights_file").value == ""
    assert at.selectbox(key="nr.f.model.transfer").value == "scratch"
    assert not any("feature extraction first" in c.value for c in at.caption)


def test_a_checkpoint_only_in_an_object_store_is_offered_but_said_to_be_missing_here(page, engine):
    run = seed_run(engine, "remote", epochs=1)
    repo.add_artifact(engine, run.id, "checkpoint_best", f"s3://bucket/runs/{run.id}/checkpoints/best.pt", size=3)
    at = page("new_run.py")
    assert at.selectbox(key="nr.weights_from").options == ["remote (simple_cnn, completed) — not on this host"]
    at.selectbox(key="nr.weights_from").set_value(run.id).run()
    assert any("must be on this host" in w.value for w in at.warning)
    assert at.text_input(key="nr.f.model.weights_file").value == ""


def test_checkpoint_path_stays_under_the_artifact_root(tmp_path):
    root = tmp_path / "artifacts"
    inside = root / "runs" / "r1" / "checkpoints" / "best.pt"
    inside.parent.mkdir(parents=True)
    inside.write_bytes(b"x")
    outside = tmp_path / "secret.pt"
    outside.write_bytes(b"x")
    assert new_run_hints.checkpoint_path(inside.as_uri(), "r1", root) == inside.resolve()
    assert new_run_hints.checkpoint_path(outside.as_uri(), "r2", root) is None
    assert new_run_hints.checkpoint_path(outside.as_uri(), "r1", root) == inside.resolve()  # the run's own copy
    assert new_run_hints.checkpoint_path("s3://b/runs/r1/checkpoints/best.pt", "r1", root) == inside.resolve()


# --- before Launch --------------------------------------------------------------------------------------
def test_the_hints_name_the_live_worker_of_the_queue_or_say_none_serves_it(page, engine):
    at = page("new_run.py")
    assert "no live worker serves the 'gpu' queue" in _said(at)
    repo.upsert_worker(engine, "cpu@hostA", hostname="hostA", queues=["cpu", "jobs"])
    at.selectbox(key="nr.f.device").set_value("cpu")
    at = _click(at, "Validate")
    assert "Workers: 1 live worker serves 'cpu' (cpu@hostA)" in _said(at)


def test_a_similar_finished_run_gives_the_time_and_memory(page, engine):
    at = page("new_run.py")
    assert "Time:" not in _said(at) and "Memory:" not in _said(at)
    prev = seed_run(engine, "prev", epochs=3)  # digits, simple_cnn: 12.5 s for 3 epochs
    repo.append_metrics(engine, prev.id, [MetricPoint("mem/peak_mb", 3, 321.0, 3)])
    seed_run(engine, "other-model", spec={"model": {"name": "mlp"}}, epochs=1)  # not similar: another model
    at = page("new_run.py")
    at.number_input(key="nr.f.train.epochs").set_value(6)
    at = _click(at, "Validate")
    said = _said(at)
    assert "Time: ≈ 0.4 min at 4.2 s/epoch as in 1 similar finished run(s)" in said
    assert "Memory: ≈ 321 MB (from prev's peak)" in said
