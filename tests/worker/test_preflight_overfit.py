"""worker/preflight.py's overfit-one-batch check (the New run page's pre-flight): real digits data, real
tiny models, on the CPU, with no time budget so that the verdict never depends on the machine's speed."""

from __future__ import annotations

import json
from pathlib import Path

from core.config import RunSpec
from core.names import PREFLIGHT_OVERFIT_STEPS
from worker import preflight


def _spec(tmp_path: Path, **model: object) -> Path:
    spec = RunSpec.model_validate(
        {
            "name": "overfit-test",
            "data": {"name": "digits", "image_size": 8},
            "model": {"name": "simple_cnn", **model},
            "device": "cpu",
            "seed": 0,
        }
    )
    path = tmp_path / "spec.yaml"
    path.write_text(spec.to_yaml())
    return path


def test_run_returns_the_overfit_verdict_and_the_loss_falls(tmp_path: Path) -> None:
    result = preflight.run(_spec(tmp_path, hidden=16), tmp_path / "out", overfit=True, overfit_budget_s=None)
    assert result["ok"] and result["shapes"]["output_shape"] == [10]
    r = result["overfit"]
    assert r["fell"] and r["final_loss"] < r["initial_loss"]
    assert r["passed"] and r["steps"] == r["max_steps"] == PREFLIGHT_OVERFIT_STEPS and r["batch"] == 16
    assert (tmp_path / "out" / "samples.png").is_file()


def test_without_the_option_there_is_no_overfit_entry(tmp_path: Path) -> None:
    result = preflight.run(_spec(tmp_path, hidden=16), tmp_path / "out")
    assert result["ok"] and "overfit" not in result


def test_the_command_line_flag_writes_the_verdict(tmp_path: Path) -> None:
    out = tmp_path / "out"
    assert preflight.main([str(_spec(tmp_path, hidden=16)), str(out), "--overfit"]) == 0
    r = json.loads((out / "result.json").read_text())["overfit"]
    assert {"passed", "fell", "initial_loss", "final_loss", "steps"} <= set(r)
