"""Datasets, the seeded stratified split, train-only statistics and augmentation, the loaders,
and every bad image folder a user can hand us. All data is real or made on the spot."""

from __future__ import annotations

import zipfile
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from core.batches import DeviceBatches, GatherBatches, HostBatches, make_batches
from core.cached_images import CachedImages
from core.data import DataError, Preprocess, Split, load_data, stratified_split
from core.imagefolder import LazyImages
from core.spec_sections import AugmentSpec, DataSpec, LoaderSpec
from tests._images import whole

CPU = torch.device("cpu")
RED, BLUE, GREEN = (220, 20, 20), (20, 20, 220), (20, 200, 20)


def _png(path: Path, mode: str = "RGB", color=RED, size: int = 6) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    Image.new(mode, (size, size), color).save(path)
    return path


def _tree(root: Path, classes: dict[str, tuple], n: int = 5) -> Path:
    """root/<class>/<i>.png, every image of a class in that class's colour (labels are checkable)."""
    for name, color in classes.items():
        for i in range(n):
            _png(root / name / f"{i}.png", color=color, size=6 + i)  # sizes differ: resizing is exercised
    return root


def _zip(src: Path, dest: Path, wrap: str | None = None) -> Path:
    """Zip a tree like a desktop archiver would: folder entries, an optional wrapping folder, junk."""
    prefix = f"{wrap}/" if wrap else ""
    with zipfile.ZipFile(dest, "w") as zf:
        if wrap:
            zf.writestr(prefix, "")
            zf.writestr(f"{prefix}README.txt", "holiday photos")
        zf.writestr("__MACOSX/._junk", "resource fork")
        for p in sorted(src.rglob("*")):
            rel = p.relative_to(src).as_posix()
            if p.is_dir():
                zf.writestr(f"{prefix}{rel}/", "")
            else:
                zf.write(p, f"{prefix}{rel}")
    return dest


def _folder(path: Path, **kw) -> DataSpec:
    return DataSpec(name="imagefolder", path=str(path), **{"image_size": 8, "val_fraction": 0.4, **kw})


def _mean_colour_by_label(bundle) -> dict[str, list[float]]:
    x, y = (
        torch.cat([whole(bundle.train.images), whole(bundle.val.images)]).float(),
        torch.cat([bundle.train.labels, bundle.val.labels]),
    )
    return {name: x[y == i].mean(dim=(0, 2, 3)).tolist() for i, name in enumerate(bundle.info.class_names)}


# --- sources ---------------------------------------------------------------------


def test_digits_is_the_real_handwritten_digits_set():
    from sklearn.datasets import load_digits

    b = load_data(DataSpec(name="digits"), seed=0)
    assert b.info.num_train + b.info.num_val == 1797
    assert b.info.class_names == [str(i) for i in range(10)]
    assert (b.info.channels, b.info.image_size) == (1, 8)
    x = torch.cat([b.train.images, b.val.images])
    assert x.dtype == torch.uint8 and x.shape == (1797, 1, 8, 8)
    assert int(x.min()) == 0 and int(x.max()) == 255
    # the same pixels as scikit-learn's digits (0..16 scaled to 0..255), with the labels still attached
    ref = np.round(load_digits().images / 16 * 255)
    train_idx, _ = stratified_split(torch.as_tensor(load_digits().target), 0.2, 0)
    assert np.array_equal(b.train.images[:, 0].numpy(), ref[train_idx])
    assert np.array_equal(b.train.labels.numpy(), load_digits().target[train_idx])


def test_limit_uses_a_seeded_subset():
    a = load_data(DataSpec(name="digits", limit=100), seed=3)
    again = load_data(DataSpec(name="digits", limit=100), seed=3)
    assert a.info.num_train + a.info.num_val == 100
    assert torch.equal(a.train.images, again.train.images) and torch.equal(a.val.labels, again.val.labels)


