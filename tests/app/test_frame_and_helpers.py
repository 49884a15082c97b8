"""The shared frame (schema check, navigation), the no-torch rule at run time, and the plain helpers
behind the pages: schema walking, error placement, smoothing, step→epoch/time mapping."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from streamlit.testing.v1 import AppTest

from app.present import figures as charts
from app.present import form_schema as schema
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


def test_each_page_is_defined_once_and_every_link_opens_it(page, engine):
    """A page's file is named in one place (app/ui/frame.py's PAGES): the navigation, the links and the switches
    read it; each page opens from it; a page reached by link only (an artifact's download) is kept out of the
    navigation."""
    import re

    from app.ui import frame

    files = sorted(p.name for p in (ROOT / "app" / "app_pages").glob("*.py"))
    assert sorted(p.path.rsplit("/", 1)[1] for p in frame.PAGES) == files
    for name in files:
        written = [
            str(f.relative_to(ROOT))
            for f in (ROOT / "app").rglob("*.py")
            for _ in re.finditer(rf"app_pages/{re.escape(name)}\b", f.read_text())
        ]
        assert written == ["app/ui/frame.py"], (name, written)
    assert [p.title for p in frame.PAGES if p.hidden] == ["Artifact"]
    at = page("runs.py")
    for p in frame.PAGES:
        at.switch_page(p.path)
        assert not at.run().exception, p.path
    code = (
        "import sys, runpy; sys.argv=['x'];"
        "import app.ui.queries, app.ui.spec_form, app.ui.run_charts, app.ui.run_view, app.ui.compare_view,"
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

    assert [f.path for f in schema.FIELDS] == list(leaves(RunSpec))
    assert {f.group for f in schema.FIELDS} == {"Run", *schema.GROUPS}
    assert schema.group_of("train.early_stopping.patience") == "Early stopping"
    assert schema.group_of("train.precision") == "Precision & stability"


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
    assert schema.field_for_error(loc, message) == field


def test_smoothing_is_debiased_and_keeps_nans():
    assert charts.smooth([1.0, 1.0, 1.0], 0.9) == pytest.approx([1.0, 1.0, 1.0])
    out = charts.smooth([0.0, float("nan"), 10.0], 0.5)
    assert out[0] == 0.0 and out[1] != out[1] and out[2] == pytest.approx(20 / 3)


def test_steps_map_onto_epochs_and_seconds():
    anchors = [(1, 0, 100.0), (50, 1, 110.0), (100, 2, 120.0)]  # (step, epoch end or 0, wall time)
    to_epoch = charts.step_mapper(anchors, "epoch", 99.0)
    assert to_epoch([25, 50, 100, 150]) == pytest.approx([0.5, 1.0, 2.0, 3.0])
    to_time = charts.step_mapper(anchors, "time", 99.0)
    assert to_time([1, 50, 100, 150]) == pytest.approx([1.0, 11.0, 21.0, 31.0])
