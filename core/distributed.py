"""What one process of a run does differently when the run spans several (DistributedDataParallel).

A run with `resources.gpus = N > 1` has N ranks: rank 0 is the process that called `run_training`
(it keeps the real sink and control and writes every file), ranks 1..N-1 are started by core.ranks.
The loop talks to its place in the run through a `Ranks` object: `SOLO` for a single process, where
every method hands its input back untouched (so a one-process run computes exactly what it always
did), or a `Group` joined to a process group, where the same calls reduce sums and counts across
ranks, broadcast rank 0's decisions and wrap the model in DDP.
"""

from __future__ import annotations

import contextlib
import datetime
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel

from core.checkpoint import rng_state


class RankLost(RuntimeError):
    """A rank other than 0 died (killed, out of host memory, its machine's GPU gone) or stopped answering.
    Raised out of `run_training` instead of a summary: the run is not failed, it lost a process, and the
    caller resumes it from its last checkpoint. The remaining ranks are already terminated when it is raised.
    `rank` is the lost rank when known (else None); `exitcode` its exit status when it exited."""

    def __init__(self, message: str, rank: int | None = None, exitcode: int | None = None):
        super().__init__(message)
        self.rank, self.exitcode = rank, exitcode


class PeerFailed(RuntimeError):
    """A rank other than 0 raised an error of its own (not a lost peer): the run fails with it, as any
    failure. `peer_traceback` is that rank's traceback."""

    def __init__(self, message: str, rank: int, peer_traceback: str):
        super().__init__(message)
        self.rank, self.peer_traceback = rank, peer_traceback


# Markers of a collective that failed because a peer went away (gloo and NCCL raise plain RuntimeErrors).
_PEER_MARKERS = (
    "Connection closed by peer",
    "Connection reset by peer",
    "Broken pipe",
    "Timed out",
    "timed out",
    "gloo",
    "NCCL",
    "ProcessGroup",
)


def is_peer_error(e: BaseException) -> bool:
    """True for an error raised by a collective whose peer died or hung, not by the training itself."""
    return isinstance(e, dist.DistError) or (isinstance(e, RuntimeError) and any(m in str(e) for m in _PEER_MARKERS))


class Ranks:
    """A single process (SOLO): nothing to reduce, broadcast or wrap."""

    rank, world, is_main, backend = 0, 1, True, None

    def sum_(self, *values: Any) -> list[Any]:
        return list(values)

    def agree(self, status: str | None) -> str | None:
        return status

    def sync(self, final: bool) -> contextlib.AbstractContextManager:
        return contextlib.nullcontext()

    def wrap(self, model: nn.Module, forward: nn.Module) -> nn.Module:
        return forward

    def eval_forward(self, forward: nn.Module, model: nn.Module) -> nn.Module:
        return forward

    def merge_mistakes(self, mistakes: Any) -> None:
        return None

    def rng_extra(self) -> dict[str, Any]:
        return {}

    def own_rng(self, ck: dict[str, Any]) -> dict[str, Any]:
        return ck["rng"]


SOLO = Ranks()