def test_synthetic_is_seeded_configurable_and_learnable():
    spec = DataSpec(name="synthetic", num_classes=3, num_samples=90, channels=1, size=12, noise=0.5)
    a, again, other = load_data(spec, seed=1), load_data(spec, seed=1), load_data(spec, seed=2)
    assert a.info.class_names == ["class_0", "class_1", "class_2"]
    assert a.train.images.shape[1:] == (1, 12, 12) and a.info.num_train + a.info.num_val == 90
    assert torch.equal(a.train.images, again.train.images) and torch.equal(a.train.labels, again.train.labels)
    assert not torch.equal(a.train.images, other.train.images)
    rgb = load_data(spec.model_copy(update={"channels": 3, "size": 8}), seed=1)
    assert rgb.info.channels == 3 and rgb.info.image_size == 8
    # classes differ by a template, not only by noise: nearest class mean beats chance by far
    xt, xv = a.train.images.flatten(1).float(), a.val.images.flatten(1).float()
    means = torch.stack([xt[a.train.labels == c].mean(0) for c in range(3)])
    acc = (torch.cdist(xv, means).argmin(1) == a.val.labels).float().mean()
    assert acc > 0.8


def test_mnist_offline_says_where_to_put_the_files(tmp_path):
    with pytest.raises(DataError) as e:
        load_data(DataSpec(name="mnist", path=str(tmp_path), download=False), seed=0)
    msg = str(e.value)
    assert str(tmp_path / "MNIST" / "raw") in msg and "train-images-idx3-ubyte" in msg
    assert "data.download=true" in msg


# --- split and statistics -----------------------------------------------------------------


def test_split_is_seeded_stratified_and_disjoint():
    labels = load_data(DataSpec(name="digits", val_fraction=0.5), seed=0).train.labels  # uneven class sizes
    tr, va = stratified_split(labels, 0.3, seed=5)
    tr2, va2 = stratified_split(labels, 0.3, seed=5)
    _, va3 = stratified_split(labels, 0.3, seed=6)
    assert np.array_equal(tr, tr2) and np.array_equal(va, va2)
    assert not np.array_equal(va, va3)
    assert set(tr).isdisjoint(va) and len(tr) + len(va) == len(labels)
    y = labels.numpy()
    for c in np.unique(y):
        n_c, n_val = (y == c).sum(), (y[va] == c).sum()
        assert abs(n_val - 0.3 * n_c) <= 1, f"class {c}: {n_val} of {n_c} in val"


def test_same_seed_same_split_through_load_data():
    a, b, c = (load_data(DataSpec(name="digits"), seed=s) for s in (7, 7, 8))
    assert torch.equal(a.val.images, b.val.images) and torch.equal(a.val.labels, b.val.labels)
    assert not torch.equal(a.val.images, c.val.images)


@pytest.mark.parametrize(
    "spec", [DataSpec(name="digits"), DataSpec(name="synthetic", num_samples=200, size=8, channels=3)]
)
def test_mean_std_are_the_train_splits_not_the_whole_sets(spec):
    b = load_data(spec, seed=0)
    train = b.train.images.numpy().astype(np.float64) / 255
    whole = np.concatenate([train, b.val.images.numpy() / 255])
    axes = (0, 2, 3)
    assert np.allclose(b.info.mean, train.mean(axes), atol=1e-9, rtol=0)
    assert np.allclose(b.info.std, train.std(axes, ddof=1), atol=1e-9, rtol=0)
    assert not np.allclose(b.info.mean, whole.mean(axes), atol=1e-6, rtol=0)  # the val split did not leak in
    assert len(b.info.mean) == b.info.channels


def test_normalize_false_records_identity_statistics():
    info = load_data(DataSpec(name="digits", normalize=False), seed=0).info
    assert info.mean == [0.0] and info.std == [1.0]


# --- augmentation: training split only ------------------------------------------------------


@pytest.fixture(scope="module")
def digits_raw():
    b = load_data(DataSpec(name="digits", normalize=False), seed=0)
    return b.info, b.train.images[:64]


def _augmented(info, x, seed: int = 0, **aug):
    return Preprocess(info, AugmentSpec(**aug), CPU)(x, torch.Generator().manual_seed(seed))


