"""Which GPUs a worker's GPU metrics describe: CUDA_VISIBLE_DEVICES read as CUDA reads it (indices, GPU-/MIG- UUIDs,
a unique UUID prefix, the first entry CUDA cannot use ends the list) and mapped to NVML handles, in CUDA's order.
A fake NVML stands in for the driver: no GPU needed."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from core.names import gpu_key
from worker import child
from worker.child import nvml_handles, visible_devices

UUIDS = ["GPU-8932f937-d72c-4106-c12f-20bd9faed9f6", "GPU-1f0a2b3c-0000-4106-c12f-20bd9faed9f6"]
MIG = "MIG-4e1d2c3b-aaaa-5f6e-9d8c-7b6a5f4e3d2c"


class FakeNvml:
    """Two GPUs by NVML index (PCI bus order) and one MIG slice of GPU 0, found by UUID only (as NVML does)."""

    NVML_TEMPERATURE_GPU = 0

    def __init__(self, as_bytes: bool = False) -> None:
        self.as_bytes = as_bytes

    def nvmlInit(self) -> None:
        pass

    def nvmlDeviceGetCount(self) -> int:
        return len(UUIDS)

    def nvmlDeviceGetHandleByIndex(self, i: int) -> str:
        if not 0 <= i < len(UUIDS):
            raise RuntimeError("NVML_ERROR_INVALID_ARGUMENT")
        return f"gpu{i}"

    def nvmlDeviceGetHandleByUUID(self, uuid: str) -> str:
        if uuid == MIG:
            return "mig0"
        if uuid not in UUIDS:
            raise RuntimeError("NVML_ERROR_NOT_FOUND")
        return f"gpu{UUIDS.index(uuid)}"

    def nvmlDeviceGetUUID(self, h: str) -> str | bytes:
        u = UUIDS[int(h.removeprefix("gpu"))]
        return u.encode() if self.as_bytes else u

    def nvmlDeviceGetUtilizationRates(self, h: str):
        if h == "mig0":
            raise RuntimeError("NVML_ERROR_NOT_SUPPORTED")  # a MIG slice has no utilisation of its own
        return type("Util", (), {"gpu": 10 + int(h[-1])})()

    def nvmlDeviceGetMemoryInfo(self, h: str):
        return type("Mem", (), {"used": (1 + int(h[-1])) * 2**30})()

    def nvmlDeviceGetTemperature(self, h: str, sensor: int) -> int:
        if h == "mig0":
            raise RuntimeError("NVML_ERROR_NOT_SUPPORTED")
        return 40 + int(h[-1])


@pytest.mark.parametrize(
    "value, entries",
    [
        (None, None),  # unset: every GPU
        ("", []),  # set and empty: none (a CPU worker on a GPU host)
        ("1,0", [1, 0]),
        (" 1 , 0 ", [1, 0]),
        (f"{UUIDS[1]},0", [UUIDS[1], 0]),  # the isdigit filter used to drop the UUID
        (MIG, [MIG]),
        ("0,-1,1", [0]),  # CUDA ignores everything from the first entry it cannot read
        ("-1", []),
        ("GPU-8932f937", ["GPU-8932f937"]),
    ],
)
def test_visible_devices_reads_cuda_visible_devices_as_cuda_does(value, entries):
    assert visible_devices(value) == entries


@pytest.mark.parametrize(
    "value, handles",
    [
        (None, ["gpu0", "gpu1"]),
        ("", []),
        ("1", ["gpu1"]),
        ("1,0", ["gpu1", "gpu0"]),  # CUDA's order: its device 0 is NVML's GPU 1
        (f"{UUIDS[1]},{UUIDS[0]}", ["gpu1", "gpu0"]),
        ("GPU-1f0a", ["gpu1"]),  # a unique prefix, as CUDA takes it
        ("GPU-,0", []),  # a prefix of both GPUs names none: CUDA stops there
        (MIG, ["mig0"]),
        ("0,7,1", ["gpu0"]),  # no GPU 7: CUDA stops there too
        ("GPU-ffffffff,0", []),
    ],
)
@pytest.mark.parametrize("as_bytes", [False, True])
def test_nvml_handles_map_cuda_devices_to_nvml_handles(value, handles, as_bytes):
    assert nvml_handles(FakeNvml(as_bytes), value) == handles


def test_gpu_metrics_of_uuid_entries_are_numbered_in_cudas_order_and_skip_what_a_mig_slice_lacks(monkeypatch):
    monkeypatch.setitem(sys.modules, "pynvml", FakeNvml())
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", f"{UUIDS[1]},{MIG}")
    assert child.gpu_metrics() == {
        gpu_key(0, "util"): 11.0,
        gpu_key(0, "mem_mb"): 2048.0,
        gpu_key(0, "temp_c"): 41.0,
        gpu_key(1, "mem_mb"): 1024.0,
    }
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    assert child.gpu_metrics() == {}


def test_a_worker_process_numbers_cuda_devices_by_pci_bus_as_nvml_does():
    env = {k: v for k, v in os.environ.items() if k != "CUDA_DEVICE_ORDER"}
    code = "import os, worker.tasks; print(os.environ['CUDA_DEVICE_ORDER'])"
    r = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "PCI_BUS_ID"
