"""The Run page's Predict tab: a real digits model's verified ONNX export, its predictions equal to a user's own
onnxruntime script with the bundle's preprocessing; every bad file refused with why (too large, not an image, a
bomb refused from its header, too many files); unusual modes converted as training decodes them; the tab drawn."""

from __future__ import annotations

import io
import re
import struct
import zlib
from pathlib import Path

import numpy as np
import pytest
from PIL import Image
from seeding import seed_run

from app.services import predict
from app.services.artifacts import artifact_root
from core import export_predict
from core.decode import decode
from core.names import MAX_IMAGE_PIXELS
from db import repo
from tests._onnx_digits import digit_png, reference, register, train_and_export

DIGITS_8 = {"data": {"name": "digits", "image_size": 8}}


@pytest.fixture(scope="module")
def exported(tmp_path_factory: pytest.TempPathFactory) -> tuple[dict, Path]:
    out = tmp_path_factory.mktemp("digits_onnx")
    return train_and_export(out), out


@pytest.fixture
def finished(engine, exported):
    """A completed digits run with its verified ONNX export registered under this installation's run root."""
    report, out = exported
    r = seed_run(engine, "digits", spec=DIGITS_8, epochs=1)
    return r, register(engine, r.id, artifact_root(), report, out)


class Counting(io.BytesIO):
    """A file that counts the bytes read from it."""

    def __init__(self, data: bytes):
        super().__init__(data)
        self.bytes_read = 0

    def read(self, n: int | None = -1) -> bytes:
        piece = super().read(n)
        self.bytes_read += len(piece)
        return piece

    def readinto(self, buffer) -> int:
        n = super().readinto(buffer)
        self.bytes_read += n
        return n


def _png_claiming(width: int, height: int, padding: int) -> bytes:
    """A PNG whose header declares width × height 8-bit grayscale pixels, followed by `padding` bytes of a
    compressed IDAT that would inflate to gigabytes: a decompression bomb written byte by byte."""

    def chunk(kind: bytes, body: bytes) -> bytes:
        return struct.pack(">I", len(body)) + kind + body + struct.pack(">I", zlib.crc32(kind + body))

    ihdr = struct.pack(">IIBBBBB", width, height, 8, 0, 0, 0, 0)
    idat = zlib.compress(b"\0" * (padding * 50))
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", ihdr) + chunk(b"IDAT", idat) + chunk(b"IEND", b"")


def _saved(img: Image.Image, fmt: str) -> bytes:
    buf = io.BytesIO()
    img.save(buf, format=fmt)
    return buf.getvalue()


# --- the service ------------------------------------------------------------------------------------------------


def test_predictions_equal_onnxruntime_with_the_bundles_preprocessing(engine, finished, exported):
    _, onnx = finished
    model = predict.load_model(onnx.id, engine)
    indices = [0, 5, 13, 42, 100, 333]
    images = [digit_png(i) for i in indices]
    got = predict.predict_many(model, [(f"d{i}.png", io.BytesIO(b)) for i, b in zip(indices, images)])
    right = 0
    for p, image, i in zip(got, images, indices):
        best, probs = reference(exported[1] / "model.onnx", image)
        assert p.error is None and p.top[0][0] == best
        assert len(p.top) == 5 and [q for _, q in p.top] == sorted((q for _, q in p.top), reverse=True)
        np.testing.assert_allclose([q for _, q in p.top], np.sort(probs)[::-1][:5], rtol=1e-5, atol=1e-7)
        assert p.seen.shape == (8, 8) and p.seen.dtype == np.uint8 and p.latency_ms >= 0
        right += best == str(_label(i))
    assert right >= 4, "the tiny digits model should classify most of these digits"


def _label(index: int) -> int:
    from sklearn.datasets import load_digits

    return int(load_digits().target[index])


