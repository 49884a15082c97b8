"""Bounds on what a user hands torchdeck: YAML that is tiny but expands to billions of values (alias
bombs), nests absurdly deep or is huge; spec fields beyond what any machine can train; runs whose data
cannot fit in this host's memory; images whose few KB declare gigapixels; evaluation events of many
classes. Each is refused (or cut down) before it costs memory, with a message that names what to change,
while what real users write still passes."""

from __future__ import annotations

import json
import resource
import subprocess
import sys
import tracemalloc
from pathlib import Path

import pytest
import yaml

from core import bounded_yaml
from core.config import RunSpec, SpecError, apply_overrides, load_spec

ROOT = Path(__file__).resolve().parents[2]
CONFIGS = sorted((ROOT / "configs").glob("*.yaml"))
TORCHDECK = str(Path(sys.executable).parent / "torchdeck")
LIMIT_MESSAGE = f"expands to more than {bounded_yaml.MAX_NODES:,} values"


# --- YAML -------------------------------------------------------------------------------------------------


def alias_bomb(levels: int) -> str:
    """The "billion laughs" of YAML: level k is nine aliases of level k-1, so 9 levels are ~350 bytes that
    expand to 9**9 = 387 million strings once anything copies or validates the data."""
    names = "abcdefghijklmnop"
    lines = [f'{names[0]}: &{names[0]} ["lol","lol","lol","lol","lol","lol","lol","lol","lol"]']
    for i in range(1, levels):
        lines.append(f"{names[i]}: &{names[i]} [" + ",".join([f"*{names[i - 1]}"] * 9) + "]")
    return "\n".join(lines) + "\n"


def flow_bomb(levels: int) -> str:
    """The same on one line, as a `--set` value or a form field could carry it."""
    parts = ["&a0 [1,1,1,1,1,1,1,1,1]"] + [f"&a{i} [" + ",".join([f"*a{i - 1}"] * 9) + "]" for i in range(1, levels)]
    return "[" + ", ".join(parts) + "]"


def test_the_bombs_are_what_they_claim():
    assert 250 < len(alias_bomb(7).encode()) < 400 and 300 < len(alias_bomb(9).encode()) < 400
    assert len(flow_bomb(9).encode()) < 400
    # yaml itself builds it in no time (aliases share one object): the cost comes when the data is used
    doc = yaml.safe_load(alias_bomb(3))
    assert len(doc["c"]) == 9 and doc["c"][0] is doc["b"]


def _refused(text: str, overrides: list[str] | None = None) -> tuple[str, float]:
    """The refusal's message and the peak Python memory (MB) spent reaching it."""
    tracemalloc.start()
    try:
        with pytest.raises(SpecError) as e:
            RunSpec.from_yaml(text, overrides)
        peak = tracemalloc.get_traced_memory()[1] / 2**20
    finally:
        tracemalloc.stop()
    return str(e.value), peak


def test_a_seven_level_alias_bomb_is_refused_naming_the_limit_without_expanding_it():
    message, peak_mb = _refused(alias_bomb(7))  # 4.8 million strings: ~450 MB and half a minute unbounded
    assert LIMIT_MESSAGE in message and "anchors" in message, message
    assert peak_mb < 50, f"refusing the bomb took {peak_mb:.0f} MB: it was expanded"


def test_a_nine_level_alias_bomb_is_refused_by_torchdeck_validate(tmp_path):
    """387 million strings unbounded: in a process of its own with 2 GB of address space, so that a
    regression fails this test (MemoryError) instead of exhausting the test machine."""
    spec = tmp_path / "bomb.yaml"
    spec.write_text(alias_bomb(9))

    def cap_memory():
        resource.setrlimit(resource.RLIMIT_AS, (2 << 30, 2 << 30))

    done = subprocess.run(
        [TORCHDECK, "validate", str(spec)], capture_output=True, text=True, timeout=300, preexec_fn=cap_memory, cwd=ROOT
    )
    assert done.returncode == 2, done.stderr[-2000:]
    assert LIMIT_MESSAGE in done.stderr and "Traceback" not in done.stderr, done.stderr[-2000:]


