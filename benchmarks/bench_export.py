"""Export benchmark: parity and CPU latency of every export format against eager PyTorch.

    python benchmarks/bench_export.py [--models simple_cnn,resnet18] [--samples 256] [--out DIR]

Each model is built for 10 classes of 3×32×32 images (the synthetic dataset, CIFAR-sized), exported
to TorchScript, ONNX and torch.export with core.export.export_model and verified on a real
validation batch of the dataset. Latency is the median of up to 20 calls after warmup (see
core/export_checks.py), on this machine's CPU; onnxruntime gets as many intra-op threads as torch.

The last line is `onnx_vs_eager_latency_ratio_b1=<x>`: ONNX Runtime latency over eager PyTorch
latency at batch 1, the larger (worse for ONNX) of the models' ratios.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from anywhere without installing

from core.config import RunSpec  # noqa: E402
from core.data import Preprocess, load_data  # noqa: E402
from core.export import export_model  # noqa: E402
from core.export_report import export_meta
from core.models import build_model  # noqa: E402
from core.names import EXPORT_FORMATS as FORMATS  # noqa: E402
from core.spec_sections import DataSpec, ModelSpec


def _validation_batch(samples: int) -> tuple[torch.Tensor, dict]:
    spec = RunSpec(data=DataSpec(name="synthetic", channels=3, size=32, num_classes=10, num_samples=2000))
    data = load_data(spec.data, seed=spec.seed, model=spec.model)
    x = Preprocess(data.info, None, torch.device("cpu"))(data.val.images[:samples])
    return x, export_meta(data.info, spec.spec_hash())


def _print_report(name: str, report: dict, seconds: float) -> None:
    print(
        f"\n== {name}: {report['parity_samples']} validation samples, export+verify {seconds:.1f} s, "
        f"threads {report['threads']} (torch and onnxruntime)"
    )
    print(
        f"{'format':<12} {'ok':<5} {'method':<14} {'max|Δ|':>10} {'mean|Δ|':>10} {'top1 %':>7} "
        f"{'b1 ms':>9} {'b32 ms':>9} {'MB':>7}"
    )
    eager = report["latency_ms"]["eager"]
    blanks = f"{'-':<5} {'-':<14} {'-':>10} {'-':>10} {'-':>7}"
    print(f"{'eager':<12} {blanks} {eager['b1']:>9.3f} {eager['b32']:>9.3f} {'-':>7}")
    for fmt, e in report["formats"].items():
        if not e["ok"]:
            print(f"{fmt:<12} {'NO':<5} {e['error'][:200]}")
            continue
        method = e.get("method") or e.get("exporter") or "export"
        p, lat = e["parity"], e["latency_ms"]
        print(
            f"{fmt:<12} {'yes':<5} {method:<14} {p['max_abs_diff']:>10.2e} {p['mean_abs_diff']:>10.2e} "
            f"{p['top1_agreement']:>7.2f} {lat['b1']:>9.3f} {lat['b32']:>9.3f} {e['size_bytes'] / 1e6:>7.2f}"
        )
    if report["formats"].get("onnx", {}).get("ok"):
        print(f"ONNX opset {report['formats']['onnx']['opset']}, exporter {report['formats']['onnx']['exporter']}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", default="simple_cnn,resnet18", help="comma-separated registered model names")
    parser.add_argument("--samples", type=int, default=256, help="validation samples for the parity check")
    parser.add_argument("--out", type=Path, default=None, help="keep the exports here (default: a temporary folder)")
    parser.add_argument(
        "--threads", type=int, default=None, help="intra-op threads for torch and onnxruntime (default: torch's)"
    )
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    inputs, meta = _validation_batch(args.samples)
    out_root = args.out or Path(tempfile.mkdtemp(prefix="bench_export_"))
    ratios: dict[str, float] = {}
    for name in args.models.split(","):
        model = build_model(ModelSpec(name=name), len(meta["class_names"]), meta["channels"], meta["image_size"])
        t0 = time.perf_counter()
        report = export_model(model, inputs, out_root / name, list(FORMATS), {**meta, "arch": name})
        _print_report(name, report, time.perf_counter() - t0)
        if "onnx" in report["latency_ms"]:
            ratios[name] = report["latency_ms"]["onnx"]["b1"] / report["latency_ms"]["eager"]["b1"]
    print("\nONNX Runtime / eager latency at batch 1: " + ", ".join(f"{k} {v:.3f}" for k, v in ratios.items()))
    print(f"exports in {out_root}")
    if not ratios:
        print("onnx_vs_eager_latency_ratio_b1=nan")
        return 1
    print(f"onnx_vs_eager_latency_ratio_b1={max(ratios.values()):.3f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
