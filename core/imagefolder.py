"""ImageFolder datasets from a folder or a .zip: one sub-folder per class.

Bad input is refused with a message that names the problem and the files:
missing path, not a zip, fewer than two classes, an empty class, too many
unreadable images. Mixed grayscale/RGB/RGBA images are converted to one mode.
"""

from __future__ import annotations

import io
import warnings
import zipfile
from pathlib import Path, PurePosixPath

import numpy as np
import torch

from core.names import IMAGE_EXTENSIONS, MAX_IMAGE_PIXELS

IMAGE_EXTS = frozenset(IMAGE_EXTENSIONS)
GRAY_MODES = ("L", "1", "I;16", "I;16L", "I;16B", "I;16N", "I", "F")
ALPHA_MODES = ("RGBA", "LA", "PA", "P", "La", "RGBa")


class DataError(ValueError):
    """A dataset that cannot be used, with what is wrong and how to fix it."""


class DataNotFoundError(DataError, FileNotFoundError):
    """The dataset's path does not exist (also a FileNotFoundError for callers that catch that)."""


def _is_hidden(parts: tuple[str, ...]) -> bool:
    return any(p.startswith(".") or p == "__MACOSX" for p in parts)


class _Source:
    """Reads member bytes from a folder or a zip; picklable for DataLoader workers."""

    def __init__(self, root: Path):
        self.root = root
        self.is_zip = root.is_file()
        self._zf: zipfile.ZipFile | None = None

    def __getstate__(self) -> dict:
        return {"root": self.root, "is_zip": self.is_zip, "_zf": None}

    def names(self) -> list[str]:
        """Every member, folders included (with a trailing '/') so that empty class folders are seen."""
        if self.is_zip:
            return self._zip().namelist()
        return [p.relative_to(self.root).as_posix() + ("/" if p.is_dir() else "") for p in self.root.rglob("*")]

    def read(self, name: str) -> bytes:
        if self.is_zip:
            return self._zip().read(name)
        return (self.root / name).read_bytes()

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


def _decode(data: bytes, mode: str, size: int, interpolation: str = "bilinear") -> np.ndarray:
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


class LazyImages:
    """Images decoded per item (large folders); indexable like a uint8 (N, C, H, W) tensor."""

    def __init__(self, source: _Source, files: list[str], mode: str, size: int, interpolation: str = "bilinear"):
        self.source, self.files, self.mode, self.size = source, files, mode, size
        self.interpolation = interpolation
        self.shape = (len(files), 1 if mode == "L" else 3, size, size)

    def __len__(self) -> int:
        return len(self.files)

    def __getitem__(self, i: int) -> torch.Tensor:
        return torch.from_numpy(_decode(self.source.read(self.files[int(i)]), self.mode, self.size, self.interpolation))

    def subset(self, idx: np.ndarray) -> LazyImages:
        return LazyImages(self.source, [self.files[i] for i in idx], self.mode, self.size, self.interpolation)

    def sample_tensor(self, n: int, seed: int) -> torch.Tensor:
        idx = np.random.default_rng(seed).permutation(len(self))[:n]
        return torch.stack([self[i] for i in idx])


Entry = tuple[str, tuple[str, ...], bool]  # (member name, path parts, is a folder)


def _unwrap(entries: list[Entry]) -> list[Entry]:
    """A zip often wraps the classes in one top folder (dataset/cat/1.png): look inside it.
    Loose top-level files (README) do not stop this; a top folder holding images itself does."""
    while True:
        tops = {p[0] for _, p, is_dir in entries if is_dir or len(p) > 1}
        deeper = any(len(p) > 2 or (is_dir and len(p) > 1) for _, p, is_dir in entries)
        own_images = any(
            len(p) == 2 and not d and PurePosixPath(p[1]).suffix.lower() in IMAGE_EXTS for _, p, d in entries
        )
        if len(tops) != 1 or not deeper or own_images:
            return entries
        top = tops.pop()
        entries = [(n, p[1:], d) for n, p, d in entries if p[0] == top and len(p) > 1]


SPLIT_FOLDERS = ("train", "val", "test")  # <root>/train/<class>/…, optional <root>/val/…, <root>/test/…


def _split_layout(entries: list[Entry]) -> tuple[str, ...]:
    """The split folders of a train/ [val/] test/ layout, in SPLIT_FOLDERS' order; () for one folder of classes.
    Only when every top-level folder is a split's, train/ among them, and train/ holds class folders of images."""
    tops = {p[0] for _, p, d in entries if d or len(p) > 1}
    nested = any(len(p) >= 3 and p[0] == "train" and not d for _, p, d in entries)
    if "train" not in tops or not tops <= set(SPLIT_FOLDERS) or not nested:
        return ()
    return tuple(s for s in SPLIT_FOLDERS if s in tops)


