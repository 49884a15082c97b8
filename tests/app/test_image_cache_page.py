"""The image cache on this machine, as a user meets it: the Datasets page lists its entries with their size and
removes them (all, or one) showing what that freed; `torchdeck cache list | remove | clear` does the same from a
shell; in team mode only an admin may remove, refused in app/services/image_cache.py and not only hidden. The
entries are real ones, built by core.image_cache.build under a temporary TORCHDECK_IMAGE_CACHE."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from test_dataset_owners import ANA, ROOT, datasets_page, team, who  # noqa: F401 - `team` is a fixture
from typer.testing import CliRunner

from app import auth
from app.cli import app as cli
from app.present import text as f
from app.services import image_cache as cache
from core import image_cache

SIDE = 64


def build(root: Path, source: str, images: int, part: str = "train", mode: str = "RGB") -> image_cache.CacheEntry:
    """A finished entry of `images` decoded images of SIDE px, as a run builds one, as list_entries lists it."""
    channels = 3 if mode == "RGB" else 1
    key = image_cache.entry_key(image_cache.fingerprint([(source, images, 1)]), part, mode, SIDE, "bilinear")
    describe = {
        "source": source,
        "part": part,
        "mode": mode,
        "side": SIDE,
        "interpolation": "bilinear",
        "files": images,
    }

    shape = (images, channels, SIDE, SIDE)

    def fill(path: Path):  # writes every row of the sized file, as a run's decoding does
        rows = np.memmap(path, dtype=np.uint8, mode="r+", shape=shape)
        rows[:] = 7
        rows.flush()
        return np.arange(images), []

    image_cache.build(root, key, describe, shape, fill)
    return next(e for e in image_cache.list_entries(root) if e.key == key)


@pytest.fixture
def cache_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    root = tmp_path / "image-cache"
    monkeypatch.setenv(image_cache.CACHE_ENV, str(root))
    return root


@pytest.fixture
def two(cache_dir: Path) -> tuple[image_cache.CacheEntry, image_cache.CacheEntry]:
    """/data/pets (100 RGB images, ≈1.2 MB) and /data/birds' val part (20 gray images)."""
    return build(cache_dir, "/data/pets", 100), build(cache_dir, "/data/birds", 20, part="val", mode="L")


def mb(n: int) -> float:
    return round(n / 2**20, 2)


# --- the service ---------------------------------------------------------------------------------------------------


def test_the_service_lists_the_entries_and_removing_one_frees_its_bytes(two, cache_dir):
    pets, birds = two
    assert pets.bytes >= 100 * 3 * SIDE * SIDE and birds.bytes >= 20 * SIDE * SIDE
    listed = {e.source: e for e in cache.entries()}
    assert set(listed) == {"/data/pets", "/data/birds"} and cache.root() == cache_dir
    assert (listed["/data/birds"].part, listed["/data/birds"].mode, listed["/data/birds"].images) == ("val", "L", 20)
    assert cache.total_bytes(cache.entries()) == pets.bytes + birds.bytes
    assert cache.remove(pets.key, by=auth.local_user()) == pets.bytes
    assert not pets.folder.exists() and birds.folder.is_dir()
    assert [e.key for e in cache.entries()] == [birds.key]
    with pytest.raises(KeyError):
        cache.remove(pets.key, by=auth.local_user())
    assert cache.clear(by=auth.local_user()) == birds.bytes
    assert cache.entries() == [] and not birds.folder.exists()


def test_in_team_mode_only_an_admin_removes_entries(team, two):  # noqa: F811
    pets, birds = two
    with pytest.raises(auth.PermissionDenied, match="only an admin"):
        cache.remove(pets.key, by=who(ANA))
    with pytest.raises(auth.PermissionDenied):
        cache.clear(by=who(ANA))
    with pytest.raises(auth.PermissionDenied):
        cache.remove(pets.key, by=None)
    assert pets.folder.is_dir() and birds.folder.is_dir() and len(cache.entries()) == 2
    assert cache.remove(pets.key, by=who(ROOT)) == pets.bytes and not pets.folder.exists()
    assert cache.clear(by=who(ROOT)) == birds.bytes and cache.entries() == []


def test_the_cache_turned_off_lists_nothing(monkeypatch):
    monkeypatch.setenv(image_cache.CACHE_ENV, "off")
    assert cache.root() is None and cache.entries() == []


# --- torchdeck cache -----------------------------------------------------------------------------------------------


def run_cli(*args: str):
    return CliRunner().invoke(cli, ["cache", *args])


