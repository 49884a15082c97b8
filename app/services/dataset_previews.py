"""The Datasets page's preview: small thumbnails of a few images per class, made once.

An upload may hold images of up to 64 megapixels; handing those to `st.image` makes Streamlit decode and
resize each at every page run (24 such PNGs: ~20 s of CPU whenever anyone opens the page). So at upload
the first PER_CLASS images of the first classes (at most MAX_SHOWN) become PNG thumbnails of at most SIDE
pixels, in `$TORCHDECK_HOME/datasets/.previews/<the dataset's folder>/` with an index.json naming each
one's class; the page shows those files and never lists or opens the dataset's own. The folder lies beside
the dataset's, not in it: the zip that app.services.datasets.publish puts in a shared store for workers holds the
class folders only, and the previews are removed with the dataset.

A dataset uploaded before thumbnails existed gets them at its first view, made the same way. The work is
bounded either way: at most MAX_SHOWN images, each of at most 64 MP (the upload limit, read from its header);
JPEGs decoded at a reduced scale (`draft`: a 64 MP photo decodes as 1 MP); the others whole (a PNG cannot
be decoded smaller: 64 MP is ~0.8 s and up to 256 MB, once), until BUDGET_PIXELS were decoded in all. An
image beyond the budget is left out, and the index says how many were.
"""

from __future__ import annotations

import heapq
import json
import os
import shutil
import tempfile
import warnings
from dataclasses import dataclass
from pathlib import Path

from core.names import IMAGE_EXTENSIONS, MAX_IMAGE_PIXELS

SIDE = 128
PER_CLASS = 4
MAX_CLASSES = 12
MAX_SHOWN = 24
BUDGET_PIXELS = 128_000_000  # decoded per dataset, all thumbnails together: two 64 MP PNGs
INDEX = "index.json"
FOLDER = ".previews"


@dataclass(frozen=True)
class Previews:
    shown: list[tuple[str, Path]]  # (class, thumbnail file)
    left_out: int  # images too large to make a thumbnail of within the bounds


def folder_for(dataset: Path) -> Path:
    """Where the thumbnails of the dataset stored in `dataset` live: beside it, never inside."""
    return dataset.parent / FOLDER / dataset.name


def read(dataset: Path) -> Previews | None:
    """The thumbnails made for this dataset, or None when none were made yet."""
    where = folder_for(dataset)
    try:
        index = json.loads((where / INDEX).read_text())
        shown = [(str(e["class"]), where / Path(str(e["file"])).name) for e in index["shown"]][:MAX_SHOWN]
        return Previews(shown, int(index.get("left_out", 0)))
    except (OSError, ValueError, KeyError, TypeError):
        return None


def sources(dataset: Path) -> list[tuple[str, Path]]:
    """The images the preview shows: the first PER_CLASS (by name) of each of the first classes."""
    out: list[tuple[str, Path]] = []
    with os.scandir(dataset) as entries:
        classes = sorted(e.name for e in entries if e.is_dir(follow_symlinks=False))
    for cls in classes[:MAX_CLASSES]:
        with os.scandir(dataset / cls) as entries:
            names = (
                e.name
                for e in entries
                if e.name.lower().endswith(IMAGE_EXTENSIONS) and e.is_file(follow_symlinks=False)
            )
            out += [(cls, dataset / cls / n) for n in heapq.nsmallest(PER_CLASS, names)]
        if len(out) >= MAX_SHOWN:
            break
    return out[:MAX_SHOWN]


def make(dataset: Path) -> Previews:
    """Make the thumbnails of this dataset (once: a folder that has them is left as it is)."""
    where = folder_for(dataset)
    where.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=".making-", dir=where.parent))
    try:
        shown, left_out, budget = [], 0, [BUDGET_PIXELS]
        for i, (cls, src) in enumerate(sources(dataset)):
            name = f"{i:02d}.png"
            if thumbnail(src, tmp / name, budget):
                shown.append({"class": cls, "file": name})
            else:
                left_out += 1
        (tmp / INDEX).write_text(json.dumps({"shown": shown, "left_out": left_out}))
        try:
            tmp.rename(where)
        except OSError:  # another session made them meanwhile: theirs are kept
            pass
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return read(dataset) or Previews([], 0)


def get(dataset: Path) -> Previews | None:
    """The dataset's thumbnails, made now when they are missing; None when its folder is not on this machine."""
    made = read(dataset)
    if made is not None:
        return made
    return make(dataset) if dataset.is_dir() else None


def remove(dataset: Path) -> None:
    shutil.rmtree(folder_for(dataset), ignore_errors=True)


def thumbnail(src: Path, dest: Path, budget: list[int]) -> bool:
    """Write a PNG of at most SIDE pixels a side of the image `src`; False (nothing written) when it cannot be
    read or decoding it would exceed what is left of `budget` (decoded pixels)."""
    from PIL import Image

    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", Image.DecompressionBombWarning)
            im = Image.open(src)
        with im:
            if im.size[0] * im.size[1] > MAX_IMAGE_PIXELS:
                return False
            im.draft("RGB", (SIDE, SIDE))  # JPEG: decoded at 1/2, 1/4 or 1/8 of its size; others: no change
            pixels = im.size[0] * im.size[1]
            if pixels > budget[0]:
                return False
            budget[0] -= pixels
            im.thumbnail((SIDE, SIDE))
            if im.mode not in ("RGB", "RGBA", "L", "LA"):  # CMYK, 16-bit, palettes: as a PNG shows them
                im = im.convert("RGBA" if "A" in im.getbands() else "RGB")
            im.save(dest, format="PNG")
        return True
    except (OSError, ValueError, SyntaxError, Image.DecompressionBombError):
        return False
