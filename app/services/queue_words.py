"""What a waiting run is told about its queue: who would take it, or that nobody would and what to start.

A run of N > 1 GPUs waits in gpu-xN, which only a worker owning at least N GPUs of one host consumes
(`torchdeck worker --gpus 0,1,...,N-1 --multi-gpu`). Such a run is stored and queued like any other even when
no worker offers that many GPUs, so the words name the gap (how many it needs, the most any live worker offers)
and the command that closes it, instead of leaving the run to wait in silence. Also what a worker takes, from its
queues and devices, in the words the Workers page and `torchdeck doctor` both use."""

from __future__ import annotations

from collections.abc import Sequence

from core.names import CPU_QUEUE, GPU_QUEUE, JOBS_QUEUE, gpus_offered, is_run_queue, queue_gpus

FIXES = {
    GPU_QUEUE: "start a worker on a GPU host (`torchdeck worker --gpus 0`, team mode "
    "`docker compose up -d worker-gpu`), or set device: cpu to run it on a CPU worker",
    CPU_QUEUE: "start one (`torchdeck worker --queues cpu`, team mode `docker compose up -d worker-cpu`)",
    JOBS_QUEUE: "`torchdeck worker` starts a jobs worker beside its run workers (team mode `docker compose up -d "
    "worker-cpu`)",
}


def multi_gpu_command(gpus: int) -> str:
    """The command that starts a worker for runs of `gpus` GPUs on a host that has them."""
    return f"torchdeck worker --gpus {','.join(str(i) for i in range(gpus))} --multi-gpu"


def gap(queue: str, most_gpus: int) -> str:
    """Why nobody takes a run of `queue`, in a table cell: for a multi-GPU queue, how many GPUs it needs and the
    most any live worker offers."""
    need = queue_gpus(queue) or 0
    if need < 2:
        return f"no live worker serves the '{queue}' queue"
    most = f"the most is {most_gpus}" if most_gpus else "none offers a GPU"
    return f"no live worker offers {need} GPUs ({most})"


def fix(queue: str, most_gpus: int) -> str:
    """What to start (or change) so that a run of `queue` is taken."""
    need = queue_gpus(queue) or 0
    if need < 2:
        return FIXES.get(queue, f"start a worker that consumes it (`torchdeck worker --queues {queue}`)")
    lower = (
        f", lower resources.gpus to {most_gpus}"
        if most_gpus >= 2
        else (", set resources.gpus: 1" if most_gpus == 1 else "")
    )
    return (
        f"start one with `{multi_gpu_command(need)}` on a host with {need} GPUs{lower}, or set device: cpu to run "
        f"its {need} processes on a CPU worker"
    )


def unserved(queue: str, most_gpus: int) -> str:
    """The whole sentence for a run that no live worker would take."""
    if (queue_gpus(queue) or 0) < 2:
        return f"{gap(queue, most_gpus)}, so the run waits until one does: {fix(queue, most_gpus)}"
    return f"{gap(queue, most_gpus)}, so the run waits in the '{queue}' queue until one does: {fix(queue, most_gpus)}"


def sees_no_gpu(devices: Sequence[dict]) -> bool:
    """A worker that reported its devices and no GPU among them: whatever it takes runs on its CPU."""
    return bool(devices) and not any(d.get("kind") == "gpu" for d in devices)


def takes(queues: Sequence[str], devices: Sequence[dict]) -> str:
    """What runs a worker takes, from its queues: a multi-GPU worker's GPU count and the run sizes it serves
    ("4 GPUs (runs of 2–4)"), so a run of N GPUs that waits can be matched against it at a glance. A worker that
    sees no GPU (`make up` on a laptop consumes gpu and cpu) runs whatever it takes on its CPU: CPU runs."""
    if sees_no_gpu(devices) and any(map(is_run_queue, queues)):
        gpu_queues = [q for q in queues if queue_gpus(q)]
        if not gpu_queues:
            return "CPU runs"
        whose = f"the {gpu_queues[0]} queue's" if len(gpu_queues) == 1 else f"the {', '.join(gpu_queues)} queues'"
        return f"CPU runs ({whose} too, on its CPU)" if CPU_QUEUE in queues else f"{whose} runs, on its CPU"
    needs = sorted({n for q in queues if (n := queue_gpus(q))})  # GPU counts of its run queues
    most = gpus_offered(queues)
    parts = []
    if most >= 2:
        parts.append(f"{most} GPUs (runs of {needs[0]}–{most})")
    elif most == 1:
        parts.append("1 GPU per run")
    if CPU_QUEUE in queues:
        parts.append("CPU runs")
    return ", ".join(parts) or "no runs (dashboard jobs)"
