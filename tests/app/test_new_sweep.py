"""New sweep, from the New run form: a sweep box beside each numeric and choice field; ticked, the field's
widget gives way to a range; the Sweep section shows the number of trials and the compute estimate, puts
each error beside its field, and launches the sweep (its first trials land in Redis) with a link to its
page; a sweep YAML fills the form. Launch run refuses while a field is swept."""

from __future__ import annotations

import json

import pytest
import yaml
from seeding import error_beside, seed_run, widget

from db import repo
from sweep import control

LR = "nr.sw.on.optim.lr"


def _click(at, label: str):
    next(b for b in at.button if b.label == label).click()
    return at.run()


def _sweep_lr(page):
    at = page("new_run.py")
    at.checkbox(key=LR).check()
    return _click(at, "Set up sweep")


def test_numeric_and_choice_fields_have_a_sweep_box_and_the_others_do_not(page):
    at = page("new_run.py")
    for path in ("optim.lr", "train.epochs", "model.name", "optim.nesterov", "loader.pin_memory"):
        assert at.checkbox(key=f"nr.sw.on.{path}").label == "sweep", path
    for path in ("name", "seed", "data.path", "export.formats", "optim.betas", "schedule.milestones"):
        with pytest.raises(KeyError):
            at.checkbox(key=f"nr.sw.on.{path}")
    assert any("tick **sweep** beside it" in c.value for c in at.caption)
    assert not any(b.label == "Launch sweep" for b in at.button)


def test_a_swept_field_shows_a_range_and_the_sweep_its_trials_and_estimate(page, engine):
    seed_run(engine, "earlier", epochs=5)  # digits + simple_cnn like the form's defaults: 12.5 s for 5 epochs
    at = _sweep_lr(page)
    assert not at.exception
    with pytest.raises(KeyError):
        at.number_input(key="nr.f.optim.lr")  # the single value gives way to the range
    assert at.number_input(key="nr.sw.r.optim.lr.low").value == pytest.approx(1e-4)
    assert at.number_input(key="nr.sw.r.optim.lr.high").value == pytest.approx(1e-2)
    assert at.selectbox(key="nr.sw.r.optim.lr.scale").value == "log"
    estimate = " ".join(i.value for i in at.info)
    assert "3 trials × 1 seed" in estimate and "at most 30 epochs" in estimate
    assert "2.5 s per epoch as in 1 similar finished run" in estimate and "1.2 worker-minutes" in estimate
    at.selectbox(key="nr.sw.method").set_value("random")
    at.number_input(key="nr.sw.budget.trials").set_value(8)
    at.number_input(key="nr.sw.seeds").set_value(2)
    at = _click(at, "Check sweep")
    assert any("8 trials × 2 seed" in i.value and "16 runs" in i.value for i in at.info)
    assert any(d.proto.label == "Download sweep as YAML" for d in at.get("download_button"))
    at.checkbox(key=LR).uncheck()
    at = _click(at, "Validate")  # unticked: the field's own value is back, unchanged
    assert at.number_input(key="nr.f.optim.lr").value == pytest.approx(0.001)


