"""Verified model exports: TorchScript, ONNX and torch.export, each checked against the eager model.

`export_model` writes `model.ts`, `model.onnx`, `model.pt2`, `export.json` and `bundle.zip`. Every
file is reloaded from disk and run on a real validation batch (and on batch sizes 1 and 7, which
catch a batch dimension baked in as a constant); the logits are compared with the eager model's.
A format that fails to export or to match is reported with the exporter's message and left out of
the bundle, so nothing unverified is shipped; the other formats are still produced. The checks (parity,
latency, the exporter's messages) are in core/export_checks.py.

onnx, onnxruntime and onnxscript are imported inside the functions that need them: the rest of
`core` (and every process that never exports) starts without them.
"""

from __future__ import annotations

import json
import time
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from torch import nn

from core.export_checks import ExportError, Runner, batch_of, latency, message, notes, parity, recorded
from core.export_report import (
    INPUT_NAME,
    OUTPUT_NAME,
    bundle_members,
    check_args,
    embedded,
    report_head,
    write_bundle,
)
from core.names import EXPORT_EXTRAS, EXPORT_FILES

# --- TorchScript ---------------------------------------------------------------------------------------


def _trace_problems(
    traced: torch.jit.ScriptModule,
    inputs: torch.Tensor,
    refs: dict[int, torch.Tensor],
    atol: float,
    caught: list[warnings.WarningMessage],
) -> list[str]:
    """Why a trace cannot be trusted: TracerWarnings, or outputs that differ from eager at any batch size
    (a trace records only the path the example took)."""
    problems = [
        f"TracerWarning: {str(w.message).splitlines()[0]}"
        for w in caught
        if issubclass(w.category, torch.jit.TracerWarning)
    ]
    for n, ref in refs.items():
        try:
            diff = (traced(batch_of(inputs, n)) - ref).abs().max().item()
        except Exception as e:  # noqa: BLE001 - a trace that cannot run another batch size is a divergence
            problems.append(f"trace fails at batch {n}: {message(e, 300)}")
            continue
        if not diff <= atol:
            problems.append(f"trace differs from eager by {diff:.3g} at batch {n}")
    return list(dict.fromkeys(problems))


def _export_torchscript(
    model: nn.Module,
    inputs: torch.Tensor,
    path: Path,
    refs: dict[int, torch.Tensor],
    atol: float,
    extra: dict[str, str],
) -> tuple[Runner, dict[str, Any]]:
    """Trace with the real batch; script when the trace cannot be trusted. The checks run on the saved
    and reloaded file, which is what users get."""

    def save_and_load(module: torch.jit.ScriptModule) -> torch.jit.ScriptModule:
        torch.jit.save(module, str(path), _extra_files={"torchdeck.json": json.dumps(extra)})
        return torch.jit.load(str(path), map_location="cpu")

    with recorded() as caught:
        try:
            loaded = save_and_load(torch.jit.trace(model, inputs, check_trace=False))  # our check covers more
            problems = _trace_problems(loaded, inputs, refs, atol, caught)
        except Exception as e:  # noqa: BLE001 - any trace failure means: try scripting
            problems = [f"torch.jit.trace failed: {message(e, 500)}"]
        info = {"method": "trace", "reason": f"matches eager at batch sizes {list(refs)}, no TracerWarning"}
        if problems:
            info = {"method": "script", "reason": "; ".join(problems)}
            try:
                loaded = save_and_load(torch.jit.script(model))
            except Exception as e:  # noqa: BLE001
                raise ExportError(f"trace unusable ({info['reason']}) and torch.jit.script failed: {message(e)}") from e
    info["notes"] = notes(caught)  # torch 2.14 deprecates TorchScript: say so, do not hide it
    return loaded, info


# --- torch.export: one capture shared by model.pt2 and the ONNX exporter -----------------------------


class _SharedProgram:
    """torch.export runs once per export: model.pt2 is this program and the ONNX exporter converts it."""

    def __init__(self, model: nn.Module, inputs: torch.Tensor):
        self.model = model
        self.example = inputs if inputs.shape[0] >= 2 else batch_of(inputs, 2)  # batch 1 would be specialised
        self.dynamic_shapes = ({0: torch.export.Dim("batch", min=1)},)
        self._result: torch.export.ExportedProgram | ExportError | None = None

    def get(self) -> torch.export.ExportedProgram:
        if self._result is None:
            try:
                self._result = torch.export.export(self.model, (self.example,), dynamic_shapes=self.dynamic_shapes)
                self._result.example_inputs = None  # else model.pt2 would ship the validation batch it was given
            except Exception as e:  # noqa: BLE001 - kept, and raised to every format that needs the program
                self._result = ExportError(f"torch.export.export: {message(e)}")
        if isinstance(self._result, ExportError):
            raise self._result
        return self._result


