"""What refusing a costly input costs the dashboard (issue 22, "Inputs that cost too much").

    python benchmarks/bench_bounds.py            # 5 repeats of each
    python benchmarks/bench_bounds.py --quick    # 3 repeats, a 64 MB download

Prints `name=value` lines. For each case: the CPU seconds of this process (time.process_time, every thread:
Streamlit runs a page's script in a thread of its own) over the repeats, as the median with min and max,
then the peak of Python's allocations (tracemalloc) in one more run of its own (tracemalloc slows the code it
watches, so it never runs with the clock). Memory outside Python's allocator (PIL's decoded pixels,
libyaml's buffers) is not in the peak. Targets: every refusal within 0.5 s of CPU and 50 MB.

Cases:
- yaml_base60_1mb: a 1 MB spec `seed: 1:0:0:…` (PyYAML's base-60 integers: 18 s of CPU before);
- yaml_int_5000_digits: `seed: 777…` (an uncaught ValueError before);
- yaml_flat_list_1mb: `tags: [1,1,1,…]`, half a million values (9 s before);
- zip_600k_entries: an upload whose directory lists 600,000 entries (4 s and 206 MB before);
- giant_mlp_spec: `model.hidden: 8192` on 1024-px images, a 25.8 G-parameter MLP (accepted before);
- preview_page: the Datasets page previewing a dataset of 24 PNGs of 64 MP (each decoded and resized by
  Streamlit at every page run before, ~20 s); preview_thumbnails_once: making its thumbnails, once;
- download_stream: a download through the route (app/web/downloads.py), read through as a server sends it
  (the whole file held in memory before).
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import io
import os
import statistics
import struct
import sys
import tempfile
import time
import tracemalloc
import zipfile
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def measure(name: str, fn: Callable[[], object], repeats: int) -> None:
    """Print the CPU seconds of `repeats` calls (median, min, max) and the Python peak of one more."""
    times = []
    for _ in range(repeats):
        t = time.process_time()
        fn()
        times.append(time.process_time() - t)
    tracemalloc.start()
    try:
        fn()
        peak = tracemalloc.get_traced_memory()[1] / 2**20
    finally:
        tracemalloc.stop()
    print(f"{name}_cpu_s={statistics.median(times):.4f}")
    print(f"{name}_cpu_s_min={min(times):.4f}")
    print(f"{name}_cpu_s_max={max(times):.4f}")
    print(f"{name}_py_peak_mb={peak:.1f}", flush=True)


def refused(fn: Callable[[], object], kind: type[BaseException], says: str) -> Callable[[], None]:
    def run() -> None:
        try:
            fn()
        except kind as e:
            assert says in str(e), str(e)[:300]
            return
        raise AssertionError("not refused")

    return run


def crafted_zip(entries: int) -> bytes:
    """A zip (zip64) whose central directory lists `entries` empty files (as tests/app/test_upload_costs.py)."""
    head = struct.Struct("<4s4B4HL2L5H2L")
    names = (f"c{i % 2}/{i}.png".encode() for i in range(entries))
    directory = b"".join(
        head.pack(b"PK\x01\x02", 20, 3, 20, 0, 0, 0, 0, 0x21, 0, 0, 0, len(n), 0, 0, 0, 0, 0o100644 << 16, 0) + n
        for n in names
    )
    tail = struct.pack("<4sQ2H2L4Q", b"PK\x06\x06", 44, 45, 45, 0, 0, entries, entries, len(directory), 0)
    tail += struct.pack("<4sLQL", b"PK\x06\x07", 0, len(directory), 1)
    return directory + tail + struct.pack("<4s4H2LH", b"PK\x05\x06", 0, 0, 0xFFFF, 0xFFFF, len(directory), 0, 0)


def spec_cases(repeats: int) -> None:
    from core import bounded_yaml
    from core.config import RunSpec, SpecError

    base60 = "seed: 1" + ":0" * ((bounded_yaml.MAX_BYTES - 16) // 2) + "\n"
    measure("yaml_base60_1mb", refused(lambda: RunSpec.from_yaml(base60), SpecError, "seed"), repeats)
    digits = "seed: " + "7" * 5000 + "\n"
    measure("yaml_int_5000_digits", refused(lambda: RunSpec.from_yaml(digits), SpecError, "seed is a number"), repeats)
    flat = "tags: [" + "1," * 520_000 + "1]\n"
    measure("yaml_flat_list_1mb", refused(lambda: RunSpec.from_yaml(flat), SpecError, "more than 100,000"), repeats)
    giant = {"data": {"name": "synthetic", "image_size": 1024}, "model": {"name": "mlp", "hidden": 8192}}
    measure("giant_mlp_spec", refused(lambda: RunSpec.from_dict(giant), SpecError, "model.hidden=8192"), repeats)


def zip_case(engine, repeats: int) -> None:
    from app.services import datasets as ds

    data = crafted_zip(600_000)
    upload = lambda: ds.store_upload(engine, "many", io.BytesIO(data), len(data), owner="bench")  # noqa: E731
    measure("zip_600k_entries", refused(upload, ds.UploadRefused, "600,000 entries"), repeats)


def giant_pngs_zip() -> bytes:
    """24 PNGs of 8000×8000 (64 MP, the upload limit) in three classes; one image's bytes, 24 times."""
    from PIL import Image, ImageDraw

    im = Image.new("RGB", (8000, 8000), "white")
    ImageDraw.Draw(im).ellipse((1000, 1000, 7000, 7000), fill="steelblue")
    buf = io.BytesIO()
    im.save(buf, "PNG")
    png = buf.getvalue()
    out = io.BytesIO()
    with zipfile.ZipFile(out, "w", zipfile.ZIP_STORED) as zf:
        for i in range(24):
            zf.writestr(f"big/{('cat', 'dog', 'owl')[i % 3]}/{i:02d}.png", png)
    return out.getvalue()


