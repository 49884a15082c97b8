"""torchdeck on a CUDA host, every check in one call within --budget-s (8 min): what scripts/gpu-check.sh runs.

    python benchmarks/bench_gpu.py [--dry-run] [--only NAME ...] [--report PATH] [--budget-s 480] [--require-cuda]

Checks, their figures and pass rules: README.md, "Checking a GPU host". Prints name=value lines, writes one JSON
report (`report=PATH` last), exits 1 unless every check passed or was skipped with its reason. --dry-run: each check on
the CPU, tiny sizes, loose pass rules (it checks the script, not figures); also without CUDA, unless --require-cuda.
"""

from __future__ import annotations

import argparse
import json
import logging
import math
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from unittest import mock

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # run from anywhere without installing

import numpy as np
import torch

from core.checkpoint import load_checkpoint
from core.config import RunSpec, load_spec
from core.engine import train_one_epoch
from core.events import MemorySink, NeverStop
from core.models import Classifier, build_model
from core.names import queue_of
from core.process import die_with_parent
from core.train import build_trainer, run_training, seed_everything

A100_AMP = 2500  # NVIDIA's published ResNet-50 v1.5 AMP training on one A100: about 2,500 images/s
TORCHDECK = str(Path(sys.executable).parent / "torchdeck")
DIGITS = ROOT / "configs" / "digits_simple_cnn.yaml"


class Ctx:
    def __init__(self, dry: bool, work: Path, deadline: float):
        self.dry, self.work, self.deadline, self.device = dry, work, deadline, "cpu" if dry else "cuda"
        self.procs: list[subprocess.Popen] = []  # stopped by the watchdog when the budget runs out

    def pick(self, gpu, dry):
        return dry if self.dry else gpu

    def out(self, name: str) -> Path:
        (self.work / name).mkdir(parents=True, exist_ok=True)
        return self.work / name


def train(spec: RunSpec | dict, out: Path) -> tuple[dict, MemorySink]:
    sink = MemorySink()
    return run_training(spec if isinstance(spec, RunSpec) else RunSpec.from_dict(spec), out, sink), sink


def values(sink: MemorySink, key: str, after: int = 0) -> list[float]:
    return [v for s, v in sink.series(key) if s > after] or [math.nan]


def ended(summary: dict) -> str:
    return summary["status"] + (f" ({summary['error']})" if summary["error"] else "")


def synthetic(ctx: Ctx, arch: str, precision: str, **train_extra) -> dict:
    """`arch` on synthetic data, 224 px, batch 64, 40 steps × 6 epochs; the dry run: simple_cnn, 16 px, 16, 4 × 2."""
    n, px, bs, steps, epochs = ctx.pick((3200, 224, 64, 40, 6), (96, 16, 16, 4, 2))
    spec = {"data": {"name": "synthetic", "num_classes": 10, "num_samples": n, "size": px, "val_fraction": 0.2}}
    spec.update(model={"name": ctx.pick(arch, "simple_cnn"), "hidden": 32}, optim={"name": "adam", "lr": 1e-3})
    spec["train"] = dict(epochs=epochs, batch_size=bs, steps_per_epoch=steps, precision=precision) | train_extra
    spec.update(checkpoint={"save_best": False, "save_last": False}, export={"formats": []}, device=ctx.device, seed=0)
    return {**spec, "loader": {"device_cache_mb": 8192}}


def check_digits(ctx: Ctx):
    over = [f"device={ctx.device}", "export.formats=[]", *ctx.pick([], ["train.epochs=1"])]
    summary, _ = train(load_spec(DIGITS, over), ctx.out("digits"))
    acc, need = (summary["best"] or {}).get("value", 0.0), ctx.pick(0.95, 0.5)
    ok = summary["status"] in ("completed", "early_stopped") and acc >= need
    return {"digits_val_acc": round(acc, 4)}, ok, f"{ended(summary)}, best val/acc {acc:.3f} (need ≥ {need})"


