"""Uploaded ImageFolder datasets: check a zip, store it under $TORCHDECK_HOME/datasets, register it.

An upload is untrusted. Refused, each with a message that says what to fix: anything that is not
a zip; entries that would land outside the target folder (absolute paths, `..`, links: zip-slip);
archives that inflate beyond the limits or at an absurd ratio (zip bombs; sizes are counted while
extracting, not believed from the headers); files that are not images (by extension and by
decoding them); fewer than two classes; images outside a class folder; archives whose list of files is
too long to read (its size and entry count are read from the archive's end record, and its entries
counted, before zipfile parses it: app/services/zip_directory.py). Nothing is written outside the datasets folder,
and a refused upload leaves nothing behind. A stored upload gets its preview thumbnails at once
(app/services/dataset_previews.py), beside its folder."""

from __future__ import annotations

import os
import re
import secrets
import shutil
import stat
import tempfile
import unicodedata
import zipfile
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from typing import IO

from sqlalchemy import Engine

from app.auth import ADMINS_ENV, PermissionDenied, User, can_modify
from app.services import dataset_previews, zip_directory
from app.services.projects import DEFAULT_PROJECT, ProjectHidden, check_contribute, check_read, with_roles
from core.names import IMAGE_EXTENSIONS, MAX_CLASS_NAME, MAX_IMAGE_PIXELS
from db import repo
from db.engine import data_home

MAX_UPLOAD_MB = int(os.environ.get("TORCHDECK_MAX_UPLOAD_MB", "200"))
MAX_UNPACKED_MB = int(os.environ.get("TORCHDECK_MAX_UNPACKED_MB", "2048"))
MAX_FILES = 200_000
MAX_ENTRIES = 2 * MAX_FILES + 10_000  # with their folders, and macOS's __MACOSX/ copy of each file
MAX_DIRECTORY_MB = 96  # the archive's list of files, which zipfile reads whole (~130 bytes an entry)
MAX_RATIO = 200  # images barely compress; text-like ratios this high are bombs
_IGNORED = ("__MACOSX/", ".DS_Store", "Thumbs.db", "desktop.ini")
_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$")


class UploadRefused(ValueError):
    """Why an upload was refused, in words a user can act on."""


@dataclass
class Layout:
    root: str  # "" or the single top folder inside the zip ("pets/")
    members: dict[str, list[zipfile.ZipInfo]] = field(default_factory=dict)  # class -> image entries


def datasets_root() -> Path:
    root = (data_home() / "datasets").resolve()
    root.mkdir(parents=True, exist_ok=True)
    return root


def check_name(name: str) -> str:
    name = name.strip()
    if not _NAME.match(name):
        raise UploadRefused(
            "dataset names use letters, digits, '-', '_' and '.', start with a letter or digit "
            "and are at most 64 characters"
        )
    return name


def _ignored(name: str) -> bool:
    return (
        name.startswith("__MACOSX/") or PurePosixPath(name).name.startswith(".") or PurePosixPath(name).name in _IGNORED
    )


def _check_entry(info: zipfile.ZipInfo) -> None:
    name = info.filename
    parts = PurePosixPath(name).parts
    if name.startswith(("/", "\\")) or re.match(r"^[A-Za-z]:", name) or ".." in parts or "\\" in name:
        raise UploadRefused(
            f"unsafe path in the archive: {name!r} would be written outside the dataset folder "
            "(absolute paths and '..' are refused)"
        )
    mode = info.external_attr >> 16
    if stat.S_ISLNK(mode):
        raise UploadRefused(f"the archive contains a symbolic link ({name!r}); links are refused")
    if info.flag_bits & 0x1:
        raise UploadRefused(f"{name!r} is encrypted; upload an unencrypted zip")