def test_random_crop_is_a_shifted_window_of_the_zero_padded_image(digits_raw):
    info, x = digits_raw
    out = _augmented(info, x, random_crop=True, crop_padding=2)
    assert out.shape == x.shape
    padded = torch.nn.functional.pad(x.float() / 255, (2, 2, 2, 2))
    shifted = 0
    for k in range(len(x)):
        windows = [
            (dy, dx)
            for dy in range(5)
            for dx in range(5)
            if torch.equal(padded[k, :, dy : dy + 8, dx : dx + 8], out[k])
        ]
        assert windows, f"sample {k} is not a crop of its padded image"
        shifted += (2, 2) not in windows
    assert shifted > len(x) // 2
    assert torch.equal(out, _augmented(info, x, random_crop=True, crop_padding=2))  # same generator, same crops


def test_hflip_mirrors_about_half_of_the_batch(digits_raw):
    info, x = digits_raw
    out, xf = _augmented(info, x, hflip=True), x.float() / 255
    flipped = [torch.equal(out[k], xf[k].flip(-1)) for k in range(len(x))]
    kept = [torch.equal(out[k], xf[k]) for k in range(len(x))]
    assert all(f or k for f, k in zip(flipped, kept, strict=True))
    assert 10 < sum(f and not k for f, k in zip(flipped, kept, strict=True)) < 54


def test_colour_jitter_changes_brightness_and_contrast_but_keeps_pixel_order(digits_raw):
    info, x = digits_raw
    out, xf = _augmented(info, x, color_jitter=0.5), x.float() / 255
    assert not torch.allclose(out, xf) and out.min() >= 0 and out.max() <= 1
    for k in range(len(x)):  # a monotone per-image transform: a brighter input pixel never ends darker
        order = xf[k].flatten().argsort(stable=True)
        assert (out[k].flatten()[order].diff() >= -1e-6).all()


def test_validation_preprocess_never_augments(digits_raw):
    info, x = digits_raw
    mean, std = torch.tensor(info.mean).view(1, -1, 1, 1), torch.tensor(info.std).view(1, -1, 1, 1)
    plain = (x.float() / 255 - mean) / std
    val = Preprocess(info, None, CPU)(x, torch.Generator().manual_seed(0))
    assert torch.equal(val, plain)
    train = Preprocess(info, AugmentSpec(random_crop=True, hflip=True, color_jitter=0.3), CPU)(
        x, torch.Generator().manual_seed(0)
    )
    assert not torch.allclose(train, plain)


def test_preprocess_normalizes_with_the_recorded_statistics():
    b = load_data(DataSpec(name="synthetic", num_samples=300, size=8, channels=3), seed=0)
    out = Preprocess(b.info, None, CPU)(b.train.images)
    assert torch.allclose(out.mean(dim=(0, 2, 3)), torch.zeros(3), atol=1e-4)
    assert torch.allclose(out.std(dim=(0, 2, 3)), torch.ones(3), atol=1e-3)


# --- loaders ----------------------------------------------------------------


def _indexed_split(n: int = 50) -> Split:
    """Labels are the sample indices, so the order a loader yields is visible."""
    return Split(torch.zeros(n, 1, 2, 2, dtype=torch.uint8), torch.arange(n))