def test_the_page_uses_only_a_finished_runs_verified_export(engine, finished, exported, home):
    r, onnx = finished
    assert predict.verified_onnx(r.status, repo.list_artifacts(engine, r.id)) == (onnx, None)
    running = seed_run(engine, "running", spec=DIGITS_8, status="running")
    assert predict.verified_onnx(running.status, [onnx])[1].startswith("The run is running")
    bare = seed_run(engine, "bare", spec=DIGITS_8)
    assert predict.verified_onnx(bare.status, [])[1] == "This run has no ONNX export yet."
    report, out = exported
    failed = register(
        engine, bare.id, artifact_root(), {"formats": {"onnx": {**report["formats"]["onnx"], "ok": False}}}, out
    )
    assert "not verified" in predict.verified_onnx(bare.status, [failed])[1]
    (artifact_root() / bare.id / "export" / "model.onnx").unlink()
    gone = register(engine, bare.id, artifact_root(), report, out)
    (artifact_root() / bare.id / "export" / "model.onnx").unlink()
    assert "removed from the artifact store" in predict.verified_onnx(bare.status, [failed, gone])[1]


def test_bad_files_are_refused_each_with_why(engine, finished):
    _, onnx = finished
    model = predict.load_model(onnx.id, engine)
    png = digit_png(3)
    files = [
        ("notes.txt", io.BytesIO(b"not an image at all")),
        ("huge.png", io.BytesIO(png + b"\0" * predict.MAX_FILE_BYTES)),
        ("cut.png", io.BytesIO(png[: len(png) // 2])),
        *[(f"ok{i}.png", io.BytesIO(png)) for i in range(predict.MAX_FILES - 3)],
        ("one-too-many.png", io.BytesIO(png)),
    ]
    got = {p.name: p for p in predict.predict_many(model, files)}
    assert got["notes.txt"].error.startswith("not an image this dashboard can read")
    assert got["huge.png"].error == "refused: 20.0 MB, more than the 20 MB accepted"
    assert got["cut.png"].error.startswith("cannot be decoded")
    assert got["one-too-many.png"].error == f"not read: at most {predict.MAX_FILES} images per request"
    assert all(got[f"ok{i}.png"].error is None for i in range(predict.MAX_FILES - 3))
    assert all(p.top == [] and p.seen is None for p in got.values() if p.error)


@pytest.mark.parametrize(
    ("width", "height", "says"),
    [(100_000, 100_000, "10,000,000,000 pixels"), (9_000, 9_000, "9000×9000 pixels")],  # beyond PIL's, beyond ours
)
def test_an_image_bomb_is_refused_from_its_header(engine, finished, width, height, says):
    _, onnx = finished
    model = predict.load_model(onnx.id, engine)
    bomb = Counting(_png_claiming(width, height, padding=1 << 20))
    assert len(bomb.getvalue()) > 4000 and width * height > MAX_IMAGE_PIXELS
    p = predict.predict(model, "bomb.png", bomb)
    assert p.error == f"refused: {says}, more than the 64 MP accepted"
    assert bomb.bytes_read < 4096, "refused from the header: the compressed pixels are never read"


@pytest.mark.parametrize("channels", [1, 3])
@pytest.mark.parametrize(
    ("mode", "fmt"), [("RGBA", "PNG"), ("LA", "PNG"), ("P", "PNG"), ("CMYK", "TIFF"), ("I;16", "PNG"), ("F", "TIFF")]
)
def test_unusual_modes_are_converted_as_training_decodes_them(mode, fmt, channels):
    rng = np.random.default_rng(0)
    rgba = Image.fromarray(rng.integers(0, 256, (20, 30, 4), dtype=np.uint8), mode="RGBA")
    if mode == "I;16":
        img = Image.fromarray(rng.integers(0, 65536, (20, 30), dtype=np.uint16))
    elif mode == "F":
        img = Image.fromarray(rng.random((20, 30), dtype=np.float32))
    else:
        img = rgba if mode == "RGBA" else rgba.convert(mode)
    data = _saved(img, fmt)
    with Image.open(io.BytesIO(data)) as opened:
        assert opened.mode.startswith("I;16" if mode == "I;16" else mode)
        meta = {
            "channels": channels,
            "image_size": 12,
            "resize": 14,
            "mean": [0.5] * channels,
            "std": [0.25] * channels,
        }
        seen, x = export_predict.seen_and_input(opened, meta)
    trained = decode(data, "L" if channels == 1 else "RGB", 14)  # the training's own decode, then its centre crop
    want = trained[:, 1:13, 1:13]
    np.testing.assert_array_equal(
        seen if channels == 1 else seen.transpose(2, 0, 1), want[0] if channels == 1 else want
    )
    assert x.shape == (1, channels, 12, 12)


# --- the tab ---------------------------------------------------------------------------------------------------


def _predict_tab(at):
    at.session_state["run.tab"] = "Predict"
    return at.run()


def test_predict_tab_classifies_digits_from_the_dataset_as_onnxruntime_does(page, engine, finished, exported):
    r, _ = finished
    at = _predict_tab(page("run.py", id=r.id))
    assert not at.exception and "nothing is stored" in " ".join(c.value for c in at.caption)
    at.button(key=f"run.predict.take.{r.id}").click().run()
    assert not at.exception
    lines = [m.value for m in at.markdown if " → **" in m.value]
    assert len(lines) == 6
    for line in lines:
        index = int(line.split("#", 1)[1].split(" ", 1)[0])
        shown = line.split("→ **", 1)[1].split("**", 1)[0]
        assert shown == reference(exported[1] / "model.onnx", digit_png(index))[0]
        assert "ms" in line and "true class" in line
    bars = [b.proto.text for b in at.get("progress") if b.proto.text.endswith("%")]  # not the run's own progress
    assert len(bars) == 6 * 5 and all(re.fullmatch(r"\d · \d+\.\d%", t) for t in bars), bars


def test_predict_tab_without_an_export_says_so_and_points_to_export_now(page, engine):
    r = seed_run(engine, "no export", spec=DIGITS_8, epochs=1)
    at = _predict_tab(page("run.py", id=r.id))
    assert not at.exception
    assert any(i.value == "This run has no ONNX export yet." for i in at.info)
    assert any("Export now" in c.value for c in at.caption)
    running = seed_run(engine, "running", spec=DIGITS_8, status="running")
    at = _predict_tab(page("run.py", id=running.id))
    assert any(i.value.startswith("The run is running") for i in at.info)


def test_images_are_taken_from_an_image_folder_or_zip_with_their_classes(tmp_path):
    """The Predict tab's "Take images from the dataset" on an image folder: a class at random, then one of its
    images; a split layout's test/ first; a zip (wrapped in a folder, with macOS's litter) too."""
    import zipfile

    def write(root: Path, colours: dict[str, tuple[int, int, int]], n: int = 3) -> None:
        for label, colour in colours.items():
            (root / label).mkdir(parents=True, exist_ok=True)
            for i in range(n):
                Image.new("RGB", (10 + i, 8), colour).save(root / label / f"{i}.png")

    flat = tmp_path / "flat"
    write(flat, {"red": (220, 0, 0), "blue": (0, 0, 220)})
    got = predict.folder_samples(str(flat), 6, seed=0)
    assert len(got) == 6 and {label for _, _, label in got} == {"red", "blue"}
    for name, data, label in got:  # each image is the file of its class that it names
        assert name.startswith(f"{label}/") and data == (flat / name).read_bytes()
    assert predict.folder_samples(str(flat), 6, seed=0) == got  # the same click, the same images
    split = tmp_path / "split"
    write(split / "train", {"red": (220, 0, 0), "blue": (0, 0, 220)})
    write(split / "test", {"red": (200, 0, 0), "blue": (0, 0, 200)}, n=1)
    assert {data for _, data, _ in predict.folder_samples(str(split), 4, seed=1)} <= {
        (split / "test" / c / "0.png").read_bytes() for c in ("red", "blue")
    }
    archive = tmp_path / "pets.zip"
    with zipfile.ZipFile(archive, "w") as zf:
        for f in sorted(flat.rglob("*.png")):
            zf.write(f, f"pets/{f.relative_to(flat).as_posix()}")
        zf.writestr("__MACOSX/pets/red/._0.png", b"not an image")
    zipped = predict.folder_samples(str(archive), 4, seed=2)
    assert len(zipped) == 4 and all(n.startswith(f"pets/{label}/") for n, _, label in zipped)
    with pytest.raises(ValueError, match="no class folders"):
        predict.folder_samples(str(flat / "red"), 2, seed=0)
