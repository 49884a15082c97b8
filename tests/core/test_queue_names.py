"""Which queue a run waits in: CPU runs in `cpu` whatever their process count, single-GPU runs in `gpu`, runs of
N > 1 GPUs in `gpu-xN`, which only a worker owning at least N GPUs consumes; and what a worker's queues offer."""

from __future__ import annotations

import pytest

from core.config import RunSpec
from core.names import (
    CPU_QUEUE,
    GPU_QUEUE,
    MAX_RUN_GPUS,
    RUN_QUEUES,
    gpus_offered,
    is_run_queue,
    multi_gpu_queue,
    multi_gpu_queues,
    queue_for,
    queue_gpus,
    queue_of,
    run_gpus,
)


def test_queue_for_keeps_its_old_calls_and_adds_the_gpu_count():
    assert (queue_for("cpu"), queue_for("auto"), queue_for("cuda"), queue_for(None)) == ("cpu", "gpu", "gpu", "gpu")
    assert queue_for("cuda", 1) == "gpu" and queue_for("auto", 2) == "gpu-x2" and queue_for("cuda", 16) == "gpu-x16"
    assert queue_for("cpu", 8) == "cpu"  # any CPU worker starts the N gloo processes itself


def test_queue_of_reads_a_stored_spec_dict_including_ones_from_before_resources_existed():
    assert queue_of({"device": "cuda", "resources": {"gpus": 4}}) == "gpu-x4"
    assert queue_of({"device": "cpu", "resources": {"gpus": 4}}) == "cpu"
    assert queue_of({"device": "auto"}) == "gpu" and queue_of({}) == "gpu" and queue_of(None) == "gpu"
    assert queue_of({"resources": None}) == "gpu" and queue_of({"resources": {"gpus": "x"}}) == "gpu"
    assert run_gpus({"resources": {"gpus": 3}}) == 3 and run_gpus({}) == 1
    spec = RunSpec.model_validate({"device": "cuda", "resources": {"gpus": 2}, "train": {"batch_size": 64}})
    assert queue_of(spec.model_dump(mode="json")) == "gpu-x2"


def test_multi_gpu_queues_are_the_sizes_a_worker_of_n_gpus_can_start():
    assert multi_gpu_queues(4) == ("gpu-x2", "gpu-x3", "gpu-x4")
    assert multi_gpu_queues(1) == () and multi_gpu_queues(0) == ()
    assert len(multi_gpu_queues(MAX_RUN_GPUS)) == MAX_RUN_GPUS - 1
    for bad in (1, 0, MAX_RUN_GPUS + 1):
        with pytest.raises(ValueError, match="2 to 16 GPUs"):
            multi_gpu_queue(bad)


def test_a_queue_name_tells_whether_it_holds_runs_and_how_many_gpus_they_need():
    assert [queue_gpus(q) for q in ("cpu", "gpu", "gpu-x2", "gpu-x16")] == [0, 1, 2, 16]
    for other in ("jobs", "gpu-x1", "gpu-x17", "gpu-x04", "gpu-x", "gpux2", "gpu-x2a"):
        assert queue_gpus(other) is None and not is_run_queue(other), other
    assert all(is_run_queue(q) for q in (*RUN_QUEUES, *multi_gpu_queues(8)))
    assert gpus_offered(["gpu-x2", "gpu-x3", "gpu-x4", "jobs"]) == 4
    assert gpus_offered([GPU_QUEUE, CPU_QUEUE]) == 1 and gpus_offered([CPU_QUEUE, "jobs"]) == 0
    assert gpus_offered([]) == 0
