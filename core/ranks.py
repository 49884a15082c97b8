"""Starting, watching and ending the extra processes of a run on several processes.

The process that calls `run_training` is rank 0. `start_ranks` starts ranks 1..N-1 as fresh
interpreters (the spawn start method: CUDA does not survive a fork) and joins them in a process
group on this host; each then runs the target it is given (core.recipe.train_peer: this module
knows nothing of training, and core.train, which calls it, is never imported back). Those ranks
train on their shards and write nothing: no metrics, no events, no files. Each exits by itself when
rank 0 is gone, so a killed run leaves no orphans. Rank 0 tells a peer's death (RankLost: the run is
resumed) from a peer's own error (the run fails, saying so).
"""

from __future__ import annotations

import datetime
import os
import threading
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from core.config import RunSpec
from core.distributed import CollectiveControl, Group, PeerFailed, RankLost, abort, is_peer_error, join, leave
from core.events import Sink
from core.process import die_with_parent, keep_large_allocations

# A collective waits this long for a peer before it fails (and rank 0 reports the run lost). Long, because
# rank 0 alone does slow things between collectives: checkpoints, the sample grid, a sweep's pruner.
COLLECTIVE_TIMEOUT_S = 600.0
JOIN_TIMEOUT_S = 180.0  # the ranks start (torch's import, the data) and meet within this
EXIT_GRACE_S = 60.0  # after the last epoch, the other ranks leave within this or are terminated
PARENT_POLL_S = 0.5  # how often a rank checks that rank 0 is still alive
# What a rank other than 0 runs once joined: (spec, run folder, its group, resume). A module-level function, so
# that the spawn start method can send it to the new process by its qualified name.
PeerTarget = Callable[[RunSpec, Path, Group, bool], None]


def _localhost_only() -> None:
    """All ranks are on this host: gloo talks over loopback whatever the host name resolves to."""
    os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")


def rank_device(device_type: str, rank: int) -> torch.device:
    return torch.device("cuda", rank) if device_type == "cuda" else torch.device("cpu")


@dataclass
class Launch:
    """Rank 0's handle on the run's other ranks."""

    ranks: Group
    procs: list[Any]
    pipes: list[Any]
    store: Any
    threads_before: int
    closed: bool = field(default=False)

    def control(self, inner: Any) -> CollectiveControl:
        return CollectiveControl(self.ranks, inner)

    def announce(self, sink: Sink, spec: RunSpec) -> None:
        """The run's shape, for the dashboard: "batch 32 per rank × 2 = 64 total"."""
        world, batch = self.ranks.world, spec.train.batch_size
        data = {
            "code": "distributed",
            "world_size": world,
            "backend": self.ranks.backend,
            "per_rank_batch": batch // world,
            "global_batch": batch,
            "accumulate": spec.train.accumulate,
            "lr": spec.optim.lr,
            "device": "cpu" if self.ranks.device.type == "cpu" else f"cuda:0..cuda:{world - 1}",
            "threads_per_rank": torch.get_num_threads(),
        }
        sink.event(
            "distributed",
            "info",
            f"DistributedDataParallel on {world} processes ({self.ranks.backend}): batch "
            f"{batch // world} per rank × {world} = {batch} total, lr {spec.optim.lr:g}",
            data,
        )

    def explain(self, e: BaseException) -> BaseException:
        """What rank 0's exception means for the run: a peer's own error (reported through its pipe) fails the
        run with that error; a lost peer, or a collective that broke or timed out, is RankLost; else `e`."""
        peer = is_peer_error(e)
        dead = self._wait_for_death(5.0 if peer else 0.2)
        for pipe in self.pipes:
            report = _read_report(pipe)
            if report is not None:
                failed_rank, message, tb = report
                return PeerFailed(f"rank {failed_rank} failed: {message}", failed_rank, tb)
        if dead is not None or peer:
            rank = dead + 1 if dead is not None else None
            code = self.procs[dead].exitcode if dead is not None else None
            what = f"rank {rank} exited (exit code {code})" if rank else "a collective failed or timed out"
            return RankLost(f"lost a process of the run: {what}: {e}", rank, code)
        return e

    def _wait_for_death(self, within_s: float) -> int | None:
        """The index of a rank process that has exited, waiting up to `within_s` for one to."""
        deadline = time.monotonic() + within_s
        while True:
            for i, p in enumerate(self.procs):
                if p.exitcode is not None and p.exitcode != 0:
                    return i
            if time.monotonic() >= deadline:
                return None
            time.sleep(0.05)

    def watch_nccl(self) -> None:
        """NCCL does not notice a dead peer by itself (its collective waits for the timeout): on CUDA, rank 0 aborts
        the process group as soon as a rank process exits early, so the pending collective fails now and the
        run is reported lost. gloo fails the collective by itself when the peer's connection closes."""

        def watch() -> None:
            while not self.closed:
                if any(p.exitcode not in (None, 0) for p in self.procs):
                    abort()
                    return
                time.sleep(PARENT_POLL_S)

        threading.Thread(target=watch, name="watch-ranks", daemon=True).start()

    def close(self, finished: bool, sink: Sink | None = None) -> None:
        """End the other ranks: after a run that finished, they leave by themselves (a grace period, then they
        are terminated, and `sink` hears of it); after a failure, they are terminated at once. Idempotent."""
        if self.closed:
            return
        self.closed = True
        deadline = time.monotonic() + (EXIT_GRACE_S if finished else 0.0)
        for p in self.procs:
            p.join(max(0.0, deadline - time.monotonic()))
        stuck = [rank for rank, p in enumerate(self.procs, start=1) if p.is_alive()]
        for p in self.procs:
            if p.is_alive():
                p.kill()
            p.join(10)
        if stuck and finished and sink is not None:
            sink.event(
                "lifecycle",
                "warning",
                f"rank(s) {', '.join(map(str, stuck))} did not exit within "
                f"{EXIT_GRACE_S:.0f} s of the end of the run and were terminated",
                {"code": "ranks_terminated", "ranks": stuck},
            )
        for pipe in self.pipes:
            pipe.close()
        leave()
        torch.set_num_threads(self.threads_before)