def precision_run(ctx: Ctx, precision: str):
    summary, sink = train(synthetic(ctx, "resnet18", precision), ctx.out(precision))
    loss, acc, need = values(sink, "train/epoch_loss"), max(values(sink, "val/acc")), ctx.pick(0.8, 0.0)
    ok = summary["status"] == "completed" and all(map(math.isfinite, loss)) and acc >= need
    ok = ok and (ctx.dry or loss[-1] < loss[0])
    why = f"{ended(summary)} {summary['global_step']} steps, epoch loss {loss[0]:.3g} → {loss[-1]:.3g}, "
    return {f"{precision}_val_acc": round(acc, 4)}, ok, why + f"val/acc {acc:.3f} (need ≥ {need})"


def planted_overflow(step: int):
    """At the model's `step`-th training forward, every gradient from its output becomes inf (`with` removes it)."""
    seen = [0]

    def hook(module, args, out):
        if isinstance(module, Classifier) and module.training and torch.is_grad_enabled():
            seen[0] += 1
            if seen[0] == step:
                out.register_hook(lambda g: torch.full_like(g, math.inf))

    return torch.nn.modules.module.register_module_forward_hook(hook)


def check_fp16(ctx: Ctx):
    plant, out = ctx.pick(20, 3), ctx.out("fp16")
    spec = synthetic(ctx, "resnet18", ctx.pick("fp16", "bf16"), log_every=1, diag_every=plant)
    spec["checkpoint"]["save_last"] = True  # its scaler state: the scale after the run
    real = torch.amp.GradScaler  # the dry run's stand-in for fp16 (CUDA only): bf16 with a GradScaler on the CPU
    with planted_overflow(plant), mock.patch.object(torch.amp, "GradScaler", ctx.pick(real, lambda d, **_: real(d))):
        summary, sink = train(spec, out)
    norms = dict(sink.series("grad_norm"))  # logged every step
    moved = [v for s, _, row in sink.metric_rows if s == plant for k, v in row.items() if k.startswith("update_rat")]
    last = out / "checkpoints" / "last.pt"
    scale = float(load_checkpoint(last)["scaler"]["scale"]) if last.is_file() else math.nan
    skipped = sum(not math.isfinite(v) for v in norms.values())  # each skipped step halves the scale once
    ok = summary["status"] == "completed" and not math.isfinite(norms.get(plant, 0.0)) and moved and not any(moved)
    ok, figures = bool(ok and scale == 2.0**16 * 0.5**skipped < 2.0**16), {"fp16_scale": scale, "fp16_skips": skipped}
    why = f"{ended(summary)}; step {plant}: grad_norm {norms.get(plant)}, update ratios {set(moved)}; "
    why += f"{skipped} non-finite step(s), GradScaler scale 65536 → {scale:g}"
    if ctx.dry and ok:  # None: skipped
        return figures, None, f"fp16 needs CUDA; the planted overflow ran with bf16 and a CPU GradScaler instead: {why}"
    return figures, ok, why


def check_compile(ctx: Ctx):
    spec, real = synthetic(ctx, "resnet18", "bf16", epochs=ctx.pick(2, 1)), torch.compile
    spec["compile"], spec["data"]["size"] = True, ctx.pick(64, 8)
    with mock.patch.object(torch, "compile", ctx.pick(real, lambda m: real(m, backend="aot_eager"))):  # dry: no C++
        summary, sink = train(spec, ctx.out("compile"))
    loss, epochs = values(sink, "train/epoch_loss"), [round(e, 1) for e in values(sink, "epoch_time_s")]
    ok = summary["status"] == "completed" and len(loss) == ctx.pick(2, 1) and all(map(math.isfinite, loss))
    why = f"{ended(summary)} ({ctx.pick('inductor', 'aot_eager')}), epoch loss {loss}, epoch seconds {epochs}"
    return {"compile_first_epoch_s": epochs[0]}, ok, why


def hand_loop(model, opt, x, y, bs: int, steps: int) -> None:
    """torchvision's reference loop: autocast bf16, channels_last, SGD; the data already on the device."""
    crit, perm = torch.nn.CrossEntropyLoss(), torch.randperm(len(y), device=x.device)
    model.train()
    for i in range(steps):
        idx = perm[i * bs : (i + 1) * bs]
        with torch.autocast(x.device.type, dtype=torch.bfloat16):
            loss = crit(model(x[idx].contiguous(memory_format=torch.channels_last)), y[idx])
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()