def _epoch(batches, epoch: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
    batches.set_epoch(epoch)
    return list(batches)


def _order(batches, epoch: int) -> list[int]:
    return [int(v) for _, y in _epoch(batches, epoch) for v in y]


@pytest.mark.parametrize("device_cache_mb", [1024, 0], ids=["DeviceBatches", "GatherBatches"])
def test_train_shuffles_per_epoch_reproducibly_and_val_keeps_order(device_cache_mb):
    loader = LoaderSpec(device_cache_mb=device_cache_mb)
    kind = DeviceBatches if device_cache_mb else GatherBatches
    train = make_batches(_indexed_split(), 8, True, CPU, 11, loader)
    val = make_batches(_indexed_split(), 8, False, CPU, 11, loader)
    assert isinstance(train, kind) and isinstance(val, kind)
    assert len(train) == 7  # 50 samples in batches of 8, the last one short
    e1, e2 = _order(train, 1), _order(train, 2)
    assert sorted(e1) == list(range(50)) and sorted(e2) == list(range(50))  # every sample once per epoch
    assert e1 != e2 and e1 != list(range(50))
    fresh = make_batches(_indexed_split(), 8, True, CPU, 11, loader)
    assert _order(fresh, 2) == e2 and _order(fresh, 1) == e1  # (seed, epoch) decides, not history
    assert _order(make_batches(_indexed_split(), 8, True, CPU, 12, loader), 1) != e1
    assert _order(val, 1) == list(range(50)) == _order(val, 2)


def test_small_datasets_live_on_the_device_once():
    b = load_data(DataSpec(name="digits"), seed=0)
    val = make_batches(b.val, 64, False, CPU, 0, LoaderSpec())
    assert isinstance(val, DeviceBatches) and val.x.device == CPU
    base = val.x.untyped_storage().data_ptr()
    for x, _ in val:  # batches are views into the one resident copy, not per-step copies
        assert x.untyped_storage().data_ptr() == base and x.dtype == torch.uint8
    got = torch.cat([y for _, y in val])
    assert torch.equal(got, b.val.labels)
    # decoded images need no loader processes; a device cache too small gathers each batch by index
    assert isinstance(make_batches(b.val, 64, False, CPU, 0, LoaderSpec(num_workers=2)), DeviceBatches)
    assert isinstance(make_batches(b.val, 64, False, CPU, 0, LoaderSpec(device_cache_mb=0)), GatherBatches)


@pytest.mark.parametrize("world", [1, 3])
def test_gathered_batches_are_the_sliced_ones_every_rank_and_epoch(world):
    """A split the device cannot hold is gathered by index on the host: the same batches, shards and order."""
    split = Split(
        torch.arange(50, dtype=torch.uint8).view(50, 1, 1, 1).expand(50, 1, 2, 2).contiguous(), torch.arange(50)
    )
    for rank in range(world):
        sliced = make_batches(split, 4, True, CPU, 5, LoaderSpec(), rank, world)
        gathered = make_batches(split, 4, True, CPU, 5, LoaderSpec(device_cache_mb=0), rank, world)
        assert isinstance(sliced, DeviceBatches) and isinstance(gathered, GatherBatches)
        assert len(sliced) == len(gathered)
        for epoch in (1, 2):
            a, b = _epoch(sliced, epoch), _epoch(gathered, epoch)
            assert len(a) == len(b) == len(sliced)
            for (xa, ya), (xb, yb) in zip(a, b, strict=True):
                assert torch.equal(xa, xb) and torch.equal(ya, yb)


def test_a_loop_that_stops_early_leaves_no_gathering_thread_behind():
    import threading

    split = Split(torch.zeros(400, 1, 2, 2, dtype=torch.uint8), torch.arange(400))
    batches = make_batches(split, 4, True, CPU, 0, LoaderSpec(device_cache_mb=0))
    for _ in range(3):
        it = iter(batches)
        next(it)
        it.close()  # a cancelled run leaves its epoch after one batch
    assert not [t for t in threading.enumerate() if t.name == "gather-batches"]


def test_lazy_imagefolder_loads_in_a_spawned_worker_like_in_process(tmp_path):
    root = _tree(tmp_path / "pets", {"cat": RED, "dog": BLUE, "fox": GREEN}, n=4)
    b = load_data(_folder(root, cache_mb=0, disk_cache=False), seed=0)
    assert isinstance(b.train.images, LazyImages)  # too big for memory, no image cache: decoded per item
    auto = make_batches(b.train, 3, True, CPU, 0, LoaderSpec())
    assert isinstance(auto, HostBatches) and auto.num_workers >= 1  # lazy data gets workers
    in_proc = make_batches(b.train, 3, True, CPU, 0, LoaderSpec(num_workers=0))
    worker = make_batches(b.train, 3, True, CPU, 0, LoaderSpec(num_workers=1))
    ref, got = _epoch(in_proc, 1), _epoch(worker, 1)
    assert len(got) == len(ref) == len(worker)
    for (x, y), (rx, ry) in zip(got, ref, strict=True):  # same seeded order, same decoded pixels
        assert torch.equal(y, ry) and torch.equal(x, rx) and x.dtype == torch.uint8
    assert sorted(torch.cat([y for _, y in got]).tolist()) == sorted(b.train.labels.tolist())


# --- image folders ------------------------------------------------------------------------------------


def test_imagefolder_from_a_folder_keeps_labels_aligned_with_images(tmp_path):
    root = _tree(tmp_path / "pets", {"dog": BLUE, "cat": RED, "fox": GREEN})
    b = load_data(_folder(root), seed=0)
    assert b.info.class_names == ["cat", "dog", "fox"]  # sorted sub-folder names
    assert b.info.num_train + b.info.num_val + b.info.num_test == 15 and b.info.skipped == 0
    assert (b.info.channels, b.info.image_size) == (3, 8) and b.train.images.shape[1:] == (3, 8, 8)
    colours = _mean_colour_by_label(b)
    for name, want in {"cat": RED, "dog": BLUE, "fox": GREEN}.items():
        assert np.allclose(colours[name], want, atol=1), name


@pytest.mark.parametrize("wrap", [None, "my_dataset"], ids=["flat", "wrapped"])
def test_imagefolder_from_a_zip_equals_the_folder(tmp_path, wrap):
    root = _tree(tmp_path / "pets", {"cat": RED, "dog": BLUE})
    from_dir = load_data(_folder(root), seed=0)
    from_zip = load_data(_folder(_zip(root, tmp_path / "pets.zip", wrap)), seed=0)
    assert from_zip.info.class_names == ["cat", "dog"]
    assert torch.equal(whole(from_zip.train.images), whole(from_dir.train.images))
    assert torch.equal(from_zip.val.labels, from_dir.val.labels)


@pytest.mark.parametrize("disk_cache", [True, False], ids=["image_cache", "per_item"])
def test_lazy_and_eager_image_folders_agree(tmp_path, disk_cache):
    root = _tree(tmp_path / "pets", {"cat": RED, "dog": BLUE})
    eager, lazy = load_data(_folder(root), seed=0), load_data(_folder(root, cache_mb=0, disk_cache=disk_cache), seed=0)
    kind = CachedImages if disk_cache else LazyImages
    assert isinstance(eager.train.images, CachedImages) and eager.train.images.held  # served from the cache's pages
    assert isinstance(lazy.train.images, kind) and not getattr(lazy.train.images, "held", False)
    lazily = torch.stack([lazy.train.images[i] for i in range(len(lazy.train))])
    assert torch.equal(lazily, whole(eager.train.images))
    assert eager.info.mean == pytest.approx(lazy.info.mean) and eager.info.channels == lazy.info.channels


def _all_images(b) -> tuple[torch.Tensor, torch.Tensor]:
    return torch.cat([whole(b.train.images), whole(b.val.images)]), torch.cat([b.train.labels, b.val.labels])


def _colours(x: torch.Tensor) -> set[tuple[int, ...]]:
    """The colours of images that are a single colour each."""
    assert (x == x[:, :, :1, :1]).all(), "each test image is one flat colour"
    return {tuple(v.tolist()) for v in x[:, :, 0, 0]}


def test_mixed_image_modes_become_rgb_with_transparency_on_white(tmp_path):
    root = tmp_path / "mixed"
    _png(root / "a" / "gray.png", "L", 100)
    _png(root / "a" / "rgb.png", "RGB", RED)
    _png(root / "b" / "clear.png", "RGBA", (0, 0, 0, 0))  # fully transparent → white, not black
    _png(root / "b" / "half.png", "LA", (0, 255))  # opaque black in gray+alpha
    b = load_data(_folder(root, val_fraction=0.5), seed=0)
    assert b.info.channels == 3
    x, y = _all_images(b)
    assert x.shape[1:] == (3, 8, 8)
    assert _colours(x[y == 0]) == {(100, 100, 100), RED}  # gray replicated into R, G and B
    assert _colours(x[y == 1]) == {(255, 255, 255), (0, 0, 0)}


def test_all_grayscale_folder_stays_one_channel_and_16_bit_is_scaled(tmp_path):
    root = tmp_path / "gray"
    for i in range(2):
        _png(root / "a" / f"{i}.png", "L", 30)
        (root / "b").mkdir(exist_ok=True)
        Image.fromarray(np.full((6, 6), 40000, dtype=np.uint16)).save(root / "b" / f"{i}.png")  # 16-bit PNG
    b = load_data(_folder(root, val_fraction=0.5), seed=0)
    assert b.info.channels == 1
    x, y = _all_images(b)
    assert _colours(x[y == 0]) == {(30,)}
    assert _colours(x[y == 1]) == {(round(40000 / 257),)}  # mid-gray, not clipped to white


def test_corrupt_images_are_skipped_counted_and_named(tmp_path):
    root = _tree(tmp_path / "pets", {"cat": RED, "dog": BLUE}, n=10)
    (root / "dog" / "broken.png").write_bytes(b"\x89PNG\r\n\x1a\nnot really")
    b = load_data(_folder(root, max_bad_fraction=0.1), seed=0)
    assert b.info.skipped == 1 and b.info.skipped_files == ["dog/broken.png"]
    assert b.info.num_train + b.info.num_val + b.info.num_test == 20


def test_too_many_corrupt_images_are_refused_naming_them(tmp_path):
    root = _tree(tmp_path / "pets", {"cat": RED, "dog": BLUE}, n=4)
    (root / "cat" / "empty.jpg").write_bytes(b"")
    with pytest.raises(DataError, match="max_bad_fraction=0.0") as e:
        load_data(_folder(root, max_bad_fraction=0.0), seed=0)
    assert "1 of 9 images are unreadable" in str(e.value) and "cat/empty.jpg" in str(e.value)


def _bad_input(tmp_path: Path, case: str) -> tuple[Path, list[str]]:
    if case == "missing":
        return tmp_path / "nowhere", ["not found", str(tmp_path / "nowhere")]
    if case == "not_a_zip":
        p = tmp_path / "photos.zip"
        p.write_text("this is not a zip")
        return p, [str(p), "not a zip"]
    if case == "one_class":
        return _tree(tmp_path / "one", {"cat": RED}), ["at least 2 class", "found 1 (cat)"]
    if case == "empty_class":
        root = _tree(tmp_path / "pets", {"cat": RED, "dog": BLUE})
        (root / "bird").mkdir()
        (root / "emu").mkdir()
        (root / "emu" / "notes.txt").write_text("no pictures yet")
        return root, ["no images", "bird, emu", str(root)]
    root = _tree(tmp_path / "pets", {"cat": RED, "dog": BLUE})
    (root / "bird").mkdir()
    return _zip(root, tmp_path / "pets.zip", wrap="top"), ["no images", "bird"]


@pytest.mark.parametrize("case", ["missing", "not_a_zip", "one_class", "empty_class", "empty_class_in_zip"])
def test_bad_image_folders_get_errors_naming_problem_and_path(tmp_path, case):
    path, needles = _bad_input(tmp_path, case)
    with pytest.raises(DataError) as e:
        load_data(_folder(path), seed=0)
    for needle in needles:
        assert needle in str(e.value), f"{needle!r} not in: {e.value}"


def test_a_datasets_fingerprint_says_what_the_data_was_wherever_it_lies(tmp_path):
    """The model registry's lineage: the same files give the same fingerprint (in another folder too), a changed
    file another; a set loaded whole is hashed by its content."""
    import shutil

    from core.config import RunSpec
    from core.events import MemorySink
    from core.train import run_training

    root = _tree(tmp_path / "pets", {"cat": RED, "dog": BLUE})
    first = load_data(_folder(root), seed=0).info.fingerprint
    assert len(first) == 64 and load_data(_folder(root), seed=1).info.fingerprint == first
    moved = shutil.copytree(root, tmp_path / "elsewhere" / "pets", copy_function=shutil.copy2)  # times kept
    assert load_data(_folder(moved), seed=0).info.fingerprint == first
    _png(root / "dog" / "0.png", color=GREEN, size=9)  # one photo replaced
    assert load_data(_folder(root), seed=0).info.fingerprint != first
    digits = load_data(DataSpec(name="digits"), seed=0).info.fingerprint
    assert digits == load_data(DataSpec(name="digits", val_fraction=0.3), seed=5).info.fingerprint
    assert digits != load_data(DataSpec(name="synthetic"), seed=0).info.fingerprint
    spec = RunSpec.from_dict({"data": {"name": "digits"}, "model": {"name": "mlp"}, "train": {"epochs": 1}})
    summary = run_training(spec, tmp_path / "run", MemorySink())
    assert summary["dataset_fingerprint"] == digits  # what the registry records for a version of this run
