"""Datasets page: the name box defaults to the chosen zip's file name, every ready dataset (built in or
uploaded) links to New run with it selected (`new?dataset=<name>`), and the built-in datasets get a preview
and a class balance like uploads do."""

from __future__ import annotations

import io

import pytest
from PIL import Image
from seeding import plotly_figures
from test_datasets_page import GOOD, make_zip

from app.present import builtin_datasets as builtin
from app.services import datasets as ds
from db import repo


def train_links(at) -> list[tuple[str, str]]:
    return [
        (el.proto.page, el.proto.query_string)
        for el in at.get("page_link")
        if el.proto.label == "Train on this dataset"
    ]


@pytest.mark.parametrize(
    "filename, taken, expected",
    [
        ("Pets Photos (v2).zip", (), "pets-photos-v2"),
        ("Café.ZIP", (), "cafe"),
        ("my.data.zip", (), "my.data"),
        ("__.zip", (), "dataset"),
        ("pets.zip", ("pets", "pets-2"), "pets-3"),
        ("a" * 80 + ".zip", ("a" * 64,), "a" * 62 + "-2"),
    ],
)
def test_default_names_pass_the_name_rules(filename, taken, expected):
    assert ds.default_name(filename, taken) == expected
    assert ds.check_name(expected) == expected


def test_the_name_box_defaults_to_the_zips_name_and_the_upload_links_to_new_run(page, engine):
    at = page("datasets.py")
    at.file_uploader(key="ds.file").upload("Pets Photos (v2).zip", make_zip(GOOD).getvalue(), "application/zip")
    at.run()
    assert not at.exception
    assert at.text_input(key="ds.name").value == "pets-photos-v2"
    next(b for b in at.button if b.label == "Upload and check").click()
    at.run()
    assert any("Stored pets-photos-v2: 3 images in 2 classes" in s.value for s in at.success), [
        e.value for e in at.error
    ]
    assert [d.name for d in repo.list_datasets(engine)] == ["pets-photos-v2"]
    assert at.text_input(key="ds.name").value == ""  # the form is emptied for the next upload
    assert ("new", "dataset=pets-photos-v2") in train_links(at)


def test_a_name_typed_first_is_kept(page, engine):
    at = page("datasets.py")
    at.text_input(key="ds.name").input("mine")
    at.file_uploader(key="ds.file").upload("Other Name.zip", make_zip(GOOD).getvalue(), "application/zip")
    at.run()
    assert at.text_input(key="ds.name").value == "mine"


def test_digits_preview_shows_samples_and_its_class_balance(page):
    at = page("datasets.py")
    assert not at.exception
    assert at.selectbox(key="ds.builtin").value is None and not at.image and not train_links(at)
    at.selectbox(key="ds.builtin").set_value("digits").run()
    assert not at.exception and len(at.image) == 1
    balance = plotly_figures(at)["Images per class"]["data"][0]
    assert balance["x"] == [str(d) for d in range(10)] and sum(balance["y"]) == 1797
    assert train_links(at) == [("new", "dataset=digits")]


def test_every_built_in_links_to_new_run_with_it_selected(page):
    at = page("datasets.py")
    at.selectbox(key="ds.builtin").set_value("synthetic").run()
    assert any("no stored images" in m.value for m in at.markdown)
    assert sum(plotly_figures(at)["Images per class with the defaults"]["data"][0]["y"]) == 2000
    assert len(at.image) == 0 and train_links(at) == [("new", "dataset=synthetic")]
    at.selectbox(key="ds.builtin").set_value("cifar10").run()
    assert any("read by torchvision from disk" in m.value for m in at.markdown)
    assert len(at.image) == 0 and not plotly_figures(at)
    assert train_links(at) == [("new", "dataset=cifar10")]


def test_digits_samples_grid_and_counts():
    grid, counts = builtin.digits_samples(per_class=3, scale=2, gap=1)
    image = Image.open(io.BytesIO(grid))
    assert image.size == (3 * 16 + 2, 10 * 16 + 9)
    assert list(counts) == [str(d) for d in range(10)] and sum(counts.values()) == 1797
    assert builtin.synthetic_counts(10, 3) == {"class_0": 4, "class_1": 3, "class_2": 3}


def test_the_built_in_datasets_are_the_catalogs_with_its_figures(page, monkeypatch, tmp_path):
    """A torchvision dataset added to core/catalog.py is listed, described and previewed like the others."""
    from core import catalog

    svhn = catalog.DatasetEntry("torchvision", ("train", "test"), 3, 32, 10, 99_289, "SVHN", "svhn", "train_32x32.mat")
    monkeypatch.setitem(catalog.DATASETS, "svhn", svhn)
    monkeypatch.setenv("TORCHDECK_DATA", str(tmp_path))
    (tmp_path / "svhn").mkdir()
    at = page("datasets.py")
    table = at.dataframe[0].value.set_index("name")
    assert list(table.index) == ["digits", "synthetic", "mnist", "fashion_mnist", "cifar10", "svhn"]  # no upload kind
    assert dict(table.loc["svhn"]) == {
        "images": "99,289",
        "classes": "10",
        "size": "32×32 RGB",
        "available": True,
        "source": f"torchvision, from {tmp_path / 'svhn'} (or data.download with internet)",
    }
    assert dict(table.loc["mnist"])["size"] == "28×28 gray" and not table.loc["mnist", "available"]
    assert dict(table.loc["digits"]) == {
        "images": "1,797",
        "classes": "10",
        "size": "8×8 gray",
        "available": True,
        "source": "sklearn.datasets.load_digits (ships inside its package)",
    }
    assert table.loc["synthetic", "images"] == "2,000 (data.num_samples)"
    assert table.loc["synthetic", "size"] == "32×32 (data.size)"
    at.selectbox(key="ds.builtin").set_value("svhn").run()
    assert any(str(tmp_path / "svhn") in m.value and "It is there on this machine" in m.value for m in at.markdown)