# --- ONNX ------------------------------------------------------------------------------------------------


def _onnx_dynamo(model: nn.Module, program: _SharedProgram, path: Path, opset: int | None) -> None:
    """Convert the shared ExportedProgram; when torch.export failed on the model, let the ONNX exporter
    try its own capture strategies before the legacy fallback."""
    kwargs = dict(
        dynamo=True,
        input_names=[INPUT_NAME],
        output_names=[OUTPUT_NAME],
        opset_version=opset,
        external_data=False,
        verbose=False,
    )
    try:
        source: Any = program.get()
        torch.onnx.export(source, (program.example,), str(path), **kwargs)
    except ExportError:  # only program.get() raises it here
        torch.onnx.export(model, (program.example,), str(path), dynamic_shapes=program.dynamic_shapes, **kwargs)


def _onnx_legacy(
    model: nn.Module, example: torch.Tensor, path: Path, opset: int | None, caught: list[warnings.WarningMessage]
) -> None:
    """The TorchScript-based exporter: a trace, so TracerWarnings mean a graph that is wrong elsewhere."""
    start = len(caught)
    torch.onnx.export(
        model,
        (example,),
        str(path),
        dynamo=False,
        input_names=[INPUT_NAME],
        output_names=[OUTPUT_NAME],
        opset_version=opset,
        dynamic_axes={INPUT_NAME: {0: "batch"}, OUTPUT_NAME: {0: "batch"}},
    )
    tracer = [str(w.message).splitlines()[0] for w in caught[start:] if issubclass(w.category, torch.jit.TracerWarning)]
    if tracer:
        path.unlink(missing_ok=True)
        raise ExportError(f"the traced graph would hold only the branch this batch took (TracerWarning: {tracer[0]})")


def _export_onnx(
    model: nn.Module, program: _SharedProgram, path: Path, opset: int | None, props: dict[str, str]
) -> tuple[Runner, dict[str, Any]]:
    """torch.export-based exporter with a dynamic batch, legacy exporter as fallback; full checker; metadata."""
    import onnx
    import onnxruntime as ort

    info: dict[str, Any] = {"exporter": "dynamo", "fallback_reason": None}
    with recorded() as caught:
        try:
            _onnx_dynamo(model, program, path, opset)
        except Exception as e:  # noqa: BLE001 - recorded as the reason for the fallback
            info.update(exporter="legacy", fallback_reason=message(e))
            try:
                _onnx_legacy(model, program.example, path, opset, caught)
            except Exception as e2:  # noqa: BLE001
                raise ExportError(
                    f"dynamo exporter: {info['fallback_reason']} | legacy exporter: {message(e2)}"
                ) from e2
    proto = onnx.load(str(path))
    onnx.helper.set_model_props(proto, props)
    try:
        onnx.checker.check_model(proto, full_check=True)
    except Exception as e:  # noqa: BLE001
        raise ExportError(f"onnx.checker.check_model(full_check=True): {message(e)}") from e
    onnx.save(proto, str(path))
    info["opset"] = next(o.version for o in proto.opset_import if o.domain in ("", "ai.onnx"))
    info["checker"] = "passed (full_check=True)"
    info["notes"] = notes(caught)
    if opset is not None and info["opset"] != opset:  # the dynamo exporter keeps 18 when it cannot convert down
        info["notes"].append(
            f"opset {opset} was requested; the exporter could not convert to it and wrote {info['opset']}"
        )
    options = ort.SessionOptions()
    options.intra_op_num_threads = torch.get_num_threads()  # as many threads as eager: latencies compare like with like
    session = ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])
    name = session.get_inputs()[0].name

    def run(x: torch.Tensor) -> torch.Tensor:
        return torch.from_numpy(session.run(None, {name: x.numpy()})[0])

    return run, info


def _export_pt2(program: _SharedProgram, path: Path, extra: dict[str, str]) -> tuple[Runner, dict[str, Any]]:
    with recorded() as caught:
        torch.export.save(program.get(), str(path), extra_files={"torchdeck.json": json.dumps(extra)})
        loaded = torch.export.load(str(path)).module()  # verify what was written, not what is in memory
    return loaded, {"notes": notes(caught)}


