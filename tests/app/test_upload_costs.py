"""What an upload may cost the dashboard: a zip's list of files is sized up from its end record before zipfile
parses it (600,000 entries were 4 s and 200 MB before the 200,000-file limit was even looked at), and the
Datasets page previews thumbnails made once at upload (it used to hand each full-size image to Streamlit,
which decoded and resized it at every page run)."""

from __future__ import annotations

import io
import shutil
import struct
import tracemalloc
import zipfile
from pathlib import Path

import pytest
from PIL import Image
from streamlit.delta_generator import DeltaGenerator

from app.services import dataset_previews, zip_directory
from app.services import datasets as ds
from db import repo

# --- the zip's directory ----------------------------------------------------------------------------------


def crafted_zip(entries: int, claimed: int | None = None) -> bytes:
    """A zip whose central directory lists `entries` empty files `c<0|1>/<i>.png` (zip64 beyond 65,534), its end
    record claiming `claimed` of them (default: the truth). zipfile opens it as it would a real one."""
    names = [f"c{i % 2}/{i}.png".encode() for i in range(entries)]
    head = struct.Struct("<4s4B4HL2L5H2L")
    directory = b"".join(
        head.pack(b"PK\x01\x02", 20, 3, 20, 0, 0, 0, 0, 0x21, 0, 0, 0, len(n), 0, 0, 0, 0, 0o100644 << 16, 0) + n
        for n in names
    )
    claimed = entries if claimed is None else claimed
    tail = b""
    if claimed >= 0xFFFF:
        tail = struct.pack("<4sQ2H2L4Q", b"PK\x06\x06", 44, 45, 45, 0, 0, claimed, claimed, len(directory), 0)
        tail += struct.pack("<4sLQL", b"PK\x06\x07", 0, len(directory), 1)
    short = min(claimed, 0xFFFF)
    return directory + tail + struct.pack("<4s4H2LH", b"PK\x05\x06", 0, 0, short, short, len(directory), 0, 0)


@pytest.fixture(scope="module")
def zip_600k() -> bytes:
    return crafted_zip(600_000)


@pytest.mark.parametrize("entries", [3, 70_000])
def test_the_end_record_is_read_as_zipfile_reads_it(entries):
    data = crafted_zip(entries)
    with zipfile.ZipFile(io.BytesIO(data)) as zf:
        assert len(zf.infolist()) == entries
    found = zip_directory.read_directory(io.BytesIO(data))
    assert (found.entries, found.size, found.start) == (entries, len(data) - (22 if entries < 0xFFFF else 98), 0)
    real = io.BytesIO()
    with zipfile.ZipFile(real, "w") as zf:
        zf.writestr("cat/1.png", b"x" * 100)
        zf.comment = b"a comment"
    found = zip_directory.read_directory(io.BytesIO(real.getvalue()))
    assert found.entries == 1 and zip_directory.count_entries(io.BytesIO(real.getvalue()), found, 10) == 1


def _refused(engine, data: bytes) -> tuple[str, float]:
    tracemalloc.start()
    try:
        with pytest.raises(ds.UploadRefused) as e:
            ds.store_upload(engine, "many", io.BytesIO(data), len(data), owner="local")
        peak = tracemalloc.get_traced_memory()[1] / 2**20
    finally:
        tracemalloc.stop()
    return str(e.value), peak


def test_a_zip_listing_600000_entries_is_refused_before_its_directory_is_parsed(engine, home, zip_600k):
    message, peak = _refused(engine, zip_600k)
    assert message.startswith(
        f"the archive lists 600,000 entries (files and folders); at most {ds.MAX_ENTRIES:,} "
        "are read (at most 200,000 images)"
    ), message
    assert peak < 50, f"refusing it took {peak:.0f} MB: the directory was parsed"
    assert list((home / "datasets").iterdir()) == [] and repo.list_datasets(engine) == []


def test_an_end_record_that_understates_the_entries_is_caught_by_counting_them(engine, home):
    liar = crafted_zip(ds.MAX_ENTRIES + 5, claimed=10)
    message, peak = _refused(engine, liar)
    assert f"holds more than {ds.MAX_ENTRIES:,} entries" in message and "claims 10" in message, message
    assert peak < 50


def test_a_directory_larger_than_its_bound_is_refused(engine, home, monkeypatch):
    monkeypatch.setattr(ds, "MAX_DIRECTORY_MB", 1)
    message, _ = _refused(engine, crafted_zip(40_000))  # 2 MB of directory
    assert "the archive's list of files is 2 MB long; at most 1 MB are read" in message, message


# --- preview thumbnails ----------------------------------------------------------------------------------