@pytest.mark.parametrize("levels", [7, 9])
def test_an_alias_bomb_in_an_override_is_refused_naming_the_field(levels):
    data = {"data": {"name": "digits"}}
    with pytest.raises(SpecError) as e:
        apply_overrides(data, [f"schedule.milestones={flow_bomb(levels)}"])
    assert e.value.errors[0][0] == "schedule.milestones"
    assert LIMIT_MESSAGE in str(e.value)
    message, peak_mb = _refused("train: {epochs: 2}\n", [f"data.augment={flow_bomb(levels)}"])
    assert "data.augment" in message and LIMIT_MESSAGE in message and peak_mb < 50


def test_yaml_aliases_that_do_not_explode_still_work():
    spec = RunSpec.from_yaml("train: {epochs: &n 3}\nschedule: {name: step, step_size: *n}\n")
    assert spec.train.epochs == 3 and spec.schedule.step_size == 3
    # a big but honest document: a few thousand values is nowhere near the limit
    assert len(bounded_yaml.load(yaml.safe_dump({"values": list(range(20_000))}))["values"]) == 20_000


@pytest.mark.parametrize("depth", [100, 5000])
def test_nesting_deeper_than_the_limit_is_refused(depth):
    """5000 levels used to escape as a RecursionError traceback; 100 went on to validation."""
    with pytest.raises(SpecError) as e:  # (not under tracemalloc: it makes the deep recursion 20× slower)
        RunSpec.from_yaml("train: {epochs: 2}\ntags: " + "[" * depth + "]" * depth + "\n")
    assert f"nests deeper than {bounded_yaml.MAX_DEPTH} levels" in str(e.value), str(e.value)


def test_nesting_up_to_the_limit_is_read():
    ok = "[" * (bounded_yaml.MAX_DEPTH - 1) + "]" * (bounded_yaml.MAX_DEPTH - 1)
    assert bounded_yaml.load(ok) is not None
    deep = "[" * (bounded_yaml.MAX_DEPTH + 2) + "]" * (bounded_yaml.MAX_DEPTH + 2)
    with pytest.raises(bounded_yaml.YamlRefused, match="nests deeper"):
        bounded_yaml.load(deep)


def test_a_document_over_a_megabyte_is_refused_before_parsing():
    valid = "train: {epochs: 2}\n"
    big = valid + "# " + "x" * (bounded_yaml.MAX_BYTES + 10) + "\n"  # a valid spec, only too long
    message, _ = _refused(big)
    assert f"at most {bounded_yaml.MAX_BYTES:,} are read" in message
    with pytest.raises(SpecError) as e:
        apply_overrides({}, ["name=" + "x" * (bounded_yaml.MAX_BYTES + 1)])
    assert e.value.errors[0][0] == "name" and f"at most {bounded_yaml.MAX_BYTES:,}" in str(e.value)
    assert RunSpec.from_yaml(valid + "# " + "x" * 50_000 + "\n").train.epochs == 2  # a long comment is fine


def test_syntax_errors_are_still_spec_errors_saying_so():
    message, _ = _refused("train: {epochs: [2\n")
    assert "not valid YAML" in message


@pytest.mark.parametrize("path", CONFIGS, ids=lambda p: p.name)
def test_the_shipped_presets_still_load(path):
    spec = load_spec(path)
    assert RunSpec.from_yaml(spec.to_yaml()) == spec
    assert load_spec(path, ["train.epochs=3", "export.formats=[onnx]"]).train.epochs == 3


# --- field bounds -----------------------------------------------------------------------------------------

SYNTHETIC_470GB = {"name": "synthetic", "num_samples": 597_637, "size": 512, "channels": 3}  # 4.70e11 bytes


def _spec_error(data: dict) -> str:
    with pytest.raises(SpecError) as e:
        RunSpec.from_dict(data)
    return str(e.value)


def test_a_470_gb_synthetic_dataset_is_refused_naming_the_fields():
    assert 597_637 * 512 * 512 * 3 > 470e9
    message = _spec_error({"data": SYNTHETIC_470GB})
    assert "data.num_samples" in message and "data.size" in message, message
    assert "437.7 GB" in message and "at most 4 GB" in message, message


