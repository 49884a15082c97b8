"""Image folders decoded at load by several threads, into this machine's on-disk image cache: built once and
reused by a later run, rebuilt when the data changes, never read by a run of other data, one builder at a time."""

from __future__ import annotations

import shutil
import threading
import time
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from core.batches import GatherBatches, make_batches
from core.cached_images import CachedImages
from core.config import RunSpec
from core.data import load_data
from core.events import MemorySink
from core.image_cache import list_entries
from core.imagefolder import Reading
from core.spec_data import DataSpec
from core.spec_sections import LoaderSpec
from core.train import run_training

CPU = torch.device("cpu")
COLOURS = {"cat": (200, 40, 40), "dog": (40, 40, 200)}


@pytest.fixture(autouse=True)
def cache(tmp_path, monkeypatch) -> Path:
    root = tmp_path / "image-cache"
    monkeypatch.setenv("TORCHDECK_IMAGE_CACHE", str(root))
    return root


def _photos(root: Path, n: int = 20, colours: dict = COLOURS, jpeg: bool = False) -> Path:
    """root/<class>/<i>.png|jpg: 64×48 images, a class's colour with a bright square that moves with i."""
    for c, (r, g, b) in colours.items():
        (root / c).mkdir(parents=True, exist_ok=True)
        for i in range(n):
            arr = np.full((48, 64, 3), (r, g, b), np.uint8)
            arr[i % 40 : i % 40 + 8, i % 56 : i % 56 + 8] = 255
            Image.fromarray(arr).save(root / c / (f"{i:03d}.jpg" if jpeg else f"{i:03d}.png"))
    return root


def _load(root: Path, workers: int | None = 1, **data) -> tuple:
    said: list[str] = []
    spec = DataSpec(name="imagefolder", path=str(root), image_size=16, val_fraction=0.25, test_split="none", **data)
    bundle = load_data(spec, 0, reading=Reading(workers=workers, report=said.append))
    return bundle, said


def _all(bundle) -> torch.Tensor:
    x = bundle.train.images
    return x if isinstance(x, torch.Tensor) else x.take(torch.arange(len(x)))


def test_decoding_at_load_uses_several_threads_at_once_and_gives_the_same_pixels(tmp_path, monkeypatch):
    from core import decode as decoding

    root = _photos(tmp_path / "pets", n=64, jpeg=True)  # 128 files: enough for two threads
    progress: list[tuple[int, int]] = []
    spec = DataSpec(name="imagefolder", path=str(root), image_size=16, val_fraction=0.25, test_split="none")
    said: list[str] = []
    both = threading.Barrier(2, timeout=120)  # passed only when two threads decode at the same time
    first: set[int] = set()
    original = decoding.decode

    def meeting(*args, **kwargs):
        if threading.get_ident() not in first:
            first.add(threading.get_ident())
            both.wait()  # a BrokenBarrierError (and a failed test) if the other thread never comes
        return original(*args, **kwargs)

    monkeypatch.setattr(decoding, "decode", meeting)
    reading = Reading(workers=2, disk_cache=False, progress=lambda d, t: progress.append((d, t)), report=said.append)
    spread = load_data(spec, 0, reading=reading)
    assert "decoded with 2 thread(s)" in said[0], said
    assert len(first) == 2 and threading.get_ident() not in first
    monkeypatch.setattr(decoding, "decode", original)
    alone, said_alone = _load(root, workers=1, disk_cache=False)
    assert "decoded with 1 thread(s)" in said_alone[0]
    assert torch.equal(spread.train.images, alone.train.images) and torch.equal(spread.train.labels, alone.train.labels)
    assert progress[-1] == (128, 128) and [d for d, _ in progress] == sorted(d for d, _ in progress)


