"""Reading image files and decoding them to uint8 arrays at the stored side, in one thread or spread over several.

A JPEG is decoded at a reduced scale when the stored side is at most half of it (libjpeg's DCT scaling, PIL's
`draft`): a 640×480 photo stored at 128 px decodes at 320×240, then is resized like any other image. Any other
JPEG is decoded by torchvision's `decode_jpeg` (libjpeg-turbo) and resized by its uint8 kernel: about twice PIL's
speed here (both measured in benchmarks/bench_data.py). A folder is decoded by one thread per core (`decode_files`).
"""

from __future__ import annotations

import io
import os
import warnings
import zipfile
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor, wait
from pathlib import Path

import numpy as np

from core.names import MAX_IMAGE_PIXELS

GRAY_MODES = ("L", "1", "I;16", "I;16L", "I;16B", "I;16N", "I", "F")
ALPHA_MODES = ("RGBA", "LA", "PA", "P", "La", "RGBa")


class Source:
    """Reads member bytes from a folder or a zip; picklable for DataLoader workers."""

    def __init__(self, root: Path):
        self.root = root
        self.is_zip = root.is_file()
        self._zf: zipfile.ZipFile | None = None
        self._listed: list[tuple[str, os.DirEntry]] | None = None

    def __getstate__(self) -> dict:
        return {"root": self.root, "is_zip": self.is_zip, "_zf": None, "_listed": None}

    def _listing(self) -> list[tuple[str, os.DirEntry]]:
        """Every member of a folder (path relative to the root, its directory entry), walked once by scandir (a
        tenth of pathlib's time on 5,000 photos); folders linked in are listed, not entered (like Path.rglob)."""
        if self._listed is None:
            out, todo = [], [("", str(self.root))]
            while todo:
                prefix, folder = todo.pop()
                with os.scandir(folder) as entries:
                    for e in entries:
                        out.append((prefix + e.name, e))
                        if e.is_dir() and not e.is_symlink():
                            todo.append((f"{prefix}{e.name}/", e.path))
            self._listed = out
        return self._listed

    def names(self) -> list[str]:
        """Every member, folders included (with a trailing '/') so that empty class folders are seen."""
        if self.is_zip:
            return self._zip().namelist()
        return [name + ("/" if e.is_dir() else "") for name, e in self._listing()]

    def read(self, name: str) -> bytes:
        if self.is_zip:
            return self._zip().read(name)
        return (self.root / name).read_bytes()

    def stats(self) -> list[tuple[str, int, int]]:
        """(name, size, modification time in ns, or a zip member's CRC) of every member: what the data is."""
        if self.is_zip:
            return [(i.filename, i.file_size, i.CRC) for i in self._zip().infolist()]
        out = []
        for name, e in sorted(self._listing(), key=lambda m: m[0].split("/")):  # as paths sort: part by part
            if e.is_file():
                st = e.stat()
                out.append((name, st.st_size, st.st_mtime_ns))
        return out

    def _zip(self) -> zipfile.ZipFile:
        if self._zf is None:
            self._zf = zipfile.ZipFile(self.root)
        return self._zf


def _to_8bit(im):
    """16-bit and float grayscale → 8-bit L by scaling; PIL's own convert('L') clips them to white."""
    from PIL import Image

    arr = np.asarray(im, dtype=np.float64)
    if im.mode == "F":
        arr = arr * 255.0 if arr.size and arr.max() <= 1.0 else arr
    elif arr.size and arr.max() > 255:  # I;16 (and I holding 16-bit data): 0..65535
        arr = arr / 257.0
    return Image.fromarray(np.clip(arr.round(), 0, 255).astype(np.uint8), mode="L")


class ImageTooLarge(ValueError):
    """An image whose declared size is beyond MAX_IMAGE_PIXELS: never decoded."""


def too_many_pixels(e: Exception) -> str:
    """'225,000,000 pixels' from PIL's DecompressionBombError (raised before the size is known to us)."""
    import re

    found = re.search(r"\((\d+) pixels\)", str(e))
    return f"{int(found[1]):,} pixels" if found else "too many pixels"


def shorter_side(w: int, h: int, size: int) -> tuple[int, int]:
    """(w, h) scaled so that the shorter side is `size`, the longer one truncated as torchvision's Resize does."""
    return (size, max(size, int(size * h / w))) if w <= h else (max(size, int(size * w / h)), size)


def centre_box(w: int, h: int, size: int) -> tuple[int, int, int, int]:
    """PIL's crop box of the centred size × size square, offsets rounded as torchvision's center_crop does."""
    left, top = int(round((w - size) / 2.0)), int(round((h - size) / 2.0))
    return left, top, left + size, top + size