def test_the_synthetic_size_limit_counts_samples_size_and_channels():
    # 1M CIFAR-sized images (3.1 GB) are allowed; at 64 px they are 12.3 GB (refused), 4.1 GB grayscale (allowed)
    assert RunSpec.from_dict({"data": {"name": "synthetic", "num_samples": 1_000_000, "size": 32}}).data.size == 32
    assert "data.num_samples" in _spec_error({"data": {"name": "synthetic", "num_samples": 1_000_000, "size": 64}})
    gray = {"name": "synthetic", "num_samples": 1_000_000, "size": 64, "channels": 1}
    assert RunSpec.from_dict({"data": gray}).data.channels == 1
    # only generated data is held whole in memory: the fields are ignored for other datasets
    assert RunSpec.from_dict({"data": {"name": "digits", "num_samples": 1_000_000, "size": 512}}).data.name == "digits"


LONG_PATH = "/data/" + "x" * 4096

OVER = [  # (the field, a value over its bound)
    ("data.num_samples", 10_000_001),
    ("data.limit", 100_000_001),
    ("data.cache_mb", 262_145),
    ("data.size", 513),
    ("data.image_size", 1025),
    ("data.path", LONG_PATH),
    ("model.weights_file", LONG_PATH),
    ("loader.device_cache_mb", 262_145),
    ("schedule.milestones", list(range(1, 102))),  # 101 milestones
    ("schedule.milestones", [10, 10_001]),
    ("schedule.step_size", 10_001),
    ("schedule.warmup_epochs", 10_001),
    ("schedule.patience", 10_001),
    ("train.epochs", 10_001),
    ("train.batch_size", 65_537),
    ("train.steps_per_epoch", 100_000_001),
    ("train.log_every", 1_000_001),
    ("train.diag_every", 1_000_001),
    ("train.early_stopping.patience", 10_001),
]


def _nested(field: str, value) -> dict:
    data: dict = {}
    node = data
    *sections, last = field.split(".")
    for s in sections:
        node = node.setdefault(s, {})
    node[last] = value
    if field in ("data.num_samples", "data.size"):  # the synthetic set's own fields, small otherwise
        data["data"] = {"name": "synthetic", "size": 4, **data["data"]}
    return data


@pytest.mark.parametrize(("field", "value"), OVER, ids=[f"{f}-{i}" for i, (f, _) in enumerate(OVER)])
def test_each_field_over_its_bound_is_refused_naming_it(field, value):
    with pytest.raises(SpecError) as e:
        RunSpec.from_dict(_nested(field, value))
    fields = [f for f, _ in e.value.errors]
    assert field in fields, e.value
    assert len(str(e.value)) < 1000  # the message names the field, it does not echo a 4 KB value


def test_the_values_real_users_use_pass():
    spec = RunSpec.from_dict(
        {
            "data": {"name": "synthetic", "num_samples": 50_000, "size": 64, "cache_mb": 65_536, "limit": 1_000_000},
            "schedule": {"name": "multistep", "milestones": [30, 60, 90], "warmup_epochs": 5, "patience": 10},
            "train": {
                "epochs": 300,
                "batch_size": 4096,
                "steps_per_epoch": 100_000,
                "log_every": 50,
                "diag_every": 500,
                "early_stopping": {"patience": 20},
            },
            "loader": {"device_cache_mb": 24_000},
            "model": {"weights_file": "/home/ada/" + "weights/" * 30 + "resnet18.safetensors"},
        }
    )
    assert spec.schedule.milestones == [30, 60, 90] and spec.train.batch_size == 4096
    at_bounds = RunSpec.from_dict(
        {
            "data": {"name": "imagefolder", "path": "/d/" + "x" * 4093, "image_size": 1024, "cache_mb": 262_144},
            "schedule": {"name": "multistep", "milestones": list(range(1, 101)), "step_size": 10_000},
            "train": {"epochs": 10_000, "batch_size": 256},
        }
    )
    assert len(at_bounds.data.path) == 4096 and len(at_bounds.schedule.milestones) == 100
    # the largest batch, on images a batch that large fits (65,536 1024-px images would need 11 TiB: refused
    # by the model-size bound, test_a_model_no_machine_can_train_is_refused_naming_the_fields)
    assert RunSpec.from_dict({"train": {"batch_size": 65_536}}).train.batch_size == 65_536


