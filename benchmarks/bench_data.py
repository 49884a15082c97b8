"""torchdeck's image-folder loader against torchvision's ImageFolder + DataLoader on the same photos: images/s of the
training batches (no model), side by side in one run.

    python benchmarks/bench_data.py [--images 5000] [--workers CORES] [--batch 64] [--threads WORKERS] [--repeats 2]

Data: --images 640×480 RGB JPEGs (quality 90, about 60 KB each), made by the benchmark in a temporary folder as
<root>/<class>/<i>.jpg, 10 classes: smooth random colour gradients and blobs drawn at 1/8 resolution, upsampled,
plus a mid-frequency texture and mild noise (photo-like enough for JPEG's work per image; their making is not
timed). Every side then reads them from the page cache, as a second epoch on a real machine would.

torchdeck: data.name=imagefolder, image_size 224, preprocess.resize_ratio 256/224 (shorter side 256, centre
square kept), val_fraction 0.1, test_split none, augment random_resized_crop + hflip, loader.num_workers --workers,
device cpu. Timed: load_data (the folder read and decoded, the split, the statistics), make_batches, Preprocess,
then per epoch set_epoch and, for every batch, Preprocess(x, epoch_generator(seed, epoch)): the augmented,
normalised float batch of 224 px the model would get. It runs in a fresh process set up as a worker's run process
is (core.process.keep_large_allocations; torch imported before the clock starts, as a worker's spare process has
it). $TORCHDECK_IMAGE_CACHE points to a fresh empty folder for each measured side (a cold start); a second load_data
of the same spec, in another fresh process, is the start-up of a second run on this machine (the on-disk cache
reused). Run twice: with data.cache_mb at its default (the set held
in memory) and with data.cache_mb --small-cache-mb (the set does not fit: served from the on-disk cache).

torchvision: datasets.ImageFolder over the same number of training images (per class, all but a tenth: torchdeck's
split keeps its validation tenth out of training; torchdeck's start-up still decodes that tenth, torchvision never
reads it) with v2 RandomResizedCrop(224, antialias=True), RandomHorizontalFlip, ToImage, ToDtype(float32, scaled),
Normalize (ImageNet's mean/std), DataLoader(batch --batch, shuffle, num_workers --workers, persistent_workers
False; its default fork start), decoding every JPEG every epoch. Its crop is taken from the full 640×480 image,
torchdeck's from the stored 256-px square (its documented preprocessing): the same output batches, not the same
pixels. Both sides: torch.set_num_threads(--threads) in this process (default --workers: torchvision decodes and
crops in its worker processes, torchdeck augments whole batches in this one, so both use the same cores), the same
batch size and worker processes.

Figures: first epoch = training images / (start-up + epoch 1) seconds; cached epoch = images/s over epochs 2 to
1 + --cached-epochs. --repeats repeats, alternating which side goes first; each repeat's figures, then the
median with min and max. Also the decoders alone, one thread: ms per 640×480 JPEG to a 256-px shorter side with
PIL, PIL after Image.draft (no gain here: its next scale, 1/2, would be under 256 px) and torchvision.io.decode_jpeg
+ v2.functional.resize.

Measured here (2 cores, a quiet machine, --images 5000 --repeats 2, workers 2): imagefolder_vs_torchvision_first_epoch
1.19 (per repeat 1.13 and 1.26) and imagefolder_vs_torchvision_cached_epoch 4.71 (4.68, 4.74); with the set served
from the on-disk cache, 1.15 and 4.26. Start-up about 6.3 s (the 5,000 JPEGs decoded by 2 threads at about 1.1 ms
each, wall time), 0.35 s for a second run reading the cache; decode_ms_torchvision 1.69 against decode_ms_pil 4.11.

Last lines: imagefolder_vs_torchvision_first_epoch= (target ≥ 1.0, start-up included) and
imagefolder_vs_torchvision_cached_epoch= (target ≥ 2.0): medians of the per-repeat ratios of images/s.
"""

from __future__ import annotations