class Group(Ranks):
    """This process's rank in an initialised default process group. Control flags and Python objects
    travel on a gloo group even when the tensors use NCCL, so deciding whether to stop never waits on the GPU."""

    def __init__(self, rank: int, world: int, device: torch.device, backend: str, compile_model: bool = False):
        self.rank, self.world, self.device, self.backend = rank, world, device, backend
        self.is_main = rank == 0
        self.compile = compile_model
        self.cpu_group = dist.new_group(backend="gloo") if backend != "gloo" else None
        self.ddp: DistributedDataParallel | None = None
        self._forward: nn.Module | None = None
        self._trainable: tuple[bool, ...] | None = None

    # --- reductions ---------------------------------------------------------------------------
    def sum_(self, *values: Any) -> list[Any]:
        """The sum over ranks of each value (tensors of any shape and dtype, or Python numbers), in one
        all_reduce of float64 (exact for counts below 2**53); every rank gets the same numbers back."""
        parts = [torch.as_tensor(v, device=self.device).reshape(-1).to(torch.float64) for v in values]
        flat = torch.cat(parts)
        dist.all_reduce(flat)
        out, i = [], 0
        for v, p in zip(values, parts, strict=True):
            chunk, i = flat[i : i + p.numel()], i + p.numel()
            out.append(chunk.view(v.shape).to(v.dtype) if isinstance(v, torch.Tensor) else type(v)(chunk.item()))
        return out

    def broadcast_object(self, value: Any) -> Any:
        """Rank 0's `value` on every rank."""
        box = [value if self.is_main else None]
        dist.broadcast_object_list(box, src=0, group=self.cpu_group, device=torch.device("cpu"))
        return box[0]

    def agree(self, status: str | None) -> str | None:
        """Rank 0's verdict (early stopping, pruning, cancel) for every rank: all of them stop at the same place."""
        return self.broadcast_object(status)

    # --- the model ----------------------------------------------------------------------------
    def wrap(self, model: nn.Module, forward: nn.Module) -> nn.Module:
        """DDP around `model`, built again when the set of trained parameters changes (progressive
        unfreezing): DDP only reduces the gradients of parameters that required them when it was built."""
        trainable = tuple(p.requires_grad for p in model.parameters())
        if trainable != self._trainable:
            self._trainable = trainable
            ids = [self.device.index] if self.device.type == "cuda" else None
            self.ddp = DistributedDataParallel(model, device_ids=ids, output_device=ids and ids[0])
            self._forward = torch.compile(self.ddp) if self.compile else self.ddp
        return self._forward

    def sync(self, final: bool) -> contextlib.AbstractContextManager:
        """Accumulation: gradients are all-reduced only on the micro-step that ends an optimizer step."""
        return contextlib.nullcontext() if final or self.ddp is None else self.ddp.no_sync()

    def eval_forward(self, forward: nn.Module, model: nn.Module) -> nn.Module:
        """Validation runs the plain module: ranks may hold different numbers of validation batches,
        and DDP's forward could start collectives that the other ranks never join."""
        return model

    # --- what validation and checkpoints gather ---------------------------------------------------
    def merge_mistakes(self, mistakes: Any) -> None:
        """Keep the k most confident mistakes over the whole validation split. A rank's validation shard is
        positions rank, rank + world, …, so its local position j is split index rank + world·j."""
        k = mistakes.k
        packed = torch.full((3, k), -2.0, dtype=torch.float64, device=self.device)
        m = len(mistakes.conf)
        packed[0, :m] = mistakes.conf.double()
        packed[1, :m] = (mistakes.index * self.world + self.rank).double()
        packed[2, :m] = mistakes.pred.double()
        parts = [torch.empty_like(packed) for _ in range(self.world)]
        dist.all_gather(parts, packed)
        every = torch.cat(parts, 1)
        keep = every[0].topk(min(k, every.shape[1])).indices
        mistakes.conf = every[0, keep].float()
        mistakes.index, mistakes.pred = every[1, keep].long(), every[2, keep].long()

    def rng_extra(self) -> dict[str, Any]:
        """Every rank's random state, for rank 0's checkpoint: a resumed rank r continues its own streams."""
        states: list[Any] = [None] * self.world
        dist.all_gather_object(states, rng_state(), group=self.cpu_group)
        return {"rank_rng": states[1:]} if self.is_main else {}

    def own_rng(self, ck: dict[str, Any]) -> dict[str, Any]:
        extra = ck.get("rank_rng") or []
        return extra[self.rank - 1] if 0 < self.rank <= len(extra) else ck["rng"]


class CollectiveControl:
    """The run's control as every rank sees it: rank 0 asks the real one (cancel, the sweep's pruner) and
    broadcasts the answer, so all ranks stop after the same optimizer step. Every rank calls it at the
    same points of the loop; the other ranks hold no control of their own."""

    def __init__(self, ranks: Group, inner: Any = None):
        self.ranks, self.inner = ranks, inner

    def should_stop(self) -> bool:
        flag = torch.zeros(1, dtype=torch.uint8)
        if self.ranks.is_main:
            flag[0] = bool(self.inner is not None and self.inner.should_stop())
        dist.broadcast(flag, src=0, group=self.ranks.cpu_group)
        return bool(flag.item())

    def judge_epoch(self, epoch: int) -> str | None:
        reason = None
        if self.ranks.is_main:
            judge = getattr(self.inner, "judge_epoch", None)
            reason = judge(epoch) if judge is not None else None
        return self.ranks.broadcast_object(reason)


def join(
    rank: int, world: int, store: dist.Store, backend: str, device: torch.device, timeout_s: float, compile_model: bool
) -> Group:
    """Join the run's process group (blocks until all ranks have joined, at most `timeout_s`)."""
    if device.type == "cuda":
        torch.cuda.set_device(device)
    dist.init_process_group(
        backend, store=store, rank=rank, world_size=world, timeout=datetime.timedelta(seconds=timeout_s)
    )
    return Group(rank, world, device, backend, compile_model)


def abort() -> None:
    """Abort the NCCL communicators, which fails a collective that waits on a dead peer at once (NCCL itself would
    wait for the timeout). Experimental in torch and NCCL-only; a failure to abort leaves the timeout as the bound."""
    try:
        dist.distributed_c10d._abort_process_group()
    except Exception:  # noqa: BLE001 - best effort: the collective timeout still ends the wait
        return


def leave() -> None:
    """Destroy this process's default group (a no-op when there is none, or when it was aborted)."""
    if dist.is_available() and dist.is_initialized():
        try:
            dist.destroy_process_group()
        except (RuntimeError, ValueError):  # already aborted after a lost peer
            return
