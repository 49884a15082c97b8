"""`torchdeck train` as a user runs it: a YAML file in, a run folder out."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest

ROOT = Path(__file__).resolve().parents[2]
TORCHDECK = str(Path(sys.executable).parent / "torchdeck")


def _run(*args: str, timeout: int = 600) -> subprocess.CompletedProcess:
    return subprocess.run([TORCHDECK, *args], cwd=ROOT, capture_output=True, text=True, timeout=timeout)


@pytest.fixture(scope="module")
def digits_run(tmp_path_factory) -> tuple[Path, subprocess.CompletedProcess]:
    """The digits preset exactly as shipped (minus exports, tested in test_export.py)."""
    out = tmp_path_factory.mktemp("digits")
    r = _run("train", "configs/digits_simple_cnn.yaml", "--out", str(out), "--set", "export.formats=[]")
    return out, r


def test_digits_preset_reaches_97_percent(digits_run):
    out, r = digits_run
    assert r.returncode == 0, r.stderr[-3000:]
    summary = json.loads((out / "summary.json").read_text())
    assert summary["status"] in ("completed", "early_stopped")
    best_acc = max(h["val/acc"] for h in pd.read_json(out / "metrics.jsonl", lines=True)["values"] if "val/acc" in h)
    assert best_acc >= 0.97, f"digits preset reached only {best_acc:.4f}"
    assert "status:" in r.stdout and "outputs:" in r.stdout


def test_run_folder_layout_and_formats(digits_run):
    out, _ = digits_run
    for rel in (
        "spec.yaml",
        "metrics.jsonl",
        "events.jsonl",
        "summary.json",
        "checkpoints/last.pt",
        "checkpoints/best.pt",
        "samples.png",
    ):
        assert (out / rel).is_file(), rel
    metrics = pd.read_json(out / "metrics.jsonl", lines=True)  # pandas reads it directly
    assert list(metrics.columns) == ["step", "epoch", "time", "values"]
    assert metrics["step"].is_monotonic_increasing
    summary = json.loads((out / "summary.json").read_text())
    assert set(summary) >= {"status", "best", "epochs_run", "wall_time_s"}
    assert set(summary["best"]) == {"metric", "value", "epoch"}
    events = pd.read_json(out / "events.jsonl", lines=True)
    assert {"time", "kind", "level", "message", "data"} <= set(events.columns)


def test_bad_spec_exits_2_naming_the_field(tmp_path):
    spec = tmp_path / "bad.yaml"
    spec.write_text("optim: {lr: -1}\nmodel: {name: resnet9000}\n")
    r = _run("train", str(spec), "--out", str(tmp_path / "o"))
    assert r.returncode == 2
    assert "optim.lr" in r.stderr and "model.name" in r.stderr and "resnet18" in r.stderr
    assert not (tmp_path / "o").exists(), "nothing is written for an invalid spec"


def test_set_overrides_and_resume(tmp_path):
    out = tmp_path / "r"
    base = [
        "configs/digits_simple_cnn.yaml",
        "--out",
        str(out),
        "--set",
        "export.formats=[]",
        "--set",
        "train.early_stopping.enabled=false",
    ]
    r1 = _run("train", *base, "--set", "train.epochs=2")
    assert r1.returncode == 0, r1.stderr[-2000:]
    assert json.loads((out / "summary.json").read_text())["epochs_run"] == 2
    r2 = _run("train", *base, "--set", "train.epochs=3", "--resume")
    assert r2.returncode == 0, r2.stderr[-2000:]
    assert json.loads((out / "summary.json").read_text())["epochs_run"] == 3
    assert "resumed" in (out / "events.jsonl").read_text()


def test_python_dash_m_core_trains(tmp_path):
    r = subprocess.run(
        [
            sys.executable,
            "-m",
            "core",
            "configs/digits_simple_cnn.yaml",
            "--out",
            str(tmp_path),
            "--set",
            "train.epochs=1",
            "--set",
            "export.formats=[]",
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert r.returncode == 0, r.stderr[-2000:]
    assert "epoch   1" in r.stdout and (tmp_path / "summary.json").is_file()


def test_validate_prints_resolved_spec():
    r = _run("validate", "configs/digits_simple_cnn.yaml", "--set", "train.epochs=3")
    assert r.returncode == 0 and "epochs: 3" in r.stdout


def test_export_command_verifies_and_bundles(digits_run):
    out, _ = digits_run
    r = _run("export", str(out), "--checkpoint", "best", "--formats", "onnx,torchscript")
    assert r.returncode == 0, r.stderr[-3000:]
    report = json.loads((out / "export" / "export.json").read_text())
    assert report["formats"]["onnx"]["ok"] and report["formats"]["torchscript"]["ok"]
    assert report["formats"]["onnx"]["parity"]["top1_agreement"] == 100.0
    assert {"model.onnx", "model.ts", "bundle.zip"} <= {p.name for p in (out / "export").iterdir()}
    assert "ok   onnx" in r.stdout


def test_export_command_bad_input(tmp_path):
    r = _run("export", str(tmp_path), "--formats", "onnx")
    assert r.returncode == 2 and "no best checkpoint" in r.stderr
    r = _run("export", str(tmp_path), "--formats", "tflite")
    assert r.returncode == 2 and "tflite" in r.stderr