import argparse
import io
import math
import multiprocessing as mp
import os
import shutil
import statistics
import sys
import tempfile
import time
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from functools import partial
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # run from anywhere without installing

import numpy as np
import torch
from torch.utils.data import DataLoader

from core.batches import epoch_generator, make_batches
from core.config import RunSpec
from core.data import Preprocess, load_data
from core.process import keep_large_allocations

CACHE_ENV = "TORCHDECK_IMAGE_CACHE"  # core/image_cache.py's on-disk cache folder
W, H, SIDE, STORED, CLASSES, VAL_FRACTION = 640, 480, 224, 256, 10, 0.1
IMAGENET_MEAN, IMAGENET_STD = [0.485, 0.456, 0.406], [0.229, 0.224, 0.225]
JPEG_KB = 70  # a generated image on disk, rounded up


def _photo(rng: np.random.Generator):
    """A 640×480 photo-like RGB image: a colour gradient and blobs at 1/8 resolution, upsampled, plus texture."""
    from PIL import Image

    h, w = H // 8, W // 8
    yy, xx = np.mgrid[0:h, 0:w].astype(np.float32)
    a = rng.uniform(0, 2 * np.pi)
    t = xx * np.cos(a) + yy * np.sin(a)
    t = (t - t.min()) / (np.ptp(t) + 1e-6)
    c0, c1 = rng.uniform(0, 255, (2, 3)).astype(np.float32)
    img = c0 + (c1 - c0) * t[..., None]
    for _ in range(rng.integers(4, 10)):
        cy, cx, r = rng.uniform(0, h), rng.uniform(0, w), rng.uniform(2, 15)
        m = (np.exp(-((yy - cy) ** 2 + (xx - cx) ** 2) / (2 * r * r)) * rng.uniform(0.5, 1.0))[..., None]
        img = img * (1 - m) + rng.uniform(0, 255, 3).astype(np.float32) * m
    big = Image.fromarray(img.clip(0, 255).astype(np.uint8)).resize((W, H), Image.Resampling.BICUBIC)
    tex = rng.integers(0, 33, (H // 2, W // 2, 3)).astype(np.uint8)
    tex = Image.fromarray(tex).resize((W, H), Image.Resampling.BILINEAR)
    arr = np.asarray(big, dtype=np.int16) + np.asarray(tex, dtype=np.int16) - 16
    arr += rng.integers(-4, 5, (H, W, 3), dtype=np.int16)
    return Image.fromarray(arr.clip(0, 255).astype(np.uint8))


def _write_images(job: tuple[str, list[int], int]) -> int:
    root, indices, seed = job
    for i in indices:
        folder = Path(root) / f"class_{i % CLASSES}"
        folder.mkdir(parents=True, exist_ok=True)
        _photo(np.random.default_rng(seed * 1_000_003 + i)).save(folder / f"{i:06d}.jpg", "JPEG", quality=90)
    return len(indices)


def make_folder(root: Path, n: int, seed: int, procs: int) -> float:
    """`n` JPEGs under root/<class>/, made by `procs` processes; returns the seconds it took."""
    t0 = time.perf_counter()
    jobs = [(str(root), list(range(k, n, 8 * procs)), seed) for k in range(8 * procs)]
    with ProcessPoolExecutor(procs, mp_context=mp.get_context("spawn")) as pool:
        assert sum(pool.map(_write_images, jobs)) == n
    return time.perf_counter() - t0


def training_files(root: Path) -> frozenset[str]:
    """Per class, all files but a tenth (torchdeck holds a stratified tenth out for validation)."""
    keep = []
    for folder in sorted(p for p in root.iterdir() if p.is_dir()):
        files = sorted(folder.iterdir())
        keep += [str(f) for f in files[: len(files) - round(len(files) * VAL_FRACTION)]]
    return frozenset(keep)


@dataclass
class Side:
    first: float  # images/s of epoch 1, start-up included
    cached: float  # images/s of the later epochs
    startup: float = math.nan  # seconds of load_data (torchdeck) or of making the dataset and loader
    second: float = math.nan  # seconds of load_data in a second process (torchdeck)
    held: str = ""  # what the training split's images were held as (torchdeck)


def _timed_epochs(epoch, first_images_since: float, cached_epochs: int) -> tuple[float, float]:
    """(images/s of epoch 1 counted from `first_images_since`, images/s of the next `cached_epochs` epochs);
    epoch(e) runs epoch e and returns its images."""
    n = epoch(1)
    first = n / (time.perf_counter() - first_images_since)
    t0 = time.perf_counter()
    m = sum(epoch(e) for e in range(2, 2 + cached_epochs))
    return first, m / (time.perf_counter() - t0)


def torchvision_side(root: Path, keep: frozenset[str], args: argparse.Namespace) -> Side:
    from torchvision import datasets
    from torchvision.transforms import v2

    t0 = time.perf_counter()
    tf = v2.Compose(
        [
            v2.RandomResizedCrop(SIDE, antialias=True),
            v2.RandomHorizontalFlip(),
            v2.ToImage(),
            v2.ToDtype(torch.float32, scale=True),
            v2.Normalize(IMAGENET_MEAN, IMAGENET_STD),
        ]
    )
    ds = datasets.ImageFolder(str(root), transform=tf, is_valid_file=keep.__contains__)
    dl = DataLoader(ds, batch_size=args.batch, shuffle=True, num_workers=args.workers, persistent_workers=False)
    startup = time.perf_counter() - t0

    def epoch(_: int) -> int:
        return sum(len(y) for _, y in dl)

    first, cached = _timed_epochs(epoch, t0, args.cached_epochs)
    return Side(first, cached, startup)


def spec_dict(root: Path, args: argparse.Namespace, cache_mb: int | None = None) -> dict:
    data = {
        "name": "imagefolder",
        "path": str(root),
        "image_size": SIDE,
        "val_fraction": VAL_FRACTION,
        "test_split": "none",
        "preprocess": {"resize_ratio": STORED / SIDE},
        "augment": {"random_resized_crop": True, "hflip": True},
    }
    if cache_mb is not None:
        data["cache_mb"] = cache_mb
    return {"data": data, "loader": {"num_workers": args.workers}, "device": "cpu", "seed": 0}


def _load_seconds(spec: dict, cache_dir: Path, threads: int) -> float:
    """load_data's seconds in this (fresh) process: the start-up of a second run on this machine."""
    keep_large_allocations()
    torch.set_num_threads(threads)
    os.environ[CACHE_ENV] = str(cache_dir)
    s = RunSpec.from_dict(spec)
    t0 = time.perf_counter()
    load_data(s.data, s.seed, s.model)
    return time.perf_counter() - t0


def _torchdeck_epoch(batches, pre: Preprocess, seed: int, e: int) -> int:
    """Epoch `e` as the training loop draws it: every batch augmented and normalised; returns its images."""
    cpu = torch.device("cpu")
    batches.set_epoch(e)
    gen, n = epoch_generator(seed, e, cpu), 0
    for x, y in batches:
        pre(x, gen)
        n += len(y)
    return n


def _torchdeck_run(spec_d: dict, cache_dir: Path, args: argparse.Namespace) -> Side:
    """torchdeck's side, in a fresh process set up as a worker's run process is (worker/child.py: glibc keeps large
    blocks for reuse; its imports done before the run starts, as a spare process has them)."""
    keep_large_allocations()
    torch.set_num_threads(args.threads)
    os.environ[CACHE_ENV] = str(cache_dir)
    spec, cpu = RunSpec.from_dict(spec_d), torch.device("cpu")
    t0 = time.perf_counter()
    bundle = load_data(spec.data, spec.seed, spec.model)
    startup = time.perf_counter() - t0
    batches = make_batches(bundle.train, args.batch, True, cpu, spec.seed, spec.loader)
    pre = Preprocess(bundle.info, spec.data.augment, cpu)
    first, cached = _timed_epochs(partial(_torchdeck_epoch, batches, pre, spec.seed), t0, args.cached_epochs)
    held = f"{type(bundle.train.images).__name__} via {type(batches).__name__}"
    return Side(first, cached, startup, held=held)


def torchdeck_side(spec_d: dict, cache_dir: Path, args: argparse.Namespace) -> Side:
    spawn = mp.get_context("spawn")
    with spawn.Pool(1) as pool:
        side = pool.apply(_torchdeck_run, (spec_d, cache_dir, args))
    with spawn.Pool(1) as pool:  # a second run: a new process, the same cache folder
        side.second = pool.apply(_load_seconds, (spec_d, cache_dir, args.threads))
    return side


def decode_ms(files: list[Path], rounds: int = 3) -> dict[str, float]:
    """ms per JPEG (bytes in memory) to a 256-px shorter side, one thread, the best of `rounds` rounds."""
    from PIL import Image
    from torchvision.io import decode_jpeg
    from torchvision.transforms.v2 import functional as TF

    blobs = [f.read_bytes() for f in files]
    size = (round(STORED * W / H), STORED)

    def pil(data: bytes, draft: bool) -> object:
        with Image.open(io.BytesIO(data)) as im:
            if draft:
                im.draft("RGB", size)
            return im.convert("RGB").resize(size, Image.Resampling.BILINEAR)

    ways = {
        "decode_ms_pil": lambda d: pil(d, False),
        "decode_ms_pil_draft": lambda d: pil(d, True),
        "decode_ms_torchvision": lambda d: TF.resize(
            decode_jpeg(torch.frombuffer(bytearray(d), dtype=torch.uint8)), [STORED], antialias=True
        ),
    }
    threads, out = torch.get_num_threads(), {}
    torch.set_num_threads(1)
    for name, fn in ways.items():
        fn(blobs[0])  # warm
        best = math.inf
        for _ in range(rounds):
            t0 = time.perf_counter()
            for b in blobs:
                fn(b)
            best = min(best, time.perf_counter() - t0)
        out[name] = 1e3 * best / len(blobs)
    torch.set_num_threads(threads)
    return out


def preconditions(args: argparse.Namespace, where: Path) -> None:
    for module in ("PIL", "torchvision"):
        try:
            __import__(module)
        except ImportError as e:
            sys.exit(f"bench_data needs {module} ({e}): install the project's dependencies")
    if args.images < 10 * CLASSES or args.workers < 0 or args.batch < 1 or args.repeats < 1:
        sys.exit("need --images ≥ 100, --workers ≥ 0, --batch ≥ 1 and --repeats ≥ 1")
    # the JPEGs, and two cache entries (in memory + on disk sides) of N × 3 × 256² bytes, plus room to spare
    need = args.images * (JPEG_KB * 1024 + 2 * 3 * STORED * STORED) + 2**30
    free = shutil.disk_usage(where).free
    if free < need:
        sys.exit(f"{where}: {free / 2**30:.1f} GB free, the benchmark needs {need / 2**30:.1f} GB (--dir elsewhere)")
    ram = os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    print(f"# {os.cpu_count()} CPU cores, {ram / 2**30:.1f} GB RAM available, {free / 2**30:.1f} GB free in {where}")
    if args.images < 5000:
        print(f"# --images {args.images}: fewer than the issue's 5,000, a trial rather than the figure", flush=True)


def one_repeat(r: int, root: Path, keep: frozenset[str], args: argparse.Namespace, tmp: Path) -> dict[str, Side]:
    """Both sides once (torchvision first in even repeats), torchdeck's in-memory then its on-disk-cache variant,
    each with a fresh cache folder."""
    sides: dict[str, Side] = {}
    order = ["torchvision", "torchdeck"] if r % 2 == 0 else ["torchdeck", "torchvision"]
    print(f"# repeat {r + 1}: load {' '.join(f'{x:.2f}' for x in os.getloadavg())} at its start", flush=True)
    for who in order:
        if who == "torchvision":
            sides["torchvision"] = torchvision_side(root, keep, args)
            continue
        for name, cache_mb in (("imagefolder", None), ("imagefolder_disk_cache", args.small_cache_mb)):
            cache = tmp / f"cache-{r}-{name}"
            sides[name] = torchdeck_side(spec_dict(root, args, cache_mb), cache, args)
            shutil.rmtree(cache, ignore_errors=True)
    for name, s in sides.items():
        extra = f", second run {s.second:.2f} s, {s.held}" if name != "torchvision" else ""
        print(
            f"repeat {r + 1} ({order[0]} first) {name}: first epoch {s.first:.1f} img/s, cached epoch "
            f"{s.cached:.1f} img/s, start-up {s.startup:.2f} s{extra}",
            flush=True,
        )
    return sides


def spread(name: str, values: list[float], digits: int = 3) -> str:
    """`name=median`, after a comment line with each repeat's value, min and max."""
    each = ", ".join(f"{v:.{digits}f}" for v in values)
    print(f"# {name}: per repeat {each}; min {min(values):.{digits}f}, max {max(values):.{digits}f}")
    return f"{name}={statistics.median(values):.{digits}f}"


def report(results: list[dict[str, Side]], decode: dict[str, float]) -> None:
    lines = []
    for name in ("torchvision", "imagefolder", "imagefolder_disk_cache"):
        for kind in ("first", "cached"):
            lines.append(spread(f"{name}_{kind}_epoch_images_per_s", [getattr(r[name], kind) for r in results], 1))
    for name in ("imagefolder", "imagefolder_disk_cache"):
        lines.append(spread(f"{name}_startup_s", [r[name].startup for r in results], 2))
        lines.append(spread(f"{name}_second_run_startup_s", [r[name].second for r in results], 2))
    lines += [f"{k}={v:.2f}" for k, v in decode.items()]
    for name in ("imagefolder_disk_cache", "imagefolder"):
        for kind in ("first", "cached"):
            ratios = [getattr(r[name], kind) / getattr(r["torchvision"], kind) for r in results]
            lines.append(spread(f"{name}_vs_torchvision_{kind}_epoch", ratios))
    print("\n".join(lines), flush=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--images", type=int, default=5000, help="JPEGs generated (640×480, 10 classes)")
    ap.add_argument("--workers", type=int, default=os.cpu_count() or 1, help="loader processes, both sides")
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument(
        "--threads",
        type=int,
        default=None,
        help="torch.set_num_threads in this process, both sides (default: --workers)",
    )
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--cached-epochs", type=int, default=2, help="epochs after the first that are timed")
    ap.add_argument("--small-cache-mb", type=int, default=16, help="data.cache_mb of the on-disk-cache variant")
    ap.add_argument("--dir", type=Path, default=None, help="where the images and caches go (default: the temp dir)")
    ap.add_argument("--seed", type=int, default=0, help="seed of the generated images")
    args = ap.parse_args()
    args.threads = args.threads or args.workers  # the same cores for both: torchvision's in its worker processes
    where = args.dir or Path(tempfile.gettempdir())
    preconditions(args, where)
    torch.set_num_threads(args.threads)
    print(f"# load {' '.join(f'{x:.2f}' for x in os.getloadavg())} at the start", flush=True)
    with tempfile.TemporaryDirectory(dir=where, prefix="bench-data-") as d:
        tmp = Path(d)
        root = tmp / "images"
        seconds = make_folder(root, args.images, args.seed, max(1, os.cpu_count() or 1))
        keep = training_files(root)
        mb = sum(f.stat().st_size for f in root.rglob("*.jpg")) / 2**20
        print(f"# {args.images} JPEGs {W}×{H} ({mb:.0f} MB) made in {seconds:.1f} s; {len(keep)} training images")
        print(f"# workers {args.workers}, batch {args.batch}, threads {args.threads}", flush=True)
        decode = decode_ms(sorted(root.rglob("*.jpg"))[:100])
        results = [one_repeat(r, root, keep, args, tmp) for r in range(args.repeats)]
    print(f"# load {' '.join(f'{x:.2f}' for x in os.getloadavg())} at the end", flush=True)
    report(results, decode)


if __name__ == "__main__":
    main()