# --- memory pre-check -------------------------------------------------------------------------------------


def test_check_memory_refuses_data_beyond_this_hosts_memory(monkeypatch):
    from core import preflight

    monkeypatch.setattr(preflight, "available_memory_bytes", lambda: 2 << 30)  # a host with 2 GB free
    spec = RunSpec.from_dict({"data": {"name": "synthetic", "num_samples": 1_000_000, "size": 32}})  # 3.1 GB uint8
    with pytest.raises(MemoryError) as e:
        preflight.check_memory(spec)
    message = str(e.value)
    assert "needs about 2.9 GB" in message and "2.0 GB available" in message, message
    assert "data.num_samples" in message and "data.size" in message
    # small enough: passes; a dataset only reading tells the size of (digits, image folders): not guessed
    preflight.check_memory(RunSpec.from_dict({"data": {"name": "synthetic", "num_samples": 10_000, "size": 32}}))
    preflight.check_memory(RunSpec())


def test_check_memory_counts_the_float_copy_the_device_cache_keeps(monkeypatch):
    from core import preflight

    data = {"name": "synthetic", "num_samples": 100_000, "size": 32}  # 307 MB of uint8, 1.2 GB as float32
    cached = RunSpec.from_dict({"data": data, "loader": {"device_cache_mb": 2048}})
    uncached = RunSpec.from_dict({"data": data, "loader": {"device_cache_mb": 0}})
    assert preflight.data_memory_bytes(cached) == 5 * preflight.data_memory_bytes(uncached)
    monkeypatch.setattr(preflight, "available_memory_bytes", lambda: 1 << 30)
    preflight.check_memory(uncached)
    with pytest.raises(MemoryError, match="loader.device_cache_mb"):
        preflight.check_memory(cached)


def test_check_memory_counts_an_image_folders_decoding_processes(monkeypatch, tmp_path):
    from core import preflight

    def spec(workers: int) -> RunSpec:
        data = {"name": "imagefolder", "path": str(tmp_path)}
        return RunSpec.from_dict({"data": data, "loader": {"num_workers": workers}})

    assert preflight.data_memory_bytes(spec(8)) == 4 * preflight.data_memory_bytes(spec(2)) > 0
    monkeypatch.setattr(preflight, "available_memory_bytes", lambda: 2 << 30)  # 2 GB free
    preflight.check_memory(spec(2))
    with pytest.raises(MemoryError, match="loader.num_workers"):
        preflight.check_memory(spec(16))


def test_this_hosts_available_memory_is_read():
    from core.preflight import available_memory_bytes

    have = available_memory_bytes()
    assert have is not None and 64 << 20 < have < 1 << 50


def test_a_run_too_big_for_the_host_fails_at_once_saying_why(tmp_path, monkeypatch):
    from core import data, preflight
    from core.events import MemorySink
    from core.train import run_training

    def generated(*args, **kwargs):
        raise AssertionError("the synthetic set was generated before the memory check refused it")

    monkeypatch.setattr(preflight, "available_memory_bytes", lambda: 1 << 30)
    monkeypatch.setattr(data, "_synthetic", generated)  # torch's allocations are invisible to tracemalloc
    spec = RunSpec.from_dict({"data": {"name": "synthetic", "num_samples": 1_000_000, "size": 32}, "device": "cpu"})
    tracemalloc.start()
    try:
        summary = run_training(spec, tmp_path, MemorySink())
        peak = tracemalloc.get_traced_memory()[1] / 2**20
    finally:
        tracemalloc.stop()
    assert summary["status"] == "failed"
    assert summary["error"].startswith("MemoryError: the dataset needs about 2.9 GB"), summary["error"]
    assert peak < 200, f"{peak:.0f} MB allocated before refusing"  # nothing of the 3 GB was generated