def timed(fn, sync) -> float:
    t0 = sync() or time.perf_counter()  # (sync returns None: the clock is read after it)
    fn()
    return (sync() or time.perf_counter()) - t0


def check_throughput(ctx: Ctx):
    arch, px, bs, steps, pairs = ctx.pick(("resnet50", 224, 256, 12, 5), ("simple_cnn", 16, 16, 3, 2))
    spec = synthetic(ctx, arch, "bf16", batch_size=bs, steps_per_epoch=steps, grad_clip={"mode": "none"})
    spec["data"].update(num_samples=max(200, int(bs * steps / 0.9) + 1), size=px, val_fraction=0.1, num_classes=100)
    spec.update(optim={"name": "sgd", "lr": 0.1, "momentum": 0.9, "weight_decay": 1e-4}, channels_last=True)
    seed_everything(0, False)
    dev, sync = torch.device(ctx.device), ctx.pick(torch.cuda.synchronize, lambda: None)
    t = build_trainer(RunSpec.from_dict(spec), ctx.out("throughput"), MemorySink(), NeverStop(), dev)
    x, y = t.train_batches.x, t.train_batches.y  # normalised once, on the device (no augmentation)
    net = build_model(t.spec.model, 100, 3, px).to(dev, memory_format=torch.channels_last)  # the same network
    opt = torch.optim.SGD(net.parameters(), lr=0.1, momentum=0.9, weight_decay=1e-4)
    ours, hand = [], []
    for i in range(pairs + 1):  # alternated: torchdeck first, then the hand loop first
        sides = [lambda e=i + 1: train_one_epoch(t, e), lambda: hand_loop(net, opt, x, y, bs, steps)]
        a, b = [timed(f, sync) for f in (sides if i % 2 == 0 else sides[::-1])]  # seconds
        if i:  # (the first pair warms up: cuDNN's algorithm search)
            ours.append(bs * steps / (a if i % 2 == 0 else b))
            hand.append(bs * steps / (b if i % 2 == 0 else a))
    ratios, (name, need) = [o / h for o, h in zip(ours, hand)], ctx.pick(("gpu_resnet50", 0.97), ("cpu_simple_cnn", 0))
    figures = {f"{name}_vs_hand": round(statistics.median(ratios), 3), "published_a100_amp_samples_per_s": A100_AMP}
    figures.update({f"{name}_samples_per_s": round(statistics.median(ours), 1)})
    figures[f"{name}_hand_samples_per_s"] = round(statistics.median(hand), 1)
    why = f"median of {pairs} alternated pairs (need ≥ {need}), per pair {[round(r, 3) for r in ratios]}"
    return figures, statistics.median(ratios) >= need, why


