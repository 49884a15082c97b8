"""Package boundaries, checked by import-linter (pyproject.toml's contracts, transitive imports and torch
included): core stands alone; db knows of core only the schema and the shared names; worker never imports
app; app never imports worker or torch, but for the CLI's `train` and `export`, which import core lazily."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
LINT = str(Path(sys.executable).parent / "lint-imports")
PACKAGES = ("core", "db", "worker", "app")


def test_import_linter_contracts_hold():
    r = subprocess.run([LINT], cwd=ROOT, capture_output=True, text=True)
    assert r.returncode == 0, r.stdout + r.stderr


@pytest.mark.parametrize(
    "module, line, contract",
    [
        ("worker/spill.py", "from app import services", "worker never imports app"),
        ("app/present/text.py", "import torch", "app never imports worker"),
        ("app/services/runs.py", "from worker.reaper import reap", "app never imports worker"),
        ("db/records.py", "from core.train import run_training", "db imports neither worker nor app"),
        ("core/names.py", "import torch", "torch-free modules"),
    ],
)
def test_a_crossed_boundary_fails_the_contracts(tmp_path, module, line, contract):
    """The contracts are not decoration: the same tree with one forbidden import breaks the named one."""
    for package in PACKAGES:
        shutil.copytree(ROOT / package, tmp_path / package, ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy(ROOT / "pyproject.toml", tmp_path / "pyproject.toml")
    with open(tmp_path / module, "a") as f:
        f.write(f"\n{line}  # a deliberate violation\n")
    r = subprocess.run(
        [LINT], cwd=tmp_path, capture_output=True, text=True, env={"PYTHONPATH": str(tmp_path), "PATH": "/usr/bin:/bin"}
    )
    assert r.returncode != 0 and "Broken contracts" in r.stdout, r.stdout + r.stderr
    assert contract in r.stdout.split("Broken contracts", 1)[1], r.stdout


def test_dashboard_and_cli_modules_load_without_torch():
    """The dashboard validates specs and parses the CLI without paying torch's import time."""
    code = (
        "import sys, app.cli, app.services.runs, app.services.broker, app.services.artifacts, app.services.owners, "
        "app.services.jobs, app.services.datasets, app.present.form_schema, app.present.figures, core.config, "
        "core.spec_sections, core.events;"
        "sys.exit(1 if 'torch' in sys.modules else 0)"
    )
    r = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True)
    assert r.returncode == 0, "torch was imported: " + r.stderr
