"""scripts/gpu-check.sh's dry run: benchmarks/bench_gpu.py --dry-run runs every check of a CUDA host on the CPU with
tiny sizes, so that the script a GPU machine runs for a few minutes has run here first, step for step. It exits 0,
its JSON report has every check passed or skipped with its reason, and it prints its name=value lines; a time budget
that runs out stops it with the check it cut timed_out and the rest not_run."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
BENCH = [sys.executable, str(ROOT / "benchmarks" / "bench_gpu.py")]
CHECKS = ["digits", "bf16", "fp32", "fp16", "throughput", "photos", "stack", "ddp", "compile"]


def bench(*args: str, timeout: float) -> subprocess.CompletedProcess:
    return subprocess.run([*BENCH, *args], cwd=ROOT, capture_output=True, text=True, timeout=timeout)


def lines(out: str) -> dict[str, str]:
    """The name=value lines (comments, starting with #, and anything else left out)."""
    return dict(line.split("=", 1) for line in out.splitlines() if "=" in line and not line.startswith("#"))


@pytest.fixture(scope="module")
def dry_run(tmp_path_factory) -> tuple[subprocess.CompletedProcess, Path]:
    report = tmp_path_factory.mktemp("gpu-check") / "report.json"
    return bench("--dry-run", "--report", str(report), timeout=540), report


def test_the_dry_run_passes_every_check_or_skips_it_with_its_reason(dry_run):
    r, report = dry_run
    assert r.returncode == 0, r.stdout[-4000:] + r.stderr[-4000:]
    found = json.loads(report.read_text())
    assert found["mode"] == "dry-run" and found["passed"] is True
    assert list(found["checks"]) == CHECKS
    for name, check in found["checks"].items():
        assert check["status"] in ("passed", "skipped"), (name, check)
        assert check["reason"].strip(), name
        assert isinstance(check["figures"], dict) and check["seconds"] >= 0
    assert "fp16 needs CUDA" in found["checks"]["fp16"]["reason"]  # skipped on the CPU, and why
    assert "GradScaler scale 65536 → 32768" in found["checks"]["fp16"]["reason"]  # its planted overflow ran
    assert found["checks"]["fp16"]["figures"] == {"fp16_scale": 32768.0, "fp16_skips": 1}


def test_the_dry_run_prints_name_value_lines(dry_run):
    r, report = dry_run
    printed = lines(r.stdout)
    assert printed["mode"] == "dry-run" and printed["device"] == "cpu"
    assert {name: printed[name] for name in CHECKS} == {name: "passed" for name in CHECKS} | {"fp16": "skipped"}
    for key in ("digits_val_acc", "cpu_simple_cnn_vs_hand", "photos_data_wait_disk_cache", "ddp2_vs_single_throughput"):
        assert float(printed[key]) >= 0, key
    assert printed["published_a100_amp_samples_per_s"] == "2500"
    assert printed["gpu_check"] == "passed" and Path(printed["report"]) == report
    assert r.stdout.rstrip().splitlines()[-1] == f"report={report}"


def test_a_budget_that_runs_out_reports_the_check_it_cut_and_those_not_run(tmp_path):
    report = tmp_path / "report.json"
    r = bench(
        "--dry-run", "--only", "stack", "--only", "digits", "--budget-s", "1", "--report", str(report), timeout=300
    )
    assert r.returncode == 1, r.stdout + r.stderr
    checks = json.loads(report.read_text())["checks"]
    assert [(n, c["status"]) for n, c in checks.items()] == [("stack", "timed_out"), ("digits", "not_run")]
    assert lines(r.stdout)["stack"] == "timed_out" and lines(r.stdout)["gpu_check"] == "failed"
    kept = Path(r.stdout.split("# kept for a look: ")[1].splitlines()[0])  # the work folder, kept after a failure
    assert kept.is_dir()
    shutil.rmtree(kept.parent, ignore_errors=True)
