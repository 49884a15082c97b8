"""Pre-flight in its own process: `python -m worker.preflight SPEC.yaml OUT_DIR`, run by the jobs worker
(worker/jobs.py) for the New run page, which never imports torch.

It builds the data and the model exactly as a run would, checks that a real batch gives (batch, classes)
logits, draws the labelled sample grid, and writes OUT_DIR/result.json (+ samples.png). Exit code 0 when
the check passed."""

from __future__ import annotations

import json
import sys
import time
import traceback
from pathlib import Path


def run(spec_path: Path, out: Path) -> dict:
    from core.config import load_spec

    t0 = time.perf_counter()
    spec = load_spec(spec_path)
    # Imported here, not at module level: only this subprocess pays for torch.
    from core.data import load_data
    from core.models import build_model
    from core.preflight import ShapeError, check_shapes, sample_grid
    from core.train import resolve_device

    data = load_data(spec.data, spec.seed)
    info = data.info
    result: dict = {"data": {"name": info.name, "classes": info.class_names, "train": info.num_train,
                             "val": info.num_val, "channels": info.channels, "image_size": info.image_size,
                             "skipped": info.skipped}}
    sample_grid(data, out / "samples.png")
    model = build_model(spec.model, info.num_classes, info.channels, info.image_size)
    result["model"] = {"name": spec.model.name, "parameters": sum(p.numel() for p in model.parameters()),
                       "trainable": sum(p.numel() for p in model.parameters() if p.requires_grad)}
    device = resolve_device(spec)
    try:
        result["shapes"] = check_shapes(model.to(device), data, device)
        result["ok"] = True
    except ShapeError as e:
        result.update(ok=False, error=f"shape check failed: {e}")
    result["seconds"] = round(time.perf_counter() - t0, 2)
    return result


def main(argv: list[str]) -> int:
    spec_path, out = Path(argv[0]), Path(argv[1])
    out.mkdir(parents=True, exist_ok=True)
    try:
        result = run(spec_path, out)
    except Exception as e:  # noqa: BLE001 - reported to the page, which shows it beside the button
        result = {"ok": False, "error": f"{e.__class__.__name__}: {e}", "traceback": traceback.format_exc()[-4000:]}
    (out / "result.json").write_text(json.dumps(result, default=str))
    return 0 if result.get("ok") else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