def decode(data: bytes, mode: str, size: int, interpolation: str = "bilinear") -> np.ndarray:
    """An image file as uint8 (C, size, size): its shorter side resized to `size` (aspect kept), centre-cropped."""
    from PIL import Image

    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", Image.DecompressionBombWarning)  # refused below, with our own limit
            im = Image.open(io.BytesIO(data))
    except Image.DecompressionBombError as e:  # over twice PIL's own limit: PIL refuses it while opening
        raise ImageTooLarge(f"{too_many_pixels(e)}, more than the {MAX_IMAGE_PIXELS / 1e6:.0f} MP accepted") from None
    with im:
        w, h = im.size
        if w * h > MAX_IMAGE_PIXELS:
            raise ImageTooLarge(f"{w}×{h} pixels, more than the {MAX_IMAGE_PIXELS / 1e6:.0f} MP accepted")
        if im.format == "JPEG" and im.mode in ("RGB", "L"):
            if min(w, h) >= 2 * size:
                im.draft(im.mode, shorter_side(w, h, size))  # a scaled DCT decode: 2, 4 or 8 times fewer pixels
            elif interpolation == "bilinear":
                return _jpeg(data, mode, w, h, size)
        im.load()
        if im.mode in ALPHA_MODES and mode == "RGB":
            im = im.convert("RGBA")
            bg = Image.new("RGBA", im.size, (255, 255, 255, 255))  # transparent → white
            im = Image.alpha_composite(bg, im)
        elif im.mode.startswith("I") or im.mode == "F":
            im = _to_8bit(im)
        im = im.convert(mode)
        if im.size != (size, size):
            w, h = shorter_side(*im.size, size)
            im = im.resize((w, h), getattr(Image.Resampling, interpolation.upper())).crop(centre_box(w, h, size))
        arr = np.array(im, dtype=np.uint8)  # a writable copy: torch refuses to share read-only buffers safely
    return arr[None] if arr.ndim == 2 else np.ascontiguousarray(arr.transpose(2, 0, 1))


def _jpeg(data: bytes, mode: str, w: int, h: int, size: int) -> np.ndarray:
    """A JPEG decoded by torchvision's libjpeg-turbo and resized by its uint8 antialiased bilinear kernel (PIL's
    algorithm): about twice as fast as PIL here (benchmarks/bench_data.py); most pixels are PIL's, none more than a
    few levels off (grayscale is the JPEG's own luma)."""
    import torch
    from torchvision.io import ImageReadMode, decode_jpeg
    from torchvision.transforms.v2 import functional as TF

    raw = torch.frombuffer(bytearray(data), dtype=torch.uint8)
    img = decode_jpeg(raw, mode=ImageReadMode.GRAY if mode == "L" else ImageReadMode.RGB)
    if (w, h) != (size, size):
        nw, nh = shorter_side(w, h, size)
        img = TF.resize(img, [nh, nw], antialias=True)
        left, top, _, _ = centre_box(nw, nh, size)
        img = img[:, top : top + size, left : left + size]
    return img.contiguous().numpy()


def processes(requested: int | None) -> int:
    """Decoding threads and loader processes: `requested` (loader.num_workers), else one per core this process may
    use, at most 16."""
    if requested is not None:
        return requested
    try:
        cores = len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        cores = os.cpu_count() or 1
    return max(1, min(16, cores))


def _decode_rows(source: Source, rows: list[tuple[int, str]], how: tuple, out: np.ndarray | None, done) -> dict:
    """Decode `rows` ((row, file)) into `out` (None: only check them); {row: why} for the unreadable ones. `done`
    (a one-element list) counts the files handled, for the progress."""
    mode, size, interpolation = how
    bad: dict[int, str] = {}
    for row, name in rows:
        try:
            arr = decode(source.read(name), mode, size, interpolation)
            if out is not None:
                out[row] = arr
        except ImageTooLarge as e:
            bad[row] = f"{name} ({e})"
        except Exception:  # noqa: BLE001 - a corrupt file is skipped and counted
            bad[row] = name
        done[0] += 1  # one writer per counter: each thread has its own
    return bad


def decode_files(
    root: Path,
    files: list[str],
    how: tuple[str, int, str],
    out: Path | np.ndarray | None,
    workers: int,
    progress: Callable[[int, int], None] | None = None,
) -> tuple[dict[int, str], int]:
    """Decode `files` of the folder or zip `root` (`how`: mode, side, interpolation) into row i of the uint8 file
    `out` (shape (len(files), C, side, side), already sized), or of the array `out` (None: only find the unreadable
    ones), spread over `workers` threads of this process, each a contiguous share. Returns ({row: why unreadable},
    threads used); `progress` (done, total) is called about twice a second.

    Threads, not processes: libjpeg, torchvision's resize and PIL's decoders and resampling release the GIL, so the
    threads keep as many cores busy as processes would, start at once and share the output. Measured here on 5,000
    640×480 JPEGs with 2 cores: 2 threads took 1.6 ms per image; 2 processes 4.8 ms, after 5.7 s spent starting a
    fork server able to decode (it imports torch)."""
    import torch

    rows = list(enumerate(files))
    shape = (len(files), 1 if how[0] == "L" else 3, how[1], how[1])
    workers = max(1, min(workers, len(files) // 64))  # a few files are not worth a thread
    mapped = isinstance(out, Path) and bool(files)
    arr = np.memmap(out, dtype=np.uint8, mode="r+", shape=shape) if mapped else out
    cut = np.linspace(0, len(rows), workers + 1).astype(int)
    counts = [[0] for _ in range(workers)]
    bad: dict[int, str] = {}
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # each resize on its own thread's core: torch's pool would put two on each
    try:
        with ThreadPoolExecutor(workers, thread_name_prefix="decode") as pool:
            jobs = [
                pool.submit(_decode_rows, Source(root), rows[a:b], how, arr, n)
                for a, b, n in zip(cut[:-1], cut[1:], counts, strict=True)
            ]
            pending = set(jobs)
            while pending:
                _, pending = wait(pending, timeout=0.5)
                if progress:
                    progress(min(sum(n[0] for n in counts), len(files)), len(files))
            for job in jobs:
                bad.update(job.result())  # an error beyond one file's (out of memory, a full disk) is raised here
    finally:
        torch.set_num_threads(threads)
    del arr  # a mapped file's pages are the kernel's: written to the disk by the caller's choice (image_cache)
    return bad, workers
