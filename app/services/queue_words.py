"""What a waiting run is told about its queue: who would take it, or that nobody would and what to start.

A run of N > 1 GPUs waits in gpu-xN, which only a worker owning at least N GPUs of one host consumes
(`torchdeck worker --gpus 0,1,...,N-1 --multi-gpu`). Such a run is stored and queued like any other even when
no worker offers that many GPUs, so the words name the gap (how many it needs, the most any live worker offers)
and the command that closes it, instead of leaving the run to wait in silence."""

from __future__ import annotations

from core.names import CPU_QUEUE, GPU_QUEUE, JOBS_QUEUE, queue_gpus

FIXES = {
    GPU_QUEUE: "start a worker on a GPU host (`torchdeck worker --gpus 0`, team mode `docker compose up -d worker-gpu`), "
    "or set device: cpu to run it on a CPU worker",
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