def _read_report(pipe: Any) -> tuple[int, str, str] | None:
    """A rank's own error, when it sent one before exiting (a killed rank's pipe just ends)."""
    try:
        return pipe.recv() if pipe.poll() else None
    except (EOFError, OSError):
        return None


def start_ranks(spec: RunSpec, out: Path, device_type: str, resume: bool, target: PeerTarget) -> Launch:
    """Start ranks 1..N-1, each running `target` once joined, and join them as rank 0 (the calling process)."""
    world = spec.resources.gpus
    if device_type == "cuda" and torch.cuda.device_count() < world:
        raise RuntimeError(f"resources.gpus={world} but {torch.cuda.device_count()} CUDA device(s) are visible here")
    _localhost_only()
    backend = "nccl" if device_type == "cuda" else "gloo"
    store = dist.TCPStore(
        "127.0.0.1",
        0,
        world,
        is_master=True,
        wait_for_workers=False,
        timeout=datetime.timedelta(seconds=JOIN_TIMEOUT_S),
    )
    threads = max(1, (os.cpu_count() or 1) // world)
    ctx = mp.get_context("spawn")
    procs, pipes = [], []
    for rank in range(1, world):
        recv, send = ctx.Pipe(duplex=False)
        args = (
            rank,
            world,
            spec.model_dump(mode="json"),
            str(out),
            resume,
            store.port,
            backend,
            os.getpid(),
            threads,
            send,
            target,
        )
        procs.append(ctx.Process(target=rank_main, args=args, name=f"torchdeck-rank{rank}"))
        pipes.append(recv)
        procs[-1].start()
        send.close()
    launch = Launch(ranks=None, procs=procs, pipes=pipes, store=store, threads_before=torch.get_num_threads())  # type: ignore[arg-type]
    torch.set_num_threads(threads)
    try:
        launch.ranks = join(0, world, store, backend, rank_device(device_type, 0), COLLECTIVE_TIMEOUT_S, spec.compile)
    except Exception as e:
        cause = launch.explain(e)
        launch.close(finished=False)
        raise RuntimeError(f"the run's {world} processes could not meet: {cause}") from e
    if backend == "nccl":
        launch.watch_nccl()
    return launch


def _watch_parent(parent: int) -> None:
    """Exit as soon as rank 0 is gone (its pid is no longer this process's parent), whatever this rank is
    blocked in: with no rank 0 there is no run, and nothing of this rank is worth keeping."""

    def watch() -> None:
        while os.getppid() == parent:
            time.sleep(PARENT_POLL_S)
        os._exit(1)

    threading.Thread(target=watch, name="watch-rank0", daemon=True).start()


def rank_main(
    rank: int,
    world: int,
    spec_data: dict,
    out: str,
    resume: bool,
    port: int,
    backend: str,
    parent: int,
    threads: int,
    errors: Any,
    target: PeerTarget,
) -> None:
    """A rank other than 0, in its own fresh process: join, run `target` (train its shards), leave. A collective
    that broke because a peer is gone is not this rank's error: rank 0 reports the run lost."""
    die_with_parent()
    keep_large_allocations()
    _watch_parent(parent)
    _localhost_only()
    torch.set_num_threads(threads)
    code = 0
    try:
        spec = RunSpec.model_validate(spec_data)
        store = dist.TCPStore(
            "127.0.0.1", port, world, is_master=False, timeout=datetime.timedelta(seconds=JOIN_TIMEOUT_S)
        )
        device_type = "cuda" if backend == "nccl" else "cpu"
        ranks = join(rank, world, store, backend, rank_device(device_type, rank), COLLECTIVE_TIMEOUT_S, spec.compile)
        target(spec, Path(out), ranks, resume)
    except Exception as e:  # noqa: BLE001 - reported to rank 0, which ends the run
        from core.engine import Diverged

        if not isinstance(e, Diverged) and not is_peer_error(e):
            errors.send((rank, f"{e.__class__.__name__}: {e}", traceback.format_exc()))
            code = 1
    errors.close()
    leave()
    os._exit(code)  # skip the interpreter's teardown of torch: nothing of this process needs it