# --- images with a huge declared size in a training folder ----------------------------------------------


@pytest.fixture(scope="module")
def huge_png() -> bytes:
    """A 15000×15000 1-bit PNG: ~30 KB on disk, 225 MP (675 MB as RGB) once decoded."""
    import io

    from PIL import Image

    buf = io.BytesIO()
    Image.new("1", (15000, 15000)).save(buf, format="PNG")
    assert len(buf.getvalue()) < 200_000
    return buf.getvalue()


@pytest.fixture(scope="module")
def big_png() -> bytes:
    """12000×12000 (144 MP): above our limit, below twice PIL's (where PIL only warns and would decode it)."""
    import io

    from PIL import Image

    buf = io.BytesIO()
    Image.new("1", (12000, 12000)).save(buf, format="PNG")
    return buf.getvalue()


def test_decode_refuses_a_big_image_naming_its_size(big_png):
    import warnings

    from core.decode import ImageTooLarge
    from core.decode import decode as _decode

    with warnings.catch_warnings():
        warnings.simplefilter("error")  # nor a DecompressionBombWarning on the way
        with pytest.raises(ImageTooLarge, match="^12000×12000 pixels, more than the 64 MP accepted$"):
            _decode(big_png, "L", 8)


def _image_folder(root: Path, huge: bytes) -> Path:
    from PIL import Image

    for cls, color in (("cat", (220, 20, 20)), ("dog", (20, 20, 220))):
        (root / cls).mkdir(parents=True)
        for i in range(5):
            Image.new("RGB", (8, 8), color).save(root / cls / f"{i}.png")
    (root / "dog" / "huge.png").write_bytes(huge)
    return root


def test_decode_refuses_a_huge_image_by_its_header(huge_png):
    from core.decode import ImageTooLarge
    from core.decode import decode as _decode
    from core.names import MAX_IMAGE_PIXELS

    tracemalloc.start()
    try:
        with pytest.raises(ImageTooLarge) as e:
            _decode(huge_png, "RGB", 8)
        peak = tracemalloc.get_traced_memory()[1] / 2**20
    finally:
        tracemalloc.stop()
    # beyond twice PIL's own limit PIL refuses to open it at all: the count comes from its refusal
    assert str(e.value) == f"225,000,000 pixels, more than the {MAX_IMAGE_PIXELS / 1e6:.0f} MP accepted"
    assert peak < 20


def test_a_huge_image_in_a_training_folder_is_skipped_with_the_reason(tmp_path, huge_png):
    from core.data import load_data
    from core.spec_sections import DataSpec

    root = _image_folder(tmp_path / "pets", huge_png)
    b = load_data(
        DataSpec(name="imagefolder", path=str(root), image_size=8, max_bad_fraction=0.2, val_fraction=0.4), seed=0
    )
    assert b.info.skipped == 1
    assert b.info.skipped_files == ["dog/huge.png (225,000,000 pixels, more than the 64 MP accepted)"]
    assert b.info.num_train + b.info.num_val + b.info.num_test == 10


def test_a_huge_image_over_the_bad_fraction_refuses_the_folder_naming_file_and_limit(tmp_path, huge_png):
    from core.data import DataError, load_data
    from core.spec_sections import DataSpec

    root = _image_folder(tmp_path / "pets", huge_png)
    with pytest.raises(DataError) as e:
        load_data(DataSpec(name="imagefolder", path=str(root), image_size=8, max_bad_fraction=0.0), seed=0)
    assert "dog/huge.png (225,000,000 pixels, more than the 64 MP accepted)" in str(e.value)
    assert "DecompressionBomb" not in str(e.value)


