"""Datasets: a good ImageFolder zip is stored under $TORCHDECK_HOME/datasets and previewed; every
kind of bad upload is refused with a clear message and leaves nothing behind."""

from __future__ import annotations

import io
import os
import stat
import zipfile
from pathlib import Path

import pytest
from PIL import Image

from app.services import datasets as ds
from db import repo


def png(color: str = "red") -> bytes:
    buf = io.BytesIO()
    Image.new("RGB", (12, 12), color).save(buf, format="PNG")
    return buf.getvalue()


def make_zip(entries: dict[str, bytes], *, link: str | None = None) -> io.BytesIO:
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", zipfile.ZIP_DEFLATED) as zf:
        for name, data in entries.items():
            zf.writestr(name, data)
        if link:
            info = zipfile.ZipInfo(link)
            info.external_attr = (stat.S_IFLNK | 0o777) << 16
            zf.writestr(info, "/etc/passwd")
    buf.seek(0)
    return buf


GOOD = {"pets/cat/1.png": png("red"), "pets/cat/2.png": png("orange"), "pets/dog/1.png": png("blue")}


def _store(engine, name: str, buf: io.BytesIO):
    return ds.store_upload(engine, name, buf, len(buf.getvalue()), owner="local")


def test_builtin_datasets_and_empty_state(page):
    at = page("datasets.py")
    assert not at.exception
    builtin = at.dataframe[0].value
    assert {"digits", "synthetic", "mnist", "cifar10"} <= set(builtin["name"])
    assert builtin[builtin.name == "digits"].iloc[0]["images"] == "1,797"
    assert any("No uploaded datasets yet" in c.value for c in at.caption)


def test_upload_stores_registers_and_previews(page, engine, home):
    at = page("datasets.py")
    at.text_input(key="ds.name").input("pets")
    at.file_uploader(key="ds.file").upload("pets.zip", make_zip(GOOD).getvalue(), "application/zip")
    next(b for b in at.button if b.label == "Upload and check").click()
    at.run()
    assert any("Stored pets: 3 images in 2 classes" in s.value for s in at.success), [e.value for e in at.error]
    record = repo.list_datasets(engine)[0]
    stored = Path(record.uri)
    assert stored.parent == home / "datasets" and stored.name.startswith("pets-")  # a folder of its own
    assert sorted(p.relative_to(stored).as_posix() for p in stored.rglob("*.png")) == [
        "cat/1.png",
        "cat/2.png",
        "dog/1.png",
    ]
    assert record.uri == str(stored) and record.counts == {"cat": 2, "dog": 1} and record.status == "ready"
    at.run()
    assert len(at.image) == 3 and sorted(i.proto.imgs[0].caption for i in at.image) == ["cat", "cat", "dog"]
    # The New run form offers it: the run's data.path is the stored folder.
    new = page("new_run.py")
    assert "pets" in new.selectbox(key="nr.dataset").options


def test_refusal_is_shown_on_the_page(page):
    at = page("datasets.py")
    at.text_input(key="ds.name").input("one")
    at.file_uploader(key="ds.file").upload("one.zip", make_zip({"cat/1.png": png()}).getvalue(), "application/zip")
    next(b for b in at.button if b.label == "Upload and check").click()
    at.run()
    assert any("Upload refused" in e.value and "at least two classes" in e.value for e in at.error)


@pytest.mark.parametrize(
    "entries, link, message",
    [
        ({"../evil/1.png": png(), "cat/1.png": png(), "dog/1.png": png()}, None, "unsafe path"),
        ({"/abs/1.png": png(), "cat/1.png": png(), "dog/1.png": png()}, None, "unsafe path"),
        ({"cat/1.png": png(), "dog/1.png": png()}, "cat/link.png", "symbolic link"),
        ({"cat/1.png": png(), "dog/1.png": png(), "dog/bomb.png": b"\0" * (8 << 20)}, None, "zip bomb"),
        ({"cat/1.png": png(), "dog/1.png": png(), "dog/notes.txt": b"hello"}, None, "not images"),
        ({"cat/1.png": png(), "dog/1.png": b"this is no png"}, None, "could not be read as images"),
        ({"cat/1.png": png(), "cat/2.png": png()}, None, "at least two classes"),
        ({"cat/1.png": png(), "dog/1.png": png(), "loose.png": png()}, None, "outside a class folder"),
        ({"cat/1.png": png(), "d" * 190 + "/1.png": png()}, None, "has 190 characters.*at most 186"),
    ],
)
def test_bad_archives_are_refused_and_leave_nothing(engine, home, entries, link, message):
    with pytest.raises(ds.UploadRefused, match=message):
        _store(engine, "bad", make_zip(entries, link=link))
    assert list((home / "datasets").iterdir()) == []
    assert not (home / "evil").exists() and not Path("/abs/1.png").exists()
    assert repo.list_datasets(engine) == []


def test_not_a_zip_too_big_bad_name_and_duplicate(engine, home, monkeypatch):
    with pytest.raises(ds.UploadRefused, match="not a zip"):
        _store(engine, "x", io.BytesIO(b"plain text"))
    with pytest.raises(ds.UploadRefused, match="names use letters"):
        _store(engine, "../x", make_zip(GOOD))
    monkeypatch.setattr(ds, "MAX_UPLOAD_MB", 0)
    with pytest.raises(ds.UploadRefused, match="the limit is 0 MB"):
        _store(engine, "x", make_zip(GOOD))
    monkeypatch.setattr(ds, "MAX_UPLOAD_MB", 200)
    _store(engine, "pets", make_zip(GOOD))
    with pytest.raises(ds.UploadRefused, match="exists already"):
        _store(engine, "pets", make_zip(GOOD))


def test_archives_that_unpack_beyond_the_limit_are_refused(engine, home, monkeypatch):
    monkeypatch.setattr(ds, "MAX_UNPACKED_MB", 1)
    big = {"cat/1.png": png(), "dog/1.png": png(), "dog/2.png": png() + os.urandom(2 << 20)}
    with pytest.raises(ds.UploadRefused, match="unpacks to 2 MB; the limit is 1 MB"):
        _store(engine, "big", make_zip(big))
    assert list((home / "datasets").iterdir()) == []


def test_a_new_upload_under_a_deleted_datasets_name_is_never_read_by_the_old_runs(engine, home):
    """Runs keep the folder they were given: after a dataset is deleted and another uploaded under its name,
    the old runs find nothing (and say so) instead of training on someone else's images."""
    from app import auth

    first = _store(engine, "pets", make_zip(GOOD))
    ds.remove(engine, first.id, by=auth.local_user())
    second = _store(engine, "pets", make_zip({"pets/ant/1.png": png("red"), "pets/bee/1.png": png("blue")}))
    assert second.uri != first.uri and not Path(first.uri).exists()
    assert sorted(p.name for p in Path(second.uri).iterdir()) == ["ant", "bee"]