def test_the_cache_is_built_once_and_a_second_run_reads_it(tmp_path, cache):
    root = _photos(tmp_path / "pets")
    spec = RunSpec.from_dict(
        {
            "data": {"name": "imagefolder", "path": str(root), "image_size": 16, "val_fraction": 0.25, "cache_mb": 0},
            "model": {"name": "simple_cnn", "hidden": 8},
            "train": {"epochs": 1, "batch_size": 8},
            "loader": {"num_workers": 0},
            "export": {"formats": []},
            "device": "cpu",
        }
    )
    decoded = []
    for run in ("first", "second"):
        sink = MemorySink()
        assert run_training(spec, tmp_path / run, sink)["status"] == "completed"
        decoded.append([e["message"] for e in sink.events if e["data"].get("code") == "decoded"])
    assert all("into the image cache" in m for m in decoded[0]) and decoded[0]
    assert all("read from the image cache" in m for m in decoded[1]) and len(decoded[1]) == len(decoded[0])
    entries = list_entries(cache)
    assert len(entries) == 1 and entries[0].images == 40 and entries[0].bytes >= 40 * 3 * 16 * 16
    assert entries[0].source == str(root.resolve()) and entries[0].side == 16


def test_an_entry_is_synced_to_disk_and_one_a_crash_may_have_emptied_is_decoded_again(tmp_path, cache):
    import json

    from core import image_cache

    root = _photos(tmp_path / "pets")
    _, said = _load(root)
    assert "into the image cache" in said[0]
    folder = next(cache.glob("*/meta.json")).parent
    deadline = time.monotonic() + 120  # the sync thread marks it once the disk has it
    while not (folder / "synced").exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert (folder / "synced").exists()
    written = json.loads((folder / "meta.json").read_text())
    assert written["boot"] == image_cache._boot()
    _, said = _load(root)
    assert "read from the image cache" in said[0]
    # built during another boot and never synced: the machine may have crashed before its pages reached the disk
    (folder / "synced").unlink()
    (folder / "meta.json").write_text(json.dumps({**written, "boot": "an-earlier-boot"}))
    _, said = _load(root)
    assert "into the image cache" in said[0]
    # not synced yet but built during this boot: the page cache holds it
    folder = next(cache.glob("*/meta.json")).parent
    while not (folder / "synced").exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    (folder / "synced").unlink()
    _, said = _load(root)
    assert "read from the image cache" in said[0]


def test_a_set_larger_than_memory_is_served_from_the_cache_in_the_same_batches(tmp_path):
    root = _photos(tmp_path / "pets")
    in_memory, _ = _load(root)
    cached, said = _load(root, cache_mb=0)
    assert isinstance(in_memory.train.images, CachedImages) and isinstance(cached.train.images, CachedImages)
    assert in_memory.train.images.held and not cached.train.images.held  # served from its pages, not read per batch
    assert "read from the image cache" in said[0]  # the first load built it
    a = make_batches(in_memory.train, 7, True, CPU, 3, LoaderSpec())
    b = make_batches(cached.train, 7, True, CPU, 3, LoaderSpec())
    assert isinstance(b, GatherBatches)
    for epoch in (1, 2):
        a.set_epoch(epoch), b.set_epoch(epoch)
        for (xa, ya), (xb, yb) in zip(a, b, strict=True):
            assert torch.equal(xa, xb) and torch.equal(ya, yb)


def test_changed_data_is_decoded_again_and_its_old_entry_removed(tmp_path, cache):
    root = _photos(tmp_path / "pets")
    _, said = _load(root)
    first = list_entries(cache)
    assert "into the image cache" in said[0] and len(first) == 1
    _photos(tmp_path / "pets", n=24)  # four more photos per class (and the others untouched)
    bundle, said = _load(root)
    assert "into the image cache" in said[0], said
    entries = list_entries(cache)
    assert len(entries) == 1 and entries[0].key != first[0].key and entries[0].images == 48
    assert len(bundle.train) + len(bundle.val) == 48