def test_cache_list_shows_each_entry_and_the_total(two, cache_dir):
    pets, birds = two
    r = run_cli("list")
    assert r.exit_code == 0, r.output
    row = next(line for line in r.output.splitlines() if pets.key in line)
    assert (
        "/data/pets" in row
        and "train" in row
        and "RGB 64 px" in row
        and "100" in row
        and f"{mb(pets.bytes):.2f} MB" in row
    )
    assert birds.key in r.output
    assert f"2 entries, {mb(pets.bytes + birds.bytes):,.2f} MB at {cache_dir}" in r.output


def test_cache_remove_frees_the_entry_and_refuses_an_unknown_key(two):
    pets, birds = two
    r = run_cli("remove", pets.key)
    assert r.exit_code == 0, r.output
    assert f"removed {pets.key}: freed {mb(pets.bytes):.2f} MB" in r.output and not pets.folder.exists()
    r = run_cli("remove", pets.key)
    assert r.exit_code == 1 and f"no image cache entry {pets.key!r}" in r.output
    assert birds.folder.is_dir()


def test_cache_clear_empties_it(two, cache_dir):
    pets, birds = two
    r = run_cli("clear")
    assert r.exit_code == 0, r.output
    assert f"removed 2 entries: freed {mb(pets.bytes + birds.bytes):.2f} MB" in r.output
    assert not pets.folder.exists() and not birds.folder.exists()
    assert f"the image cache at {cache_dir} is empty" in run_cli("list").output


def test_cache_commands_when_the_cache_is_off(monkeypatch):
    monkeypatch.setenv(image_cache.CACHE_ENV, "off")
    r = run_cli("list")
    assert r.exit_code == 0 and "the image cache is off on this machine (TORCHDECK_IMAGE_CACHE=off)" in r.output
    assert run_cli("remove", "abc").exit_code == 1


# --- the Datasets page ---------------------------------------------------------------------------------------------


def cache_table(at):
    return next(d.value for d in at.dataframe if "side (px)" in d.value.columns)


def test_the_page_lists_the_entries_and_removes_one_showing_what_it_freed(page, two):
    pets, birds = two
    at = page("datasets.py")
    assert not at.exception
    assert any("Image cache on this machine" in h.value for h in at.subheader)
    total = f.size(pets.bytes + birds.bytes)
    assert any(f"**{total}** in 2 entries" in m.value and "This machine's cache" in m.value for m in at.markdown)
    rows = cache_table(at).set_index("dataset")
    assert rows.loc["/data/pets", "part"] == "train" and rows.loc["/data/pets", "side (px)"] == SIDE
    assert rows.loc["/data/pets", "images"] == 100 and rows.loc["/data/pets", "size (MB)"] == mb(pets.bytes)
    assert rows.loc["/data/birds", "mode"] == "L" and rows.loc["/data/birds", "key"] == birds.key

    at.button(key=f"imgcache.rm.{pets.key}").click().run()
    assert not at.exception
    assert any(f"freed {f.size(pets.bytes)}" in s.value for s in at.success)
    assert not pets.folder.exists() and birds.folder.is_dir()
    assert list(cache_table(at)["dataset"]) == ["/data/birds"]

    at.button(key="imgcache.clear").click().run()
    assert any(f"freed {f.size(birds.bytes)}" in s.value for s in at.success)
    assert cache.entries() == []
    assert any("image cache" in c.value and "is empty" in c.value for c in at.caption)


def test_the_page_says_when_the_cache_is_off_or_empty(page, cache_dir, monkeypatch):
    at = page("datasets.py")
    assert any(f"image cache ({f.code_span(cache_dir)}) is empty" in c.value for c in at.caption)
    monkeypatch.setenv(image_cache.CACHE_ENV, "off")
    at = page("datasets.py")
    assert any("The image cache is off on this machine (TORCHDECK_IMAGE_CACHE=off)" in c.value for c in at.caption)


def test_in_team_mode_the_page_offers_removal_to_admins_only(team, engine, home, two):  # noqa: F811
    pets, _ = two
    member = datasets_page(ANA)
    assert not member.exception
    assert pets.key in list(cache_table(member)["key"])
    assert any("Only an admin may remove image cache entries" in c.value for c in member.caption)
    assert not [b for b in member.button if b.key and b.key.startswith("imgcache.")]
    admin = datasets_page(ROOT)
    admin.button(key=f"imgcache.rm.{pets.key}").click().run()
    assert any(f"freed {f.size(pets.bytes)}" in s.value for s in admin.success)
    assert not pets.folder.exists()