def preview_cases(engine, repeats: int) -> None:
    import shutil

    from streamlit.testing.v1 import AppTest

    from app.services import dataset_previews
    from app.services import datasets as ds

    data = giant_pngs_zip()
    print(f"# preview dataset: 24 PNGs of 64 MP, a zip of {len(data) / 2**20:.1f} MB", flush=True)
    record = ds.store_upload(engine, "big", io.BytesIO(data), len(data), owner="bench")
    folder = dataset_previews.folder_for(Path(record.uri))

    def make_once() -> None:
        shutil.rmtree(folder, ignore_errors=True)
        dataset_previews.make(Path(record.uri))

    measure("preview_thumbnails_once", make_once, repeats)
    at = AppTest.from_file(str(ROOT / "app" / "main.py"), default_timeout=120)
    at.run()
    at.switch_page("app_pages/datasets.py")
    at.run()
    assert not at.exception and at.selectbox(key="ds.pick").value == "big"
    measure("preview_page", lambda: at.run(), repeats)
    print(f"# preview_page shows {len(at.image)} thumbnails; {ds.previews(record.uri).left_out} left out", flush=True)


def download_case(engine, home: Path, megabytes: int, repeats: int) -> None:
    from starlette.requests import Request

    from app.web import downloads
    from db import repo

    run = repo.create_run(engine, {}, name="bench")
    path = home / "artifacts" / "runs" / run.id / "best.pt"
    path.parent.mkdir(parents=True)
    with open(path, "wb") as f:
        for _ in range(megabytes):
            f.write(os.urandom(1 << 20))
    size, digest = path.stat().st_size, hashlib.sha256(path.read_bytes()).hexdigest()
    art = repo.add_artifact(engine, run.id, "checkpoint_best", path.as_uri(), size=size, sha256=digest)
    scope = {
        "type": "http",
        "method": "GET",
        "path": downloads.url(art.id),
        "headers": [],
        "query_string": b"",
        "client": ("127.0.0.1", 50000),
        "path_params": {"artifact_id": art.id},
    }

    def fetch() -> None:
        answer = downloads.download(Request(scope))

        async def drain() -> None:
            async for _ in answer.body_iterator:
                pass

        asyncio.run(drain())
        assert answer.status_code == 200

    measure(f"download_stream_{megabytes}mb", fetch, repeats)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="3 repeats, a 64 MB download")
    parser.add_argument("--repeats", type=int, default=None)
    args = parser.parse_args()
    repeats = args.repeats or (3 if args.quick else 5)
    home = Path(tempfile.mkdtemp(prefix="bench-bounds-"))
    os.environ.update(TORCHDECK_HOME=str(home), TORCHDECK_DATABASE_URL=f"sqlite:///{home / 'td.db'}")
    os.environ.pop("TORCHDECK_ARTIFACTS", None)
    os.environ.pop("TORCHDECK_MODE", None)
    from db.engine import make_engine
    from db.migrate import upgrade

    upgrade()
    engine = make_engine()
    print(f"# {os.cpu_count()} cores, load {os.getloadavg()[0]:.2f}, repeats {repeats}", flush=True)
    spec_cases(repeats)
    zip_case(engine, repeats)
    preview_cases(engine, repeats)
    download_case(engine, home, 64 if args.quick else 256, repeats)


if __name__ == "__main__":
    main()