def inspect(zf: zipfile.ZipFile) -> Layout:
    """Check every entry's name and declared size, and find the class folders."""
    infos = [i for i in zf.infolist() if not i.is_dir() and not _ignored(i.filename)]
    if not infos:
        raise UploadRefused("the archive holds no files")
    if len(infos) > MAX_FILES:
        raise UploadRefused(f"the archive holds {len(infos):,} files; at most {MAX_FILES:,} are accepted")
    declared = 0
    for i in infos:
        _check_entry(i)
        declared += i.file_size
        if i.file_size > 1 << 20 and i.compress_size and i.file_size / i.compress_size > MAX_RATIO:
            raise UploadRefused(f"{i.filename!r} inflates {i.file_size / i.compress_size:.0f}× — refused as a zip bomb")
    if declared > MAX_UNPACKED_MB << 20:
        raise UploadRefused(f"the archive unpacks to {declared / 2**20:,.0f} MB; the limit is {MAX_UNPACKED_MB:,} MB")
    tops = {PurePosixPath(i.filename).parts[0] for i in infos}
    one_folder = len(tops) == 1 and all(len(PurePosixPath(i.filename).parts) >= 3 for i in infos)
    layout = Layout(root=f"{tops.pop()}/" if one_folder else "")
    not_images, loose = [], []
    for i in infos:
        parts = PurePosixPath(i.filename[len(layout.root) :]).parts
        if len(parts) < 2:
            loose.append(i.filename)
        elif not i.filename.lower().endswith(IMAGE_EXTENSIONS):
            not_images.append(i.filename)
        else:
            layout.members.setdefault(parts[0], []).append(i)
    if loose:
        raise UploadRefused(
            f"files outside a class folder: {', '.join(loose[:5])}. An ImageFolder zip holds one "
            "folder per class (cat/1.jpg, dog/2.jpg), optionally inside one top folder"
        )
    if not_images:
        raise UploadRefused(
            f"{len(not_images)} file(s) are not images ({', '.join(not_images[:5])}); accepted: "
            f"{', '.join(IMAGE_EXTENSIONS)}"
        )
    too_long = [c for c in layout.members if len(c) > MAX_CLASS_NAME]
    if too_long:
        raise UploadRefused(
            f"class folder name {too_long[0][:60]!r}... has {len(too_long[0])} characters; class names "
            f"become metric keys (val/acc_class/<name>), so at most {MAX_CLASS_NAME} are accepted: "
            "rename the folder"
        )
    if len(layout.members) < 2:
        found = next(iter(layout.members), "none")
        raise UploadRefused(
            f"a classifier needs at least two classes, this archive has one class folder ({found!r}); "
            "put each class's images in its own folder"
        )
    return layout


def _copy_limited(src: IO[bytes], dst: IO[bytes], budget: list[int]) -> None:
    """Copy while counting real bytes: headers can lie about sizes."""
    while chunk := src.read(1 << 16):
        budget[0] -= len(chunk)
        if budget[0] < 0:
            raise UploadRefused(f"the archive unpacks to more than {MAX_UNPACKED_MB:,} MB — refused as a zip bomb")
        dst.write(chunk)


def _verify_image(path: Path) -> str | None:
    """Why this file is no image we accept, or None. Its size is read from the header, never decoded."""
    import warnings

    from PIL import Image, UnidentifiedImageError

    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", Image.DecompressionBombWarning)  # our own limit below
            im = Image.open(path)
        with im:
            w, h = im.size
            if w * h > MAX_IMAGE_PIXELS:
                return (
                    f"{path.parent.name}/{path.name}: {w}×{h} pixels, more than the "
                    f"{MAX_IMAGE_PIXELS / 1e6:.0f} MP accepted"
                )
            im.verify()
    except Image.DecompressionBombError as e:  # over twice PIL's own limit: PIL refuses it while opening
        found = re.search(r"\((\d+) pixels\)", str(e))
        return (
            f"{path.parent.name}/{path.name}: {f'{int(found[1]):,}' if found else 'too many'} pixels, more than the "
            f"{MAX_IMAGE_PIXELS / 1e6:.0f} MP accepted"
        )
    except (UnidentifiedImageError, OSError, SyntaxError, ValueError) as e:
        return f"{path.parent.name}/{path.name}: {e.__class__.__name__}"
    return None


def extract(zf: zipfile.ZipFile, layout: Layout, target: Path) -> dict[str, int]:
    """Write the class folders into `target` (which must be empty); returns images per class."""
    budget = [MAX_UNPACKED_MB << 20]
    counts: dict[str, int] = {}
    bad: list[str] = []
    for cls, infos in sorted(layout.members.items()):
        folder = target / cls
        folder.mkdir(parents=True, exist_ok=True)
        for info in infos:
            dest = (target / info.filename[len(layout.root) :]).resolve()
            if target not in dest.parents:  # belt and braces after _check_entry
                raise UploadRefused(f"unsafe path in the archive: {info.filename!r}")
            dest.parent.mkdir(parents=True, exist_ok=True)
            with zf.open(info) as src, open(dest, "wb") as dst:
                _copy_limited(src, dst, budget)
            problem = _verify_image(dest)
            if problem:
                bad.append(problem)
        counts[cls] = len(infos)
    if bad:
        raise UploadRefused(f"{len(bad)} file(s) could not be read as images: {'; '.join(bad[:5])}")
    return counts