def check_photos(ctx: Ctx):
    from PIL import Image

    n, (w, h), px, bs = ctx.pick((2048, (320, 240), 224, 128), (64, (96, 72), 16, 16))
    root, rng, figures, ok, why = ctx.out("photos") / "images", np.random.default_rng(0), {}, True, []
    for i in range(n):  # photo-like JPEGs: smooth random colour fields, each of the 4 classes tinted its own way
        low = rng.random((h // 16, w // 16, 3)) * 150 + np.eye(3)[i % 4 % 3] * 40 * (1 + i % 4 // 3)
        (root / f"class_{i % 4}").mkdir(parents=True, exist_ok=True)
        img = Image.fromarray(low.clip(0, 255).astype(np.uint8)).resize((w, h), Image.BILINEAR)
        img.save(root / f"class_{i % 4}" / f"{i}.jpg", quality=90)
    need = ctx.pick(0.5, 1.0)
    with mock.patch.dict(os.environ, {"TORCHDECK_IMAGE_CACHE": str(ctx.out("photos") / "cache")}):
        for disk in (True, False):
            data = {"name": "imagefolder", "path": str(root), "image_size": px, "val_fraction": 0.1}
            data.update(test_split="none", cache_mb=1, disk_cache=disk)  # cache_mb 1: served from the disk cache
            spec = synthetic(ctx, "resnet50", "bf16", epochs=2, batch_size=bs, steps_per_epoch=None)
            spec["data"], spec["train"]["log_every"] = data, ctx.pick(10, 1)
            summary, sink = train(spec, ctx.out(f"photos/run_{disk}"))
            wait, name = values(sink, "data_wait_epoch")[-1], "disk_cache" if disk else "no_disk_cache"  # epoch 2's
            figures[f"photos_data_wait_{name}"] = round(wait, 3)
            speed = statistics.median(values(sink, "throughput", summary["global_step"] // 2))
            figures[f"photos_samples_per_s_{name}"] = round(speed, 1)
            ok = ok and summary["status"] == "completed" and 0.0 <= wait <= (need if disk else 1.0)
            why.append(f"{name}: {ended(summary)}, data_wait {wait:.3f} in epoch 2")
    return figures, ok, "; ".join(why) + f" (with the disk cache, need ≤ {need}: torchdeck's data-bound line)"


def wait_for(fn, timeout: float, what: str, proc=None):
    deadline = time.monotonic() + timeout
    while not (value := fn()):
        if time.monotonic() > deadline or (proc is not None and proc.poll() is not None):
            raise RuntimeError(f"{what} (waited {timeout:.0f} s)")
        time.sleep(0.3)
    return value


def stack_run(ctx: Ctx, home: Path, env: dict) -> tuple:
    """A digits run submitted to the stack's gpu queue, to its end: the run, its metric keys, the Workers page."""
    from db.engine import make_engine
    from db.repo import get_run, list_workers, metric_keys

    engine, spec = make_engine(env["TORCHDECK_DATABASE_URL"]), load_spec(DIGITS).model_dump(mode="json")
    spec.update(name="gpu-check", device=ctx.pick("cuda", "auto"))  # both wait in the gpu queue
    spec["train"].update(epochs=ctx.pick(2, 1), steps_per_epoch=ctx.pick(None, 5))
    spec["export"]["formats"] = ctx.pick(spec["export"]["formats"], ["torchscript"])
    (home / "run.json").write_text(json.dumps(spec))  # JSON is YAML
    r = subprocess.run([TORCHDECK, "submit", str(home / "run.json")], env=env, capture_output=True, text=True)
    if r.returncode:
        raise RuntimeError(f"torchdeck submit: {r.stderr[-1500:]}")
    run_id = r.stdout.strip().splitlines()[-1]
    run = wait_for(lambda: (x := get_run(engine, run_id)).finished_at and x, ctx.deadline - time.monotonic(), "run")
    wait_for(lambda: any(w.devices for w in list_workers(engine)), 30, "no worker reported its devices")
    logging.disable(logging.WARNING)  # the Workers page, rendered by AppTest: a screenful of bare-mode warnings
    main = sys.modules["__main__"]  # AppTest leaves app/main.py there: later spawned processes would run it
    try:
        from streamlit.testing.v1 import AppTest

        with mock.patch.dict(os.environ, {k: env[k] for k in ("TORCHDECK_HOME", "TORCHDECK_DATABASE_URL")}):
            at = AppTest.from_file(str(ROOT / "app" / "main.py"), default_timeout=60).run()
            devices = list(at.switch_page("app_pages/workers.py").run().dataframe[0].value["devices"])
    finally:
        logging.disable(logging.NOTSET)
        sys.modules["__main__"] = main
    return run, metric_keys(engine, run_id), devices


def check_stack(ctx: Ctx):
    home = ctx.out("stack")
    env = {k: v for k, v in os.environ.items() if not k.startswith("TORCHDECK_")}  # a stack of its own
    env.update(TORCHDECK_HOME=str(home), TORCHDECK_DATABASE_URL=f"sqlite:///{home / 'torchdeck.db'}")
    env.update(TORCHDECK_HEARTBEAT_S="1", TORCHDECK_SYS_METRICS_S="2")
    if not ctx.dry:  # the GPU named by its UUID, as a scheduler may name it: its metrics must still be read (NVML)
        env["CUDA_VISIBLE_DEVICES"] = f"GPU-{torch.cuda.get_device_properties(0).uuid}"
    cmd, log = [TORCHDECK, "up", "--no-ui"], open(home / "up.log", "ab")  # noqa: SIM115 - closed below
    up = subprocess.Popen(cmd, env=env, stdout=log, stderr=log, preexec_fn=lambda: die_with_parent(signal.SIGTERM))
    ctx.procs.append(up)
    try:
        wait_for(lambda: (home / "broker.url").exists(), 120, "torchdeck up did not start", up)
        run, keys, devices = stack_run(ctx, home, env)
    except Exception as e:  # noqa: BLE001 - failed, with the stack's logs
        logs = "".join(f"\n{p.name}: {p.read_text()[-800:]}" for p in sorted(home.glob("**/*.log")))
        return {}, False, f"{e.__class__.__name__}: {e}{logs}"
    finally:
        up.send_signal(signal.SIGTERM)  # `torchdeck up` stops its broker and workers
        up.wait(60)
        log.close()
    gpu_keys, exports = [k for k in keys if k.startswith("sys/gpu")], (run.summary or {}).get("export", {})
    named = any(d.startswith(ctx.pick("GPU 0", "CPU")) for d in devices)
    ok = run.status == "completed" and queue_of(run.spec) == "gpu" and named and exports and all(exports.values())
    why = f"run {run.status} on queue {queue_of(run.spec)} {run.error or ''}; sys/gpu metrics {gpu_keys or 'none'}"
    why += f"; Workers page {devices}; exports {exports}"
    return {"stack_sys_gpu_metrics": len(gpu_keys)}, bool(ok and (gpu_keys or ctx.dry)), why


def check_ddp(ctx: Ctx):
    if not ctx.dry and (n := torch.cuda.device_count()) < 2:
        return {}, None, f"one run on 2 GPUs needs 2 CUDA GPUs; this machine has {n}"
    base = {"data": {"name": "digits"}, "model": {"name": "mlp", "hidden": 32}, "device": ctx.device, "seed": 0}
    loop = {"epochs": ctx.pick(2, 1), "batch_size": 64, "log_every": 1, "steps_per_epoch": ctx.pick(None, 6)}
    base.update(train=loop, export={"formats": []}, deterministic=True)
    pair = (s1, m1), (s2, m2) = [train({**base, "resources": {"gpus": g}}, ctx.out(f"ddp/mlp{g}")) for g in (1, 2)]
    a, b = m1.series("train/loss"), m2.series("train/loss")
    worst = max((abs(x - y) / max(abs(x), 1e-8) for (_, x), (_, y) in zip(a, b)), default=math.inf)
    acc1, acc2, tol = *(max(values(m, "val/acc")) for m in (m1, m2)), ctx.pick(1e-2, 1e-5)
    ok = s1["status"] == s2["status"] == "completed" and len(a) == len(b) and worst <= tol and abs(acc1 - acc2) <= 0.02
    if not ctx.dry:  # the speed-up on a model worth splitting: ResNet-18, 64 px, global batch 256
        speed = synthetic(ctx, "resnet18", "bf16", batch_size=256, steps_per_epoch=30, epochs=3, log_every=10)
        speed["data"].update(size=64, num_samples=9000)
        pair = [train({**speed, "resources": {"gpus": g}}, ctx.out(f"ddp/resnet{g}")) for g in (1, 2)]
    one, two = (statistics.median(values(m, "epoch_time_s")[-2:]) for _, m in pair)
    ok = ok and all(s["status"] == "completed" for s, _ in pair) and (ctx.dry or one / two >= 1.0)
    why = f"train/loss over {len(a)} steps: worst relative difference {worst:.2e} (need ≤ {tol}); val/acc {acc1:.3f}"
    figures = {"ddp2_train_loss_max_rel_diff": worst, "ddp2_vs_single_throughput": round(one / two, 3)}
    return figures, ok, why + f" vs {acc2:.3f}; epoch seconds: 1 process {one:.2f}, 2 processes {two:.2f}"


CHECKS = {"digits": check_digits, **{p: lambda ctx, p=p: precision_run(ctx, p) for p in ("bf16", "fp32")}}
CHECKS.update(fp16=check_fp16, throughput=check_throughput, photos=check_photos, stack=check_stack, ddp=check_ddp)
CHECKS["compile"] = check_compile  # last: inductor's first compile is the least predictable in time


def run_one(name: str, ctx: Ctx) -> dict:
    t0 = time.monotonic()
    try:
        figures, ok, why = CHECKS[name](ctx)  # ok None: the check does not apply here, `why` says why
        result = {"status": {True: "passed", False: "failed", None: "skipped"}[ok], "reason": why, "figures": figures}
    except Exception as e:  # noqa: BLE001 - a check that raised failed; the others still run
        result = {"status": "failed", "reason": f"{e.__class__.__name__}: {e}", "figures": {}}
    torch.cuda.empty_cache()  # (nothing without CUDA)
    return {**result, "seconds": round(time.monotonic() - t0, 1)}


def say(name: str, r: dict) -> None:
    took = f" ({r['seconds']} s)" if "seconds" in r else ""
    print(f"# {name}{took}: {r['reason']}".replace("\n", "\n# "), flush=True)
    for k, v in r.get("figures", {}).items():
        print(f"{k}={v}", flush=True)
    print(f"{name}={r['status']}", flush=True)


def finish(report: dict, path: Path, work: Path) -> int:
    ok = report["passed"] = all(r["status"] in ("passed", "skipped") for r in report["checks"].values())
    path.write_text(json.dumps(report, indent=2, default=str))
    if ok:  # the work folder goes (with its temporary folder when the report is elsewhere)
        shutil.rmtree(work if path.parent == work.parent else work.parent, ignore_errors=True)
    else:
        print(f"# kept for a look: {work}", flush=True)
    print(f"gpu_check={'passed' if ok else 'failed'}\nreport={path}", flush=True)
    return 0 if ok else 1


def run_all(names: list[str], ctx: Ctx, report: dict, path: Path) -> int:
    """Each check in turn; at the deadline a watchdog reports the one running as timed_out, the rest not_run."""
    checks, lock = report["checks"], threading.Lock()
    checks.update({n: {"status": "not_run", "reason": "the time budget ran out before it"} for n in names})

    def out_of_time() -> None:
        with lock:
            if all(checks[n]["status"] != "not_run" for n in names):
                return  # all done: the main thread reports
            for n in [n for n in names if checks[n]["status"] == "not_run"]:
                if checks[n].pop("running", False):
                    checks[n].update(status="timed_out", reason="still running when the time budget ran out")
                say(n, checks[n])
            for p in ctx.procs:
                p.poll() is None and p.send_signal(signal.SIGTERM)
            os._exit(finish(report, path, ctx.work))

    watchdog = threading.Timer(max(0.0, ctx.deadline - time.monotonic()), out_of_time)
    watchdog.daemon = True
    watchdog.start()
    for n in names:
        checks[n]["running"] = True
        r = run_one(n, ctx)
        with lock:
            checks[n] = r
            say(n, r)
    with lock:
        watchdog.cancel()
        return finish(report, path, ctx.work)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--dry-run", action="store_true", help="every check on the CPU, tiny sizes")
    ap.add_argument("--only", action="append", choices=list(CHECKS), help="run this check (repeatable)")
    ap.add_argument("--report", type=Path, help="the JSON report (default: report.json in a new temporary folder)")
    ap.add_argument("--budget-s", type=float, default=480, help="checks not done by then are reported as not run")
    ap.add_argument("--require-cuda", action="store_true", help="without --dry-run: no CUDA device is an error")
    args, start, cuda = ap.parse_args(), time.monotonic(), torch.cuda.is_available()
    if not cuda and not args.dry_run and args.require_cuda:
        print("no CUDA device is visible here (driver, CUDA_VISIBLE_DEVICES, a CUDA build of torch?)", file=sys.stderr)
        return 2
    tmp = Path(tempfile.mkdtemp(prefix="torchdeck-gpu-check-"))
    ctx = Ctx(args.dry_run or not cuda, tmp / "work", start + args.budget_s)
    device, gpus = torch.cuda.get_device_name(0) if cuda and not ctx.dry else "cpu", torch.cuda.device_count()
    print(f"mode={ctx.pick('cuda', 'dry-run')}\ndevice={device}\ngpus={gpus}\ntorch={torch.__version__}", flush=True)
    if ctx.dry and not args.dry_run:
        print("# no CUDA device here: running the CPU dry run instead", flush=True)
    report = {"mode": ctx.pick("cuda", "dry-run"), "device": device, "gpus": gpus, "torch": torch.__version__}
    report.update(budget_s=args.budget_s, checks={})
    return run_all(args.only or list(CHECKS), ctx, report, (args.report or tmp / "report.json").resolve())


if __name__ == "__main__":
    raise SystemExit(main())
