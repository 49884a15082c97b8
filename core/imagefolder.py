"""ImageFolder datasets from a folder or a .zip: one sub-folder per class.

Bad input is refused with a message that names the problem and the files:
missing path, not a zip, fewer than two classes, an empty class, too many
unreadable images. Mixed grayscale/RGB/RGBA images are converted to one mode.
"""

from __future__ import annotations

import io
import zipfile
from pathlib import Path, PurePosixPath

import numpy as np
import torch

IMAGE_EXTS = {".png", ".jpg", ".jpeg", ".bmp", ".gif", ".webp", ".tif", ".tiff"}


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
        if self.is_zip:
            return [n for n in self._zip().namelist() if not n.endswith("/")]
        return [p.relative_to(self.root).as_posix() for p in self.root.rglob("*") if p.is_file()]

    def read(self, name: str) -> bytes:
        if self.is_zip:
            return self._zip().read(name)
        return (self.root / name).read_bytes()

    def _zip(self) -> zipfile.ZipFile:
        if self._zf is None:
            self._zf = zipfile.ZipFile(self.root)
        return self._zf


def _decode(data: bytes, mode: str, size: int) -> np.ndarray:
    from PIL import Image

    with Image.open(io.BytesIO(data)) as im:
        im.load()
        if im.mode in ("RGBA", "LA", "P") and mode == "RGB":
            im = im.convert("RGBA")
            bg = Image.new("RGBA", im.size, (255, 255, 255, 255))  # transparent → white
            im = Image.alpha_composite(bg, im)
        im = im.convert(mode).resize((size, size), Image.BILINEAR)
        arr = np.asarray(im, dtype=np.uint8)
    return arr[None] if arr.ndim == 2 else arr.transpose(2, 0, 1)


class LazyImages:
    """Images decoded per item (large folders); indexable like a uint8 (N, C, H, W) tensor."""

    def __init__(self, source: _Source, files: list[str], mode: str, size: int):
        self.source, self.files, self.mode, self.size = source, files, mode, size
        self.shape = (len(files), 1 if mode == "L" else 3, size, size)

    def __len__(self) -> int:
        return len(self.files)

    def __getitem__(self, i: int) -> torch.Tensor:
        return torch.from_numpy(_decode(self.source.read(self.files[int(i)]), self.mode, self.size))

    def subset(self, idx: np.ndarray) -> LazyImages:
        return LazyImages(self.source, [self.files[i] for i in idx], self.mode, self.size)

    def sample_tensor(self, n: int, seed: int) -> torch.Tensor:
        idx = np.random.default_rng(seed).permutation(len(self))[:n]
        return torch.stack([self[i] for i in idx])


def _class_files(source: _Source, label: str) -> dict[str, list[str]]:
    names = [n for n in source.names() if not _is_hidden(PurePosixPath(n).parts)]
    parts = [PurePosixPath(n).parts for n in names]
    # A zip often wraps the classes in one top folder (dataset/cat/1.png): look inside it.
    while parts and all(len(p) > 2 for p in parts) and len({p[0] for p in parts}) == 1:
        parts = [p[1:] for p in parts]
    classes: dict[str, list[str]] = {}
    for name, p in zip(names, parts, strict=True):
        if len(p) < 2:
            continue  # files at the top level belong to no class
        files = classes.setdefault(p[0], [])
        if PurePosixPath(name).suffix.lower() in IMAGE_EXTS:
            files.append(name)
    if len(classes) < 2:
        raise ValueError(
            f"{label}: an image folder needs at least 2 class sub-folders, found {len(classes)} "
            f"({', '.join(sorted(classes)) or 'none'}). Expected layout: <root>/<class>/<image>.png"
        )
    empty = sorted(c for c, f in classes.items() if not f)
    if empty:
        raise ValueError(f"{label}: class folder(s) with no images: {', '.join(empty)} (images: {', '.join(sorted(IMAGE_EXTS))})")
    return {c: sorted(classes[c]) for c in sorted(classes)}


def _open(path: str) -> _Source:
    root = Path(path).expanduser()
    if not root.exists():
        raise FileNotFoundError(f"data.path not found: {root}")
    if root.is_file() and not zipfile.is_zipfile(root):
        raise ValueError(f"data.path {root} is a file but not a zip archive; give a folder or a .zip of class folders")
    return _Source(root)


def _choose_mode(source: _Source, files: list[str]) -> str:
    """Grayscale only when every image is; otherwise RGB (RGBA/P are composited on white)."""
    from PIL import Image

    for name in files:
        try:
            with Image.open(io.BytesIO(source.read(name))) as im:
                if im.mode not in ("L", "1", "I;16", "I", "F"):
                    return "RGB"
        except Exception:  # noqa: BLE001 - counted as unreadable later
            continue
    return "L"


def load_imagefolder(path: str, size: int, max_bad_fraction: float, cache_mb: int):
    """Return (images, labels, class_names, skipped_files). images is a uint8 tensor when it fits
    in `cache_mb`, else a LazyImages that decodes per item (unreadable files already removed)."""
    source = _open(path)
    classes = _class_files(source, path)
    files = [f for c in classes for f in classes[c]]
    labels_all = [i for i, c in enumerate(classes) for _ in classes[c]]
    mode = _choose_mode(source, files)
    channels = 1 if mode == "L" else 3
    eager = len(files) * channels * size * size <= cache_mb * 2**20
    decoded, good, labels, skipped = [], [], [], []
    for f, y in zip(files, labels_all, strict=True):
        try:
            arr = _decode(source.read(f), mode, size)
        except Exception:  # noqa: BLE001 - a corrupt file is skipped and counted
            skipped.append(f)
            continue
        if eager:
            decoded.append(arr)
        good.append(f)
        labels.append(y)
    if files and len(skipped) / len(files) > max_bad_fraction:
        raise ValueError(
            f"{path}: {len(skipped)} of {len(files)} images are unreadable "
            f"(more than data.max_bad_fraction={max_bad_fraction}), e.g. {', '.join(skipped[:5])}"
        )
    counts = np.bincount(labels, minlength=len(classes))
    if (counts == 0).any():
        lost = [c for c, n in zip(classes, counts, strict=True) if n == 0]
        raise ValueError(f"{path}: every image of class(es) {', '.join(lost)} is unreadable")
    y = torch.as_tensor(labels, dtype=torch.int64)
    images = torch.from_numpy(np.stack(decoded)) if eager else LazyImages(source, good, mode, size)
    return images, y, list(classes), skipped