def test_a_run_on_such_a_folder_trains_and_warns_naming_the_image(tmp_path, huge_png):
    from core.events import MemorySink
    from core.train import run_training

    root = _image_folder(tmp_path / "pets", huge_png)
    spec = RunSpec.from_dict(
        {
            "data": {
                "name": "imagefolder",
                "path": str(root),
                "image_size": 8,
                "max_bad_fraction": 0.2,
                "val_fraction": 0.4,
            },
            "model": {"name": "mlp", "hidden": 16},
            "train": {"epochs": 1, "batch_size": 4},
            "export": {"formats": []},
            "device": "cpu",
        }
    )
    sink = MemorySink()
    summary = run_training(spec, tmp_path / "run", sink)
    assert summary["status"] in ("completed", "early_stopped"), summary["error"]
    skipped = [e for e in sink.events if e["data"].get("code") == "skipped_images"]
    assert len(skipped) == 1 and "225,000,000 pixels, more than the 64 MP" in skipped[0]["data"]["files"][0]
    assert not any("DecompressionBomb" in json.dumps(e, default=str) for e in sink.events)


# --- evaluation events of many classes --------------------------------------------------------------------


def test_top_confusions_are_the_largest_off_diagonal_cells():
    import torch

    from core.insight import top_confusions

    cm = torch.tensor([[9, 3, 0, 0], [0, 8, 5, 1], [7, 0, 2, 0], [0, 0, 0, 4]])
    names = ["ant", "bee", "cat", "dog"]
    assert top_confusions(cm, names) == [("cat", "ant", 7), ("bee", "cat", 5), ("ant", "bee", 3), ("bee", "dog", 1)]
    assert top_confusions(cm, names, k=2) == [("cat", "ant", 7), ("bee", "cat", 5)]
    assert top_confusions(torch.diag(torch.tensor([3, 4])), ["a", "b"]) == []  # a perfect classifier confuses nothing


def _evaluations(tmp_path: Path, classes: int) -> list[dict]:
    import torch

    from core.events import MemorySink
    from core.train import run_training

    torch.set_num_threads(1)
    spec = RunSpec.from_dict(
        {
            "data": {
                "name": "synthetic",
                "num_classes": classes,
                "num_samples": 10 * classes,
                "size": 4,
                "channels": 1,
            },
            "model": {"name": "mlp", "hidden": 16},
            "train": {"epochs": 1, "batch_size": 64},
            "export": {"formats": []},
            "device": "cpu",
            "seed": 0,
        }
    )
    sink = MemorySink()
    summary = run_training(spec, tmp_path, sink)
    assert summary["status"] in ("completed", "early_stopped"), summary["error"]
    return [e["data"] for e in sink.events if e["kind"] == "evaluation"]


def test_an_evaluation_of_more_than_50_classes_carries_the_top_confusions_not_the_matrix(tmp_path):
    (data,) = _evaluations(tmp_path, 51)
    assert "confusion" not in data
    assert len(data["per_class_acc"]) == 51 and len(data["class_names"]) == 51
    pairs = data["top_confusions"]
    assert 0 < len(pairs) <= 20
    assert all(t in data["class_names"] and p in data["class_names"] and t != p and n > 0 for t, p, n in pairs)
    assert [n for _, _, n in pairs] == sorted((n for _, _, n in pairs), reverse=True)
    assert len(json.dumps(data)) < 8_000


def test_an_evaluation_of_1000_classes_names_the_200_least_accurate_within_the_event_cap(tmp_path):
    from core.names import MAX_EVENT_DATA, bounded

    (data,) = _evaluations(tmp_path, 1000)
    assert len(data["per_class_acc"]) == len(data["class_names"]) == 200
    assert data["per_class_acc"] == sorted(data["per_class_acc"])  # the classes that need attention first
    assert data["classes_shown"] == "the 200 classes with the lowest accuracy, of 1000"
    assert bounded(data) is data and len(json.dumps(data)) < MAX_EVENT_DATA  # stored whole: the Run page shows it


def test_an_evaluation_of_50_classes_keeps_the_whole_matrix(tmp_path):
    (data,) = _evaluations(tmp_path, 50)
    assert "top_confusions" not in data
    cm = data["confusion"]
    assert len(cm) == 50 and all(len(row) == 50 for row in cm)
    assert sum(map(sum, cm)) == 100  # every validation sample counted once (20 % of 500)
