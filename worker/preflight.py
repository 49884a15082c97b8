"""Pre-flight in its own process: `python -m worker.preflight SPEC.yaml OUT_DIR [--overfit]`, run by the jobs
worker (worker/jobs.py) for the New run page, which never imports torch.

It builds the data and the model exactly as a run would, checks that a real batch gives (batch, classes)
logits, draws the labelled sample grid, optionally tries to overfit one small batch on a short budget, and
writes OUT_DIR/result.json (+ samples.png). Exit code 0 when the shape check passed (a failed overfit check
is a warning the page shows, not a failure)."""

from __future__ import annotations

import argparse
import json
import sys
import time
import traceback
from pathlib import Path
from typing import Any

from core.names import PREFLIGHT_OVERFIT_BATCH, PREFLIGHT_OVERFIT_LR, PREFLIGHT_OVERFIT_S, PREFLIGHT_OVERFIT_STEPS


def overfit_verdict(model: Any, data: Any, device: Any, seed: int, budget_s: float | None) -> dict:
    """overfit_one_batch on the interactive budget, plus `fell` (the loss went down) and `budget_s`;
    {"skipped": why} for a model with nothing to train, {"error": ...} when the check itself broke."""
    import torch

    from core.preflight import overfit_one_batch

    if not any(p.requires_grad for p in model.parameters()):
        return {"skipped": "the model has no trainable parameters (everything is frozen)"}
    torch.manual_seed(seed)
    try:
        r = overfit_one_batch(
            model,
            data,
            device,
            PREFLIGHT_OVERFIT_STEPS,
            batch=PREFLIGHT_OVERFIT_BATCH,
            lr=PREFLIGHT_OVERFIT_LR,
            budget_s=budget_s,
        )
    except (RuntimeError, ValueError) as e:
        return {"error": f"{e.__class__.__name__}: {e}"[:2000]}
    fell = r["final_loss"] < r["initial_loss"]  # False for NaN too
    return {**r, "fell": fell, "budget_s": budget_s, "max_steps": PREFLIGHT_OVERFIT_STEPS}


def run(
    spec_path: Path, out: Path, overfit: bool = False, overfit_budget_s: float | None = PREFLIGHT_OVERFIT_S
) -> dict:
    """The pre-flight's result: data, model, shapes (or error), and with `overfit` the overfit verdict."""
    from core.config import load_spec

    t0 = time.perf_counter()
    spec = load_spec(spec_path)
    # Imported here, not at module level: only this subprocess pays for torch.
    import torch

    from core.data import load_data
    from core.imbalance import correction, imbalance, imbalance_message
    from core.models import build_model
    from core.preflight import ShapeError, check_shapes, sample_grid
    from core.timm_models import check_model
    from core.train import resolve_device

    check_model(spec.model.name)  # a timm name timm does not have is refused before any data is read
    torch.manual_seed(spec.seed)  # the same spec gets the same model, so the same verdict, whatever ran before
    data = load_data(spec.data, spec.seed, spec.model)
    info = data.info
    result: dict = {
        "data": {
            "name": info.name,
            "classes": info.class_names,
            "train": info.num_train,
            "val": info.num_val,
            "channels": info.channels,
            "image_size": info.image_size,
            "skipped": info.skipped,
        }
    }
    found = imbalance(info.class_names, info.class_counts)
    if found:  # unbalanced classes: the New run page says so before the run is launched
        fix = correction(spec.train.class_weights, spec.train.sampler)
        result["imbalance"] = {**found, "message": imbalance_message(found, fix), "corrected": fix is not None}
    sample_grid(data, out / "samples.png")
    model = build_model(spec.model, info.num_classes, info.channels, info.image_size, class_names=info.class_names)
    result["model"] = {
        "name": spec.model.name,
        "parameters": sum(p.numel() for p in model.parameters()),
        "trainable": sum(p.numel() for p in model.parameters() if p.requires_grad),
    }
    device = resolve_device(spec)
    try:
        result["shapes"] = check_shapes(model.to(device), data, device)
        result["ok"] = True
    except ShapeError as e:
        result.update(ok=False, error=f"shape check failed: {e}")
    if overfit:
        result["overfit"] = (
            overfit_verdict(model, data, device, spec.seed, overfit_budget_s)
            if result["ok"]
            else {"skipped": "the shape check failed"}
        )
    result["seconds"] = round(time.perf_counter() - t0, 2)
    return result


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m worker.preflight")
    parser.add_argument("spec", type=Path)
    parser.add_argument("out", type=Path)
    parser.add_argument("--overfit", action="store_true", help="also try to overfit one batch (short budget)")
    args = parser.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    try:
        result = run(args.spec, args.out, overfit=args.overfit)
    except Exception as e:  # noqa: BLE001 - reported to the page, which shows it beside the button
        result = {"ok": False, "error": f"{e.__class__.__name__}: {e}", "traceback": traceback.format_exc()[-4000:]}
    (args.out / "result.json").write_text(json.dumps(result, default=str))
    return 0 if result.get("ok") else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