def store_upload(
    engine: Engine, name: str, data: IO[bytes], size: int, *, owner: str, project: str = DEFAULT_PROJECT
) -> repo.DatasetRecord:
    """Check, extract and register an uploaded zip in `project`, owned by `owner` (who, while a member of the
    project, or a maintainer of it or an admin, may delete it). Raises UploadRefused; PermissionDenied in team mode
    when the owner is not a member of the project; leaves nothing on refusal."""
    name = check_name(name)
    check_contribute(owner, project, engine)
    if size > MAX_UPLOAD_MB << 20:
        raise UploadRefused(f"the upload is {size / 2**20:,.1f} MB; the limit is {MAX_UPLOAD_MB:,} MB")
    if any(d.name == name for d in repo.list_datasets(engine)):
        raise UploadRefused(f"a dataset named {name!r} exists already; choose another name")
    root = datasets_root()
    # A folder of its own per upload: runs of a deleted dataset never read a later upload of the same name.
    final = root / f"{name}-{secrets.token_hex(3)}"
    if final.exists():
        raise UploadRefused(f"the folder {final} exists already; upload again")
    if not zipfile.is_zipfile(data):
        raise UploadRefused("this is not a zip archive")
    too_long = zip_directory.check(data, MAX_ENTRIES, MAX_DIRECTORY_MB << 20)  # before zipfile parses it
    if too_long:
        raise UploadRefused(f"{too_long} (at most {MAX_FILES:,} images)")
    tmp = Path(tempfile.mkdtemp(prefix=".upload-", dir=root)).resolve()
    try:
        with zipfile.ZipFile(data) as zf:
            layout = inspect(zf)
            counts = extract(zf, layout, tmp)
        tmp.rename(final)
    except zipfile.BadZipFile as e:
        raise UploadRefused(f"the zip archive is damaged: {e}") from None
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    try:
        dataset_previews.make(final)
        publish(final.name, final)
    except Exception as e:  # noqa: BLE001 - any store failure refuses the upload, leaving nothing
        shutil.rmtree(final, ignore_errors=True)
        dataset_previews.remove(final)
        raise UploadRefused(
            f"the dataset could not be copied to the artifact store, where workers on other "
            f"hosts read it: {e.__class__.__name__}: {e}"
        ) from None
    return repo.create_dataset(
        engine, name, str(final), classes=sorted(counts), counts=counts, status="ready", owner=owner, project=project
    )


def store_key(folder: str) -> str:
    """Where workers look for an upload (worker.artifacts.localize_dataset): by its folder's name."""
    return f"datasets/{folder}.zip"


def shared_store():
    """The artifact store when workers elsewhere need datasets through it (an object store, or a local
    folder outside $TORCHDECK_HOME such as a shared mount); None when they read $TORCHDECK_HOME/datasets."""
    from app.services.artifacts import artifact_store

    store = artifact_store()
    if store.is_local:
        root, home = store.local_path("probe").parent, data_home().resolve()
        if root == home or home in root.parents:
            return None
    return store


def publish(name: str, folder: Path) -> None:
    """Put a checked dataset in the artifact store as one zip of its class folders (images only)."""
    store = shared_store()
    if store is None:
        return
    with tempfile.TemporaryDirectory(prefix=".publish-", dir=folder.parent) as tmp:
        archive = Path(tmp) / f"{name}.zip"
        with zipfile.ZipFile(archive, "w", zipfile.ZIP_STORED) as zf:  # images are compressed already
            for path in sorted(folder.rglob("*")):
                if path.is_file() and not path.is_symlink():
                    zf.write(path, path.relative_to(folder).as_posix())
        store.put_file(archive, store_key(name))