# --- the whole export ---------------------------------------------------------------------------------------


def _export_one(
    fmt: str,
    model: nn.Module,
    inputs: torch.Tensor,
    path: Path,
    refs: dict[int, torch.Tensor],
    atol: float,
    opset: int | None,
    props: dict[str, str],
    program: _SharedProgram,
) -> dict[str, Any]:
    """Export one format, reload it from disk, verify it; never raises for an exporter's failure."""
    t0 = time.perf_counter()
    try:
        if fmt == "torchscript":
            run, entry = _export_torchscript(model, inputs, path, refs, atol, props)
        elif fmt == "onnx":
            run, entry = _export_onnx(model, program, path, opset, props)
        else:
            run, entry = _export_pt2(program, path, props)
        entry["parity"] = parity(run, inputs, refs, atol)
    except Exception as e:  # noqa: BLE001 - one format's failure must not stop the others
        path.unlink(missing_ok=True)
        return {"ok": False, "error": e.args[0] if isinstance(e, ExportError) else message(e)}
    entry["export_seconds"] = round(time.perf_counter() - t0, 3)
    if not entry["parity"]["passed"]:
        path.unlink(missing_ok=True)  # an export that computes something else must not be downloadable
        worst = entry["parity"]["max_abs_diff_by_batch"]
        return {"ok": False, "error": f"parity failed: max |Δlogit| by batch size {worst} exceeds atol {atol}", **entry}
    entry.update(ok=True, file=path.name, size_bytes=path.stat().st_size, latency_ms=latency(run, inputs))
    return entry


def _export_all(
    model: nn.Module,
    inputs: torch.Tensor,
    out_dir: Path,
    report: dict[str, Any],
    atol: float,
    opset: int | None,
    say: Callable[[str], None],
) -> None:
    """Eager references and latency, then each requested format in turn (fills report in place)."""
    props = embedded(report)
    refs = {n: model(batch_of(inputs, n)).float() for n in report["check_batches"]}
    report["latency_ms"] = {"eager": latency(model, inputs)}
    report["formats"] = {}
    program = _SharedProgram(model, inputs)
    for fmt in report["requested_formats"]:
        say(f"{fmt}: exporting and verifying")
        entry = _export_one(fmt, model, inputs, out_dir / EXPORT_FILES[fmt], refs, atol, opset, props, program)
        report["formats"][fmt] = entry
        if entry["ok"]:
            report["latency_ms"][fmt] = entry["latency_ms"]
        say(f"{fmt}: {'ok' if entry['ok'] else 'FAILED: ' + entry['error'][:200]}")


def export_model(
    model: nn.Module,
    inputs: torch.Tensor,
    out_dir: Path,
    formats: list[str],
    meta: dict[str, Any],
    atol: float = 1e-4,
    opset: int | None = None,
    progress: Callable[[str], None] | None = None,
) -> dict[str, Any]:
    """Export `model` to each format in `formats` under `out_dir`, verify every file against the eager model
    on `inputs` (a normalised validation batch of up to 256 samples) and write export.json and bundle.zip.
    Returns the report that export.json holds. Raises ValueError for bad arguments only: an exporter's
    failure is reported in the format's entry."""
    say = progress or (lambda _msg: None)
    formats = list(dict.fromkeys(formats))
    check_args(inputs, formats, meta)
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    for stale in (*EXPORT_FILES.values(), *EXPORT_EXTRAS):  # a re-export must not ship old files
        (out_dir / stale).unlink(missing_ok=True)
    report = report_head(inputs, formats, meta, atol)
    was_training = model.training
    device = next((p.device for p in model.parameters()), torch.device("cpu"))
    # Exported on the CPU: files traced on a GPU would carry its device; eval() so BatchNorm and Dropout behave as
    # in inference.
    model.cpu().eval()
    try:
        with torch.no_grad():
            _export_all(model, inputs.detach().cpu().contiguous(), out_dir, report, atol, opset, say)
    finally:
        model.to(device).train(was_training)
    report["all_ok"] = all(e["ok"] for e in report["formats"].values())
    report["bundle"] = {"file": "bundle.zip", "contents": bundle_members(report)}
    (out_dir / "export.json").write_text(json.dumps(report, indent=2))
    write_bundle(out_dir, report["bundle"]["contents"])
    say(f"export done: {', '.join(f for f, e in report['formats'].items() if e['ok']) or 'no format'} verified")
    return report