def _png(size: tuple[int, int], color: str, mode: str = "RGB") -> bytes:
    buf = io.BytesIO()
    Image.new(mode, size, color if mode != "1" else 1).save(buf, "PNG")
    return buf.getvalue()


def _upload(engine, entries: dict[str, bytes], name: str = "photos"):
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", zipfile.ZIP_DEFLATED) as zf:
        for n, data in entries.items():
            zf.writestr(n, data)
    return ds.store_upload(engine, name, io.BytesIO(buf.getvalue()), len(buf.getvalue()), owner="local")


@pytest.fixture
def photos() -> dict[str, bytes]:
    """30 images of 1600×1200 in three classes (the preview shows 24: four of each of the first six classes)."""
    big = {c: _png((1600, 1200), c) for c in ("red", "green", "blue")}
    return {f"photos/{c}/{i:02d}.png": big[c] for c in big for i in range(10)}


@pytest.fixture
def shown(monkeypatch) -> list:
    """What the pages hand st.image, recorded."""
    calls: list = []
    real = DeltaGenerator.image

    def image(self, source, *args, **kwargs):
        calls.append(source)
        return real(self, source, *args, **kwargs)

    monkeypatch.setattr(DeltaGenerator, "image", image)
    return calls


def _open_preview(page, name: str, shown: list | None = None):
    at = page("datasets.py")
    at.selectbox(key="ds.pick").set_value(name)
    if shown is not None:
        shown.clear()  # what this run shows
    return at.run()


def test_the_preview_shows_small_thumbnails_made_at_upload(page, engine, home, photos, shown):
    record = _upload(engine, photos)
    folder = dataset_previews.folder_for(Path(record.uri))
    assert folder.parent == home / "datasets" / ".previews" and len(list(folder.glob("*.png"))) == 12
    at = _open_preview(page, "photos", shown)
    assert not at.exception
    assert (
        len(shown) == 12
        and sorted(i.proto.imgs[0].caption for i in at.image) == ["blue"] * 4 + ["green"] * 4 + ["red"] * 4
    )
    for source in shown:  # the thumbnails, never the 1600×1200 images of the dataset
        path = Path(source)
        assert path.parent == folder, source
        with Image.open(path) as im:
            assert max(im.size) <= dataset_previews.SIDE
    # they live beside the dataset, not in it: runs and the published zip see class folders only
    assert sorted(p.name for p in Path(record.uri).iterdir()) == ["blue", "green", "red"]


def test_an_older_upload_gets_its_thumbnails_once_at_its_first_view(page, engine, home, photos, shown, monkeypatch):
    record = _upload(engine, photos)
    shutil.rmtree(dataset_previews.folder_for(Path(record.uri)))  # as an upload made before thumbnails existed
    at = _open_preview(page, "photos", shown)
    assert not at.exception and len(shown) == 12
    assert all(Path(s).parent == dataset_previews.folder_for(Path(record.uri)) for s in shown)

    def again(*args):
        raise AssertionError("a thumbnail was made again")

    monkeypatch.setattr(dataset_previews, "thumbnail", again)
    shown.clear()
    at.run()
    assert not at.exception and len(shown) == 12


def test_images_beyond_the_decoding_budget_are_left_out_and_said_so(page, engine, home, monkeypatch):
    """A PNG is decoded whole to make its thumbnail (64 MP: ~0.8 s, up to 256 MB): at most BUDGET_PIXELS are, in
    all, per dataset (here lowered to 2 MP: two 1 MP images fit, the third does not)."""
    monkeypatch.setattr(dataset_previews, "BUDGET_PIXELS", 2_000_000)
    mp = _png((1000, 1000), "white")
    record = _upload(engine, {"a/1.png": mp, "a/2.png": mp, "a/3.png": mp, "b/1.png": _png((20, 20), "blue")})
    made = ds.previews(record.uri)
    assert [c for c, _ in made.shown] == ["a", "a"] and made.left_out == 2
    at = _open_preview(page, record.name)
    assert any("2 image(s) not previewed" in c.value for c in at.caption), [c.value for c in at.caption]


def test_thumbnails_go_with_their_dataset(engine, home, photos, monkeypatch):
    from app import auth

    record = _upload(engine, photos)
    folder = dataset_previews.folder_for(Path(record.uri))
    ds.remove(engine, record.id, by=auth.local_user())
    assert not folder.exists() and not Path(record.uri).exists()

    def unreachable(name, where):
        raise OSError("the store is down")

    monkeypatch.setattr(ds, "publish", unreachable)
    with pytest.raises(ds.UploadRefused, match="could not be copied to the artifact store"):
        _upload(engine, photos, name="again")
    assert list((home / "datasets" / ".previews").iterdir()) == []
    assert [p.name for p in (home / "datasets").iterdir()] == [".previews"]