def check_can_remove(by: User | None, record: repo.DatasetRecord) -> None:
    """Its owner (a member of its project), a maintainer of its project or an admin; a dataset uploaded before
    datasets had owners, a maintainer or an admin only. `by` with their roles looked up (projects.with_roles)."""
    if not can_modify(by, record):
        who = by.describe() if by else "an anonymous user"
        owner = record.owner or "nobody recorded (it was uploaded before datasets had owners)"
        raise PermissionDenied(
            f"{who} may not delete dataset {record.name!r}: it belongs to {owner}, and only its owner (a member "
            f"of project {record.project}), a maintainer of the project or an admin ({ADMINS_ENV}) may delete it"
        )


def remove(engine: Engine, dataset_id: str, *, by: User | None) -> None:
    """Delete an uploaded dataset and its files. app.auth.PermissionDenied unless `by` may."""
    record = readable_dataset(engine, dataset_id, by=by)
    check_can_remove(with_roles(by, engine), record)
    uri = repo.delete_dataset(engine, dataset_id)
    store = shared_store()
    if store is not None:
        store.delete(store_key(Path(uri).name))
    path = Path(uri).resolve()
    if datasets_root() in path.parents:
        shutil.rmtree(path, ignore_errors=True)
        dataset_previews.remove(path)


def readable_dataset(engine: Engine, dataset_id: str, *, by: User | None) -> repo.DatasetRecord:
    """The dataset, or DatasetNotFound when there is none or `by` may not see its project (team mode)."""
    record = repo.get_dataset(engine, dataset_id)
    try:
        check_read(with_roles(by, engine), record.project, f"dataset {dataset_id!r}")
    except ProjectHidden:
        raise repo.DatasetNotFound(dataset_id) from None
    return record


def previews(uri: str) -> dataset_previews.Previews | None:
    """The preview thumbnails of a stored dataset (made now, once, for one uploaded before they existed); None
    when its folder is not an upload on this machine."""
    path = Path(uri).resolve()
    if datasets_root() not in path.parents:
        return None
    return dataset_previews.get(path)


def previews_made(uri: str) -> bool:
    return dataset_previews.read(Path(uri).resolve()) is not None


def builtin_datasets() -> list[dict[str, object]]:
    """The datasets a run can use without an upload (core/catalog.py's, but the uploaded folders' kind), with
    their images, classes and size (what the spec sets where the catalog leaves them to it: its defaults), and
    whether each is available here."""
    from core.catalog import DATASETS
    from core.spec_sections import DataSpec

    data_dir = Path(os.environ.get("TORCHDECK_DATA") or "data")
    spec = DataSpec()  # the spec's defaults, for what the catalog leaves to it
    rows: list[dict[str, object]] = []
    for name, d in DATASETS.items():
        if d.kind == "folder":
            continue
        side = (
            f"{d.size}×{d.size} {'gray' if d.channels == 1 else 'RGB'}"
            if d.size
            else f"{spec.size}×{spec.size} (data.size)"
        )
        row = {
            "name": name,
            "images": f"{d.samples:,}" if d.samples else f"{spec.num_samples:,} (data.num_samples)",
            "classes": str(d.classes) if d.classes else f"{spec.num_classes} (data.num_classes)",
            "size": side,
            "available": True,
            "source": "generated from class templates + noise",
        }
        if d.kind == "builtin":
            row["source"] = f"{d.source} (ships inside its package)"
        elif d.kind == "torchvision":
            row["available"] = (data_dir / d.folder).exists()
            row["source"] = f"torchvision, from {data_dir / d.folder} (or data.download with internet)"
        rows.append(row)
    return rows


def default_name(filename: str, taken: Iterable[str] = ()) -> str:
    """A dataset name from an uploaded zip's file name, made to pass check_name: its stem in lower case,
    accents dropped, every run of other characters a '-' ("Pets Photos (v2).zip" → "pets-photos-v2"), at most
    64 characters, "-2", "-3", … added while `taken` holds it; "dataset" when nothing usable is left."""
    stem = PurePosixPath(filename.replace("\\", "/")).name
    stem = stem[:-4] if stem.lower().endswith(".zip") else stem
    ascii_stem = unicodedata.normalize("NFKD", stem).encode("ascii", "ignore").decode()
    base = re.sub(r"[^a-z0-9_.]+", "-", ascii_stem.lower())
    base = re.sub(r"^[^a-z0-9]+", "", base)[:64].rstrip("-_.") or "dataset"
    taken = set(taken)
    name, n = base, 1
    while name in taken:
        n += 1
        suffix = f"-{n}"
        name = base[: 64 - len(suffix)].rstrip("-_.") + suffix
    return name