def test_a_run_of_other_data_never_reads_an_entry_it_did_not_build(tmp_path, cache):
    pets = _photos(tmp_path / "pets")
    other = _photos(tmp_path / "other", colours={"cat": (10, 200, 10), "dog": (200, 200, 10)})  # same names and sizes
    _load(pets)
    bundle, said = _load(other)
    assert "into the image cache" in said[0], said
    green = _all(bundle)[:, 1].float().mean(dim=(1, 2))
    assert (green > 150).all(), green  # its own green and yellow photos, none of the red and blue ones
    assert len(list_entries(cache)) == 2
    shutil.copytree(pets, tmp_path / "copy")  # the same files (copy2 keeps their times): the same data
    _, said = _load(tmp_path / "copy")
    assert "read from the image cache" in said[0]


def test_two_runs_loading_at_once_decode_once(tmp_path, cache):
    root = _photos(tmp_path / "pets")
    said: list[list[str]] = [[], []]
    errors: list[BaseException] = []

    def load(i: int) -> None:
        try:
            said[i] = _load(root)[1]
        except BaseException as e:  # noqa: BLE001 - reported by the assertion below
            errors.append(e)

    threads = [threading.Thread(target=load, args=(i,)) for i in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(300)
    assert not errors, errors
    built = [s for s in said if "into the image cache" in s[0]]
    read = [s for s in said if "read from the image cache" in s[0]]
    assert len(built) == 1 and len(read) == 1, said
    assert len(list_entries(cache)) == 1


def test_unreadable_files_are_skipped_once_and_remembered_by_the_cache(tmp_path):
    root = _photos(tmp_path / "pets")
    (root / "cat" / "broken.png").write_bytes(b"not an image")
    first, _ = _load(root, max_bad_fraction=0.5)
    again, said = _load(root, max_bad_fraction=0.5)
    assert "read from the image cache" in said[0]
    assert first.info.skipped == again.info.skipped == 1 and "broken.png" in again.info.skipped_files[0]
    assert torch.equal(_all(first), _all(again))


def test_the_cache_can_be_turned_off(tmp_path, cache, monkeypatch):
    monkeypatch.setenv("TORCHDECK_IMAGE_CACHE", "off")
    root = _photos(tmp_path / "pets")
    _, said = _load(root)
    assert "decoded with 1 thread(s)" in said[0] and "image cache" not in said[0]
    assert not cache.exists()


def test_a_jpeg_decoded_by_torchvision_has_pils_pixels_within_a_few_levels():
    import io

    from core.decode import centre_box, decode, shorter_side

    rng = np.random.default_rng(0)
    ramp = np.linspace(0, 255, 320)[None, :, None] * np.ones((240, 1, 3))
    photo = (ramp * 0.6 + rng.normal(0, 20, (240, 320, 3))).clip(0, 255).astype(np.uint8)
    buf = io.BytesIO()
    Image.fromarray(photo).save(buf, "JPEG", quality=90)
    for size, mode in ((160, "RGB"), (200, "L")):  # under twice the side: a full decode, by torchvision
        got = decode(buf.getvalue(), mode, size)
        w, h = shorter_side(320, 240, size)
        with Image.open(io.BytesIO(buf.getvalue())) as im:
            want = np.asarray(im.convert(mode).resize((w, h), Image.Resampling.BILINEAR).crop(centre_box(w, h, size)))
        want = want[None] if want.ndim == 2 else want.transpose(2, 0, 1)
        assert got.shape == want.shape == ((1 if mode == "L" else 3), size, size)
        diff = np.abs(got.astype(int) - want.astype(int))
        assert diff.max() <= 3 and diff.mean() < 0.2, (size, mode, diff.max(), diff.mean())


def test_an_unusable_cache_folder_is_said_and_the_images_decoded_anyway(tmp_path, monkeypatch):
    in_the_way = tmp_path / "not-a-folder"
    in_the_way.write_text("a file where the cache folder should be")
    monkeypatch.setenv("TORCHDECK_IMAGE_CACHE", str(in_the_way))
    bundle, said = _load(_photos(tmp_path / "pets"))
    assert "cannot be used" in said[0] and str(in_the_way) in said[0]
    assert "decoded with 1 thread(s)" in said[1] and len(bundle.train) + len(bundle.val) == 40


def test_removing_an_entry_while_its_sync_marks_it_leaves_nothing_behind(cache, monkeypatch):
    """Should the background sync write its mark while the entry is being removed (after the files are gone, before
    the folder is), no folder and no stray mark may stay on the disk. The steps are put in that order by events,
    not by timing."""
    import os

    from core import image_cache

    def fill(path):
        rows = np.memmap(path, dtype=np.uint8, mode="r+", shape=(4, 1, 8, 8))
        rows[:] = 3
        rows.flush()
        return np.arange(4), []

    image_cache.build(cache, "k1", {"source": "/data/x", "part": "train"}, (4, 1, 8, 8), fill)
    entry = cache / "k1"
    deadline = time.monotonic() + 120  # the build's own sync thread finishes first: this test makes the race itself
    while not (entry / "synced").exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    at_mark, files_gone = threading.Event(), threading.Event()
    real_open, real_rmdir = os.open, os.rmdir

    def open_(path, flags, *args, **kwargs):  # the sync has checked meta.json is there and is about to write its mark
        if str(path).endswith("synced") and flags & os.O_CREAT:
            at_mark.set()
            assert files_gone.wait(60)
        return real_open(path, flags, *args, **kwargs)

    syncing = threading.Thread(target=image_cache._sync, args=(entry,))

    def rmdir(path, *args, **kwargs):  # the files are gone; the sync writes its mark before the folder goes
        if kwargs.get("dir_fd") is None and not files_gone.is_set():
            files_gone.set()
            syncing.join(60)
        return real_rmdir(path, *args, **kwargs)

    monkeypatch.setattr(os, "open", open_)
    monkeypatch.setattr(os, "rmdir", rmdir)
    syncing.start()
    assert at_mark.wait(60)
    assert image_cache.clear(cache) > 0
    assert files_gone.is_set() and not syncing.is_alive()
    monkeypatch.setattr(os, "open", real_open)
    monkeypatch.setattr(os, "rmdir", real_rmdir)
    assert sorted(p.name for p in cache.iterdir() if not p.name.endswith(".lock")) == []
    assert image_cache.list_entries(cache) == []


def test_a_sync_of_a_removed_entry_never_marks_the_entry_built_again_in_its_place(cache, monkeypatch):
    """A sync still running when its entry is removed and built again (the same data, the same key) must not mark
    the new entry synced: the mark vouches for images it has not written to the disk."""
    import os

    from core import image_cache

    def fill(path):
        rows = np.memmap(path, dtype=np.uint8, mode="r+", shape=(4, 1, 8, 8))
        rows[:] = 5
        rows.flush()
        return np.arange(4), []

    describe = {"source": "/data/x", "part": "train"}
    image_cache.build(cache, "k1", describe, (4, 1, 8, 8), fill)
    entry = cache / "k1"
    deadline = time.monotonic() + 120
    while not (entry / "synced").exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    (entry / "synced").unlink()
    at_mark, rebuilt = threading.Event(), threading.Event()
    real_open = os.open
    syncing = threading.Thread(target=image_cache._sync, args=(entry,))

    def open_(path, flags, *args, **kwargs):  # the old entry's sync, about to write its mark, waits for the rebuild
        if str(path).endswith("synced") and flags & os.O_CREAT and threading.current_thread() is syncing:
            at_mark.set()
            assert rebuilt.wait(60)
        return real_open(path, flags, *args, **kwargs)

    monkeypatch.setattr(os, "open", open_)
    syncing.start()
    assert at_mark.wait(60)
    image_cache.remove_entry("k1", cache)
    monkeypatch.setattr(image_cache, "_boot", lambda: None)  # the new entry is on the disk before it counts: no sync
    image_cache.build(cache, "k1", describe, (4, 1, 8, 8), fill)
    rebuilt.set()
    syncing.join(60)
    assert not syncing.is_alive() and (entry / "meta.json").exists()
    assert not (entry / "synced").exists()