def _in_part(entries: list[Entry], part: str | None, label: str) -> list[Entry]:
    """The entries of split folder `part` (train when None) of a split layout, as if it were the root;
    a folder of classes is its own train part and has no other."""
    parts = _split_layout(entries)
    if not parts:
        if part not in (None, "train"):
            raise DataError(f"{label} has no {part}/ folder (a split layout: <root>/train/<class>/…, <root>/{part}/…)")
        return entries
    part = part or "train"
    if part not in parts:
        raise DataError(f"{label} has no {part}/ folder beside {', '.join(p + '/' for p in parts)}")
    return [(n, p[1:], d) for n, p, d in entries if p[0] == part and len(p) > 1]


def _entries(source: _Source) -> list[Entry]:
    entries = [(n, PurePosixPath(n).parts, n.endswith("/")) for n in source.names()]
    return _unwrap([e for e in entries if e[1] and not _is_hidden(e[1])])


def folder_parts(path: str) -> tuple[str, ...]:
    """The split folders (train, val, test) of an image folder or zip laid out that way; () for one of classes."""
    return _split_layout(_entries(_open(path)))


def _class_files(source: _Source, label: str, part: str | None = None) -> dict[str, list[str]]:
    entries = _in_part(_entries(source), part, label)
    classes: dict[str, list[str]] = {}
    for name, p, is_dir in entries:
        if len(p) < 2 and not is_dir:
            continue  # files at the top level belong to no class
        files = classes.setdefault(p[0], [])
        if not is_dir and PurePosixPath(name).suffix.lower() in IMAGE_EXTS:
            files.append(name)
    if len(classes) < 2:
        raise DataError(
            f"{label}: an image folder needs at least 2 class sub-folders, found {len(classes)} "
            f"({', '.join(sorted(classes)) or 'none'}). Expected layout: <root>/<class>/<image>.png"
        )
    empty = sorted(c for c, f in classes.items() if not f)
    if empty:
        raise DataError(
            f"{label}: class folder(s) with no images: {', '.join(empty)} "
            f"(image files end in {', '.join(sorted(IMAGE_EXTS))}); add images or remove the folder(s)"
        )
    return {c: sorted(classes[c]) for c in sorted(classes)}


def _open(path: str) -> _Source:
    root = Path(path).expanduser()
    if not root.exists():
        raise DataNotFoundError(f"data.path not found: {root} (give a folder or a .zip with one sub-folder per class)")
    if root.is_file() and not zipfile.is_zipfile(root):
        raise DataError(f"data.path {root} is a file but not a zip archive; give a folder or a .zip of class folders")
    return _Source(root)


def _choose_mode(source: _Source, files: list[str]) -> str:
    """Grayscale only when every image is; otherwise RGB (RGBA/P are composited on white)."""
    from PIL import Image

    for name in files:
        try:
            with Image.open(io.BytesIO(source.read(name))) as im:
                if im.mode not in GRAY_MODES:
                    return "RGB"
        except Exception:  # noqa: BLE001 - counted as unreadable later
            continue
    return "L"


def load_imagefolder(
    path: str,
    size: int,
    max_bad_fraction: float,
    cache_mb: int,
    interpolation: str = "bilinear",
    *,
    part: str | None = None,
    mode: str | None = None,
):
    """Return (images, labels, class_names, skipped_files). images is a uint8 tensor when it fits
    in `cache_mb`, else a LazyImages that decodes per item (unreadable files already removed). A folder laid out
    as train/ [val/] test/ is read from `part` (train when None); `mode` (L or RGB) imposes the training split's."""
    source = _open(path)
    classes = _class_files(source, path if part is None else f"{path} ({part}/)", part)
    files = [f for c in classes for f in classes[c]]
    labels_all = [i for i, c in enumerate(classes) for _ in classes[c]]
    mode = mode or _choose_mode(source, files)
    channels = 1 if mode == "L" else 3
    eager = len(files) * channels * size * size <= cache_mb * 2**20
    decoded, good, labels, skipped = [], [], [], []
    for f, y in zip(files, labels_all, strict=True):
        try:
            arr = _decode(source.read(f), mode, size, interpolation)  # each file decoded once: corrupt ones found now
        except ImageTooLarge as e:
            skipped.append(f"{f} ({e})")
            continue
        except Exception:  # noqa: BLE001 - a corrupt file is skipped and counted
            skipped.append(f)
            continue
        if eager:
            decoded.append(arr)
        good.append(f)
        labels.append(y)
    if files and len(skipped) / len(files) > max_bad_fraction:
        raise DataError(
            f"{path}: {len(skipped)} of {len(files)} images are unreadable "
            f"(more than data.max_bad_fraction={max_bad_fraction}), e.g. {', '.join(skipped[:5])}"
        )
    counts = np.bincount(np.asarray(labels, dtype=np.int64), minlength=len(classes))
    if (counts == 0).any():
        lost = [c for c, n in zip(classes, counts, strict=True) if n == 0]
        raise DataError(
            f"{path}: every image of class(es) {', '.join(lost)} is unreadable, e.g. {', '.join(skipped[:5])}"
        )
    y = torch.as_tensor(labels, dtype=torch.int64)
    images = torch.from_numpy(np.stack(decoded)) if eager else LazyImages(source, good, mode, size, interpolation)
    return images, y, list(classes), skipped
