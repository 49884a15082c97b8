"""The house limits on the product's code (app, core, db, worker, sweep; the Alembic migrations excepted, which
are generated one per schema change and never read as a whole): no function over MAX_FUNCTION_LINES, no file over
MAX_FILE_LINES, both counted on the code as `ruff format` writes it. A failure names each function and file over
its limit, with where it is, so that it is split where it grew rather than packed onto fewer lines."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("app", "core", "db", "worker", "sweep")
EXCEPTED = ("db/migrations",)  # Alembic revisions: one generated file per schema change

# A function that fits on a screen can be read, and tested, as one thing; past 60 lines it has become two or three
# steps that want names of their own.
MAX_FUNCTION_LINES = 60
# A module past 400 lines holds more than one job: its reader scrolls through the other jobs to find theirs.
MAX_FILE_LINES = 400


def product_files() -> list[Path]:
    files = [p for package in PACKAGES for p in sorted((ROOT / package).rglob("*.py"))]
    return [p for p in files if not any(p.relative_to(ROOT).as_posix().startswith(e + "/") for e in EXCEPTED)]


def long_functions(path: Path, root: Path = ROOT) -> list[str]:
    """Each function (or method) of `path` over the limit, from its `def` line (decorators aside) to its last line,
    docstring included, as `path:line name (N lines)`."""
    where = path.relative_to(root).as_posix()
    out = []
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            lines = node.end_lineno - node.lineno + 1
            if lines > MAX_FUNCTION_LINES:
                out.append(f"{where}:{node.lineno} {node.name} ({lines} lines)")
    return out


def long_file(path: Path, root: Path = ROOT) -> list[str]:
    lines = len(path.read_text().splitlines())
    return [f"{path.relative_to(root).as_posix()} ({lines} lines)"] if lines > MAX_FILE_LINES else []


def in_package(package: str) -> list[Path]:
    return [p for p in product_files() if p.relative_to(ROOT).parts[0] == package]


def test_the_walk_finds_the_product_and_leaves_out_the_migrations():
    found = {p.relative_to(ROOT).as_posix() for p in product_files()}
    assert {"app/main.py", "core/config.py", "db/repo.py", "worker/tasks.py", "sweep/spec.py"} <= found
    assert not any(p.startswith("db/migrations/") for p in found)


def test_a_function_or_file_one_line_over_its_limit_is_named_and_one_at_it_is_not(tmp_path):
    """The check itself: a method one line over the limit is named with its place; a function at the limit is not."""

    def body(lines: int, indent: str) -> str:
        return "".join(f"{indent}x{i} = {i}\n" for i in range(lines - 1))

    at_limit = f"def fits():\n{body(MAX_FUNCTION_LINES, '    ')}"
    over = f"class A:\n    def grown(self):\n{body(MAX_FUNCTION_LINES + 1, '        ')}"
    module = tmp_path / "m.py"
    module.write_text(f"{at_limit}\n\n{over}")
    grown_at = MAX_FUNCTION_LINES + 4  # `fits` (the limit's lines), two blank lines, `class A:`, then `def grown`
    assert long_functions(module, tmp_path) == [f"m.py:{grown_at} grown ({MAX_FUNCTION_LINES + 1} lines)"]
    assert long_file(module, tmp_path) == []
    module.write_text("x = 1\n" * (MAX_FILE_LINES + 1))
    assert long_file(module, tmp_path) == [f"m.py ({MAX_FILE_LINES + 1} lines)"]


@pytest.mark.parametrize("package", PACKAGES)
def test_no_function_over_the_limit(package):
    found = [hit for p in in_package(package) for hit in long_functions(p)]
    assert not found, f"functions over {MAX_FUNCTION_LINES} lines (split them into named steps):\n" + "\n".join(found)


@pytest.mark.parametrize("package", PACKAGES)
def test_no_file_over_the_limit(package):
    found = [hit for p in in_package(package) for hit in long_file(p)]
    assert not found, f"files over {MAX_FILE_LINES} lines (split them by job):\n" + "\n".join(found)
