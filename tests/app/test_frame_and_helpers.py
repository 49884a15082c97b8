"""The shared frame (schema check, navigation), the no-torch rule at run time, and the plain helpers
behind the pages: schema walking, error placement, smoothing, step→epoch/time mapping."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from streamlit.testing.v1 import AppTest

from app.present import figures, form_schema
from core.config import RunSpec

ROOT = Path(__file__).resolve().parents[2]


def test_out_of_date_schema_is_refused_with_the_command_to_fix_it(tmp_path, monkeypatch):
    monkeypatch.setenv("TORCHDECK_HOME", str(tmp_path))
    monkeypatch.setenv("TORCHDECK_DATABASE_URL", f"sqlite:///{tmp_path / 'empty.db'}")  # never migrated
    at = AppTest.from_file(str(ROOT / "app" / "main.py"), default_timeout=30).run()
    assert any("schema revision" in e.value for e in at.error)
    assert any(c.value == "torchdeck db upgrade" for c in at.code)
    assert not at.title  # no page is drawn over a database it does not understand


def test_sidebar_shows_activity_and_where_data_lives(page, engine):
    at = page("runs.py")
    captions = " ".join(c.value for c in at.sidebar.caption)
    assert "0 running · 0 queued" in captions and "torchdeck.db" in captions


def test_every_page_opens_and_every_link_a_page_draws_leads_to_one(page, engine, home):
    """Each page file is in the navigation (app/ui/frame.py's PAGES) and opens; the Artifact page, reached by link
    only (an artifact's download), is kept out of it. The links the pages draw (st.page_link, and Markdown links
    such as a run's lineage) each lead to a page of the dashboard: a renamed or moved page breaks none of them."""
    from seeding import seed_run

    from app.ui import frame
    from db import repo

    files = sorted(p.name for p in (ROOT / "app" / "app_pages").glob("*.py"))
    assert sorted(p.path.rsplit("/", 1)[1] for p in frame.PAGES) == files
    assert [p.title for p in frame.PAGES if p.hidden] == ["Artifact"]
    at = page("runs.py")
    for p in frame.PAGES:
        at.switch_page(p.path)
        assert not at.run().exception, p.path
    parent = seed_run(engine, "parent", epochs=1)
    seeds = repo.create_runs(
        engine, [(parent.spec, "seed-1"), (parent.spec, "seed-2")], parent_id=parent.id, group_id=repo.new_group_id()
    )
    export = home / "artifacts" / "runs" / parent.id / "export"
    export.mkdir(parents=True)
    (export / "model.onnx").write_bytes(b"onnx-bytes")
    repo.add_artifact(engine, parent.id, "onnx", (export / "model.onnx").as_uri(), size=10)
    shown = [page("run.py", id=parent.id), page("run.py", id=seeds[0].id), page("run.py", id="no-such-run")]
    shown += [page("sweep.py")]
    files_tab = page("run.py", id=parent.id)
    files_tab.session_state["run.tab"] = "Artifacts"
    shown.append(files_tab.run())
    links = [(at, target) for at in shown for target in _links(at)]
    pages = {p.url_path: p for p in frame.PAGES} | {"": next(p for p in frame.PAGES if p.default)}  # "": the home
    assert all(target in pages for _, target in links), [target for _, target in links]
    assert {"Run", "Compare", "Runs", "New run", "Artifact"} <= {pages[target].title for _, target in links}
    for at, target in links:
        at.switch_page(pages[target].path)
        assert not at.run().exception, target


def _links(at) -> list[str]:
    """The pages a page's links lead to: each st.page_link's, and each relative Markdown link's first path part
    (`run?id=…` → run)."""
    import re

    found = [link.proto.page for link in at.get("page_link")]
    for kind in ("markdown", "caption", "info", "warning", "success", "error"):
        for element in at.get(kind):
            found += [t.split("?")[0] for t in re.findall(r"\]\(([^)\s]+)\)", element.value or "") if "://" not in t]
    return found


def test_the_dashboard_modules_load_without_torch():
    code = (
        "import sys, runpy; sys.argv=['x'];"
        "import app.ui.queries, app.ui.spec_form, app.ui.run_charts, app.ui.run_view, app.ui.run_files,"
        " app.ui.compare_view, app.ui.new_sweep,"
        " app.ui.frame, app.services.jobs, app.services.datasets, app.services.runs, app.present.figures,"
        " app.present.form_schema;"
        "sys.exit(1 if 'torch' in sys.modules else 0)"
    )
    r = subprocess.run([sys.executable, "-c", code], check=False, cwd=ROOT, capture_output=True, text=True)
    assert r.returncode == 0, "torch was imported by the dashboard: " + r.stderr[-2000:]


def test_form_covers_every_leaf_of_the_schema_in_a_named_group():
    def leaves(model, prefix=""):
        for name, info in model.model_fields.items():
            ann = info.annotation
            if isinstance(ann, type) and hasattr(ann, "model_fields"):
                yield from leaves(ann, f"{prefix}{name}.")
            else:
                yield f"{prefix}{name}"

    assert [f.path for f in form_schema.FIELDS] == list(leaves(RunSpec))
    assert {f.group for f in form_schema.FIELDS} == {"Run", *form_schema.GROUPS}
    assert form_schema.group_of("train.early_stopping.patience") == "Early stopping"
    assert form_schema.group_of("train.precision") == "Precision & stability"


@pytest.mark.parametrize(
    "loc, message, field",
    [
        ("optim.lr", "Input should be greater than 0", "optim.lr"),
        ("optim.betas.1", "Input should be less than 1", "optim.betas"),
        ("data", "data.path is required for imagefolder: ...", "data.path"),
        ("model", "model.transfer=feature_extract freezes layers ...", "model.transfer"),
        ("(root)", "train.precision=fp16 needs a CUDA device", "train.precision"),
        ("(root)", "something about nothing", None),
    ],
)
def test_errors_are_placed_beside_the_field_they_concern(loc, message, field):
    assert form_schema.field_for_error(loc, message) == field


def test_smoothing_is_debiased_and_keeps_nans():
    assert figures.smooth([1.0, 1.0, 1.0], 0.9) == pytest.approx([1.0, 1.0, 1.0])
    out = figures.smooth([0.0, float("nan"), 10.0], 0.5)
    assert out[0] == 0.0 and out[1] != out[1] and out[2] == pytest.approx(20 / 3)


def test_steps_map_onto_epochs_and_seconds():
    anchors = [(1, 0, 100.0), (50, 1, 110.0), (100, 2, 120.0)]  # (step, epoch end or 0, wall time)
    to_epoch = figures.step_mapper(anchors, "epoch", 99.0)
    assert to_epoch([25, 50, 100, 150]) == pytest.approx([0.5, 1.0, 2.0, 3.0])
    to_time = figures.step_mapper(anchors, "time", 99.0)
    assert to_time([1, 50, 100, 150]) == pytest.approx([1.0, 11.0, 21.0, 31.0])