def test_launch_sweep_stores_it_queues_its_first_trials_and_links_to_its_page(page, engine, broker):
    at = _sweep_lr(page)
    at.text_input(key="nr.f.name").input("form-sweep")
    at.text_input(key="nr.tags").input("lr-study, team-a")
    at.number_input(key="nr.sw.budget.parallel").set_value(2)
    at = _click(at, "Launch sweep")
    assert not at.exception
    assert any("form-sweep" in s.value and "3 trials, the first 2 queued" in s.value for s in at.success)
    (sweep,) = repo.list_sweeps(engine)
    assert sweep.name == "form-sweep" and sweep.status == "running"
    spec = control.spec_of(sweep)
    assert spec.method == "grid" and spec.space["optim.lr"].loguniform == (1e-4, 1e-2)
    runs = repo.sweep_runs(engine, sweep.id)
    assert len(runs) == 2 and all(r.status == "queued" for r in runs)
    assert all(set(r.tags) == {"lr-study", "team-a"} for r in runs)  # the form's tags on every trial
    assert {r.spec["optim"]["lr"] for r in runs} <= {1e-4, 1e-3, 1e-2}
    messages = [json.loads(m)["headers"] for m in broker.lrange("gpu", 0, -1)]
    assert sorted(h["argsrepr"] for h in messages) == sorted(f"['{r.id}']" for r in runs)
    link = next(p for p in at.get("page_link") if p.proto.label == "Open the sweep")
    assert link.proto.page == "sweep" and link.proto.query_string == f"id={sweep.id}"
    at.switch_page("app_pages/sweep.py")
    at.query_params["id"] = sweep.id
    at.run()
    assert at.title[0].value == "form-sweep" and any("0/3" in m.value and "2 queued" in m.value for m in at.markdown)
    assert list(next(d for d in at.dataframe if "why pruned" in d.value.columns).value["status"]) == ["queued"] * 2
    assert any("The charts appear with the first trial's first epoch" in c.value for c in at.caption)


def test_the_sweep_errors_show_beside_their_fields_and_nothing_is_stored(page, engine):
    at = _sweep_lr(page)
    at.number_input(key="nr.sw.r.optim.lr.low").set_value(-1.0)
    at.number_input(key="nr.sw.budget.trials").set_value(2)
    at.selectbox(key="nr.sw.pruner.kind").set_value("asha")
    at.number_input(key="nr.f.train.epochs").set_value(1)
    at = _click(at, "Launch sweep")
    assert "loguniform needs low > 0" in error_beside(at, "nr.sw.r.optim.lr.values").replace("\\", "")
    at.number_input(key="nr.sw.r.optim.lr.low").set_value(1e-4)
    at = _click(at, "Launch sweep")
    assert "the grid has 3 configurations" in error_beside(at, "nr.sw.budget.trials")
    at.number_input(key="nr.sw.budget.trials").set_value(3)
    at = _click(at, "Launch sweep")
    assert "needs base.train.epochs ≥ 2" in error_beside(at, "nr.sw.pruner.kind")
    assert any("The sweep has 1 problem(s)" in e.value for e in at.error)
    assert repo.list_sweeps(engine) == [] and repo.list_runs(engine).total == 0


def test_launch_run_refuses_while_a_field_is_swept(page, engine):
    at = page("new_run.py")
    at.checkbox(key=LR).check()
    at = _click(at, "Launch run")  # ticked, never set up: still not a single run
    assert any("Set to sweep: `optim.lr`" in e.value and "Launch sweep" in e.value for e in at.error)
    assert repo.list_runs(engine).total == 0
    assert widget(at, "nr.sw.r.optim.lr.low") is not None  # and the range is there to set it up


SWEEP_YAML = """
name: yaml-sweep
base: {data: {name: digits, image_size: 16}, model: {name: mlp}, train: {epochs: 4}, device: cpu}
space:
  optim.lr: {loguniform: [1.0e-4, 1.0e-1], num: 4}
  optim.name: {choice: [adam, sgd]}
  train.batch_size: {choice: [32, 64]}
method: random
budget: {trials: 5, parallel: 2}
pruner: {kind: asha, reduction_factor: 2}
seeds: 2
"""


