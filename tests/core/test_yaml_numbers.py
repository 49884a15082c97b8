"""Numbers in YAML from users (core/bounded_yaml.py): PyYAML reads YAML 1.1's base-60 integers (`1:0:0:…`) in
quadratic time (1 MB: 18 s of CPU in the dashboard) and hands a 5,000-digit integer to int(), which raises a
ValueError Python's digit limit (4,300) that escaped as a traceback. Now a base-60 number is the string it
looks like (which an integer field refuses), an over-long number is refused naming its field before anything
converts it, a value its explicit tag does not fit is a spec error, and a megabyte-long flat list stops being
composed at the node limit. What users write still reads."""

from __future__ import annotations

import resource
import subprocess
import sys
import tracemalloc
from pathlib import Path

import pytest

from core import bounded_yaml
from core.config import RunSpec, SpecError, apply_overrides

ROOT = Path(__file__).resolve().parents[2]
TORCHDECK = str(Path(sys.executable).parent / "torchdeck")


def _refused(text: str) -> tuple[str, float]:
    """The refusal's message and the peak Python memory (MB) spent reaching it."""
    tracemalloc.start()
    try:
        with pytest.raises(SpecError) as e:
            RunSpec.from_yaml(text)
        peak = tracemalloc.get_traced_memory()[1] / 2**20
    finally:
        tracemalloc.stop()
    return str(e.value), peak


def base60(chars: int) -> str:
    """`1:0:0:…`, a YAML 1.1 base-60 integer: PyYAML converts it in quadratic time (1 MB: ~18 s of CPU)."""
    return "1" + ":0" * ((chars - 1) // 2)


def test_a_base60_seed_is_never_converted_and_is_refused_naming_the_field():
    message, peak_mb = _refused(f"seed: {base60(64_000)}\n")
    assert message.startswith("invalid run spec:\n  seed: ") and "valid integer" in message, message
    assert peak_mb < 50
    # written explicitly as an integer, it is refused as such before anything converts it
    message, _ = _refused(f"train: {{epochs: !!int {base60(61)}}}\n")
    assert "the spec: train.epochs is '1:0:0:0" in message and "a base-60 number, which is not read" in message
    # a base-60-looking name is the string it looks like (YAML 1.2), no longer the number 5400
    assert RunSpec.from_yaml("name: 1:30:00\n").name == "1:30:00"


def test_a_megabyte_of_base60_is_refused_within_bounds_in_a_process_of_its_own(tmp_path):
    """`torchdeck validate` on 1 MB of base 60 under a CPU-time limit of 20 s (it took 18 s, and more under a
    loaded machine: the limit only catches a conversion, never a slow refusal) and 1 GB of address space."""
    spec = tmp_path / "seed.yaml"
    spec.write_text(f"seed: {base60(bounded_yaml.MAX_BYTES - 10)}\n")

    def cap():
        resource.setrlimit(resource.RLIMIT_AS, (1 << 30, 1 << 30))
        resource.setrlimit(resource.RLIMIT_CPU, (20, 20))

    done = subprocess.run(
        [TORCHDECK, "validate", str(spec)], capture_output=True, text=True, timeout=300, preexec_fn=cap, cwd=ROOT
    )
    assert done.returncode == 2, (done.returncode, done.stderr[-2000:])
    assert "seed" in done.stderr and "valid integer" in done.stderr and "Traceback" not in done.stderr


@pytest.mark.parametrize("where", ["seed", "train.epochs", "schedule.milestones[1]", "a key of train"])
def test_an_integer_of_5000_digits_is_refused_naming_its_field_never_a_traceback(where):
    """Python refuses int() of more than 4,300 digits with a ValueError, which escaped as a traceback."""
    big = "7" * 5000
    text = {
        "seed": f"seed: {big}",
        "train.epochs": f"train: {{epochs: {big}}}",
        "schedule.milestones[1]": f"schedule: {{name: multistep, milestones: [3, {big}]}}",
        "a key of train": f"train:\n  ? {big}\n  : 1",
    }[where]
    message, peak_mb = _refused(text + "\n")
    assert (
        f"the spec: {where} is a number of 5,000 characters; at most {bounded_yaml.MAX_NUMBER_CHARS} are read"
        in message
    ), message
    assert peak_mb < 50
    with pytest.raises(SpecError) as e:  # a --set value: the override's field
        apply_overrides({}, [f"seed={big}"])
    assert e.value.errors[0][0] == "seed" and "is a number of 5,000 characters" in str(e.value)


@pytest.mark.parametrize(
    "text",
    [
        "seed: !!int abc",
        "seed: !!float 1x",
        "deterministic: !!bool maybe",
        "name: !!timestamp someday",
        "seed: !!float " + "9" * 200,
    ],
)
def test_a_value_its_tag_does_not_fit_is_a_spec_error_naming_the_field(text):
    message, _ = _refused(text + "\n")
    assert f"the spec: {text.split(':')[0]} is " in message, message


def test_numbers_users_write_still_read():
    spec = RunSpec.from_yaml(
        "seed: 0x10\ntrain: {epochs: 1_000, batch_size: 0o20}\noptim: {lr: 3.0e-4, "
        "weight_decay: .5}\nschedule: {name: multistep, milestones: [+3, 010]}\n"
    )
    assert (spec.seed, spec.train.epochs, spec.train.batch_size) == (16, 1000, 16)
    assert (spec.optim.lr, spec.optim.weight_decay, spec.schedule.milestones) == (3e-4, 0.5, [3, 8])
    assert bounded_yaml.load("x: [-.inf, .NaN, 1.5e+3, -7, 0b101]")["x"][2:] == [1500.0, -7, 5]


def test_a_megabyte_flat_list_is_refused_before_it_is_all_composed():
    message, peak_mb = _refused("tags: [" + "1," * 520_000 + "1]\n")
    assert f"holds more than {bounded_yaml.MAX_NODES:,} values" in message and peak_mb < 50, (message, peak_mb)
