"""Package boundaries (DESIGN.md): core stands alone, config and the UI never import torch."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def _imports(path: Path) -> list[tuple[int, str]]:
    """Every imported module name in a file, at any depth (lazy imports included)."""
    out = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            out += [(node.lineno, a.name) for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            out.append((node.lineno, node.module))
    return out


def _violations(package: str, forbidden: tuple[str, ...], module_level_only: bool = False) -> list[str]:
    bad = []
    for f in sorted((ROOT / package).rglob("*.py")):
        tree = ast.parse(f.read_text())
        nodes = tree.body if module_level_only else list(ast.walk(tree))
        for node in nodes:
            names = []
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                names = [node.module]
            for n in names:
                if n.split(".")[0] in forbidden:
                    bad.append(f"{f.relative_to(ROOT)}:{node.lineno} imports {n}")
    return bad


def test_core_never_imports_db_worker_or_app():
    assert _violations("core", ("db", "worker", "app")) == []


def test_db_never_imports_worker_or_app():
    if not (ROOT / "db").is_dir():
        pytest.fail("db/ package missing")
    assert _violations("db", ("worker", "app")) == []


def test_config_does_not_import_torch():
    assert [n for _, n in _imports(ROOT / "core" / "config.py") if n.split(".")[0] in ("torch", "torchvision")] == []


def test_app_never_imports_torch_directly():
    assert _violations("app", ("torch", "torchvision")) == []


def test_import_linter_contracts_hold():
    r = subprocess.run([str(Path(sys.executable).parent / "lint-imports")], cwd=ROOT, capture_output=True, text=True)
    assert r.returncode == 0, r.stdout + r.stderr


def test_ui_side_modules_load_without_torch():
    """The dashboard validates specs and parses the CLI without paying torch's import time."""
    code = "import sys, app.cli, core.config, core.events; sys.exit(1 if 'torch' in sys.modules else 0)"
    r = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True)
    assert r.returncode == 0, "torch was imported: " + r.stderr