def test_a_sweep_yaml_fills_the_form_and_launches_as_written(page, engine):
    at = page("new_run.py")
    at.text_area(key="nr.sw.paste").input(SWEEP_YAML)
    at = _click(at, "Fill the form from the pasted sweep")
    assert any("Form filled from a pasted sweep" in i.value for i in at.info)
    assert at.text_input(key="nr.f.name").value == "yaml-sweep" and at.number_input(key="nr.f.train.epochs").value == 4
    assert at.number_input(key="nr.sw.r.optim.lr.high").value == pytest.approx(0.1)
    assert at.multiselect(key="nr.sw.r.optim.name.values").value == ["adam", "sgd"]
    assert at.text_input(key="nr.sw.r.train.batch_size.values").value == "32, 64"
    assert at.selectbox(key="nr.sw.method").value == "random" and at.number_input(key="nr.sw.seeds").value == 2
    assert any("5 trials × 2 seed" in i.value for i in at.info)
    _click(at, "Launch sweep")
    stored = control.spec_of(repo.list_sweeps(engine)[0])
    wanted = yaml.safe_load(SWEEP_YAML)
    assert {p: v.model_dump(mode="json", by_alias=True, exclude_none=True) for p, v in stored.space.items()} == wanted[
        "space"
    ]
    assert (stored.method, stored.budget.trials, stored.budget.parallel, stored.seeds) == ("random", 5, 2, 2)
    assert (stored.pruner.kind, stored.pruner.reduction_factor, stored.base.model.name) == ("asha", 2, "mlp")


def test_a_bad_sweep_yaml_names_its_fields(page):
    at = page("new_run.py")
    at.file_uploader(key="nr.sw.upload").upload("bad.yaml", b"space: {optim.lrr: {choice: [1]}}\nmethod: bayes\n")
    at.run()
    errors = " ".join(e.value for e in at.error)
    assert "method: Input should be 'grid', 'random' or 'tpe'" in errors
    at.file_uploader(key="nr.sw.upload").upload("bad2.yaml", b"space: {optim.lrr: {choice: [1]}}\n")
    errors = " ".join(e.value for e in at.run().error).replace("\\", "")
    assert "space.optim.lrr: unknown field; known fields: data.val_fraction" in errors
    assert not at.checkbox(key=LR).value


STEPPED = (
    "base: {{data: {{name: digits}}}}\n"
    "space: {{optim.momentum: {{uniform: [0.0, 0.9], step: {step}}}}}\n"
    "method: {method}\n"
)


def test_a_random_sweeps_stepped_range_fills_the_form_as_its_range_not_its_values(page):
    """The form's sweep filler listed every value of a stepped range, even for random and TPE (10^12 values for
    step 1e-12): a range with more values than the form lists (200) is now shown as its range."""
    at = page("new_run.py")
    at.text_area(key="nr.sw.paste").input(STEPPED.format(step="1.0e-5", method="random"))
    at = _click(at, "Fill the form from the pasted sweep")
    assert not at.exception
    assert at.text_input(key="nr.sw.r.optim.momentum.values").value == ""
    assert (
        at.number_input(key="nr.sw.r.optim.momentum.low").value,
        at.number_input(key="nr.sw.r.optim.momentum.high").value,
    ) == (0.0, pytest.approx(0.9))
    assert any("90,001 values, more than the form lists" in w.value for w in at.warning)
    at.text_area(key="nr.sw.paste").input(STEPPED.format(step="0.3", method="tpe"))  # a few values: listed
    at = _click(at, "Fill the form from the pasted sweep")
    assert at.text_input(key="nr.sw.r.optim.momentum.values").value == "0, 0.3, 0.6, 0.9"


def test_the_forms_sweep_filler_never_builds_a_random_or_tpe_grid():
    from tests._bounded import run_bounded

    found = run_bounded(f"""
        import logging
        logging.disable(logging.WARNING)
        from app.ui import sweep_fields
        from sweep.spec import SweepSpec
        CAP
        out = {{}}
        text = {STEPPED.format(step="1.0e-12", method="METHOD")!r}
        for method in ("random", "tpe"):
            spec = SweepSpec.from_yaml(text.replace("METHOD", method))
            out[method] = measure(lambda: sweep_fields._parts_of(sweep_fields.BY_PATH["optim.momentum"],
                                                                spec.space["optim.momentum"], spec.method))
        print(json.dumps(out))
    """)
    for method, result in found.items():
        parts, note = result["value"]
        assert parts["values"] == "" and "900,000,000,001 values" in note, (method, result)
        assert result["peak"] < 50 * 2**20, (method, result["peak"])
