"""Predict benchmark: the server time of one image's prediction on the Run page's Predict tab.

    python benchmarks/bench_predict.py                # 7 repeats of 50 digit images
    python benchmarks/bench_predict.py --repeats 15 --images 100

A small simple_cnn is trained on the real digits for a few seconds and exported to ONNX (core.export: verified
against the eager model), registered as a finished run's artifact in a SQLite database under a temporary
TORCHDECK_HOME, and loaded by app.services.predict.load_model as the page loads it. Preconditions, checked before
timing: the page's service accepts the export as verified, and its top class and probabilities equal those of a
user's own onnxruntime script with the bundle's preprocessing. Then each repeat sends `--images` digit PNG files
(8×8 grayscale) through app.services.predict.predict, the function the page calls, one at a time: the time from
the file's bytes to the probabilities (open, mode conversion, resize and crop, normalise, ONNX Runtime on the CPU).

Prints a comment line with each repeat's ms per image, its min and max, then
`predict_latency_ms_per_image=<median over the repeats>`.
"""

from __future__ import annotations

import argparse
import io
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import numpy as np

from core.config import RunSpec
from db import repo
from db.engine import make_engine
from db.migrate import upgrade
from tests._onnx_digits import digit_png, reference, register, train_and_export

SPEC = RunSpec.model_validate({"data": {"name": "digits", "image_size": 8}}).model_dump(mode="json")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--repeats", type=int, default=7)
    ap.add_argument("--images", type=int, default=50)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        os.environ["TORCHDECK_HOME"] = tmp
        os.environ["TORCHDECK_DATABASE_URL"] = url = f"sqlite:///{Path(tmp) / 'torchdeck.db'}"
        os.environ.pop("TORCHDECK_ARTIFACTS", None)
        upgrade(url)
        engine = make_engine(url)
        from app.services import predict
        from app.services.artifacts import artifact_root

        out = Path(tmp) / "export"
        report = train_and_export(out)
        r = repo.create_run(engine, SPEC, name="bench-predict", owner="local")
        repo.claim_run(engine, r.id, "w1", device="cpu")
        repo.finish_run(engine, r.id, "completed", summary={"status": "completed"})
        register(engine, r.id, artifact_root(), report, out)
        onnx, why = predict.verified_onnx("completed", repo.list_artifacts(engine, r.id))
        assert onnx is not None, why
        model = predict.load_model(onnx.id, engine)
        images = [digit_png(i) for i in range(args.images)]
        for data in images[:10]:  # the page's answer is the user's own script's
            got = predict.predict(model, "digit.png", io.BytesIO(data))
            best, probs = reference(out / "model.onnx", data)
            assert got.error is None and got.top[0][0] == best, (got, best)
            np.testing.assert_allclose([q for _, q in got.top], np.sort(probs)[::-1][:5], rtol=1e-5, atol=1e-7)
        for data in images:  # warm: ONNX Runtime's first runs, PIL's plugins
            predict.predict(model, "digit.png", io.BytesIO(data))
        per_repeat = []
        for _ in range(args.repeats):
            t0 = time.perf_counter()
            for data in images:
                predict.predict(model, "digit.png", io.BytesIO(data))
            per_repeat.append((time.perf_counter() - t0) * 1000 / len(images))
        engine.dispose()
    print(
        f"# ms per image, {args.repeats} repeats of {args.images} digit PNGs: "
        f"{', '.join(f'{t:.3f}' for t in per_repeat)} (min {min(per_repeat):.3f}, max {max(per_repeat):.3f})"
    )
    print(f"predict_latency_ms_per_image={statistics.median(per_repeat):.4g}", flush=True)


if __name__ == "__main__":
    main()
