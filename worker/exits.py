"""How a run's process ended, in words a person can act on, and what that means for the run."""

from __future__ import annotations

import signal

from sqlalchemy import Engine

from core.names import run_gpus
from db.repo import get_run


def describe_exit(code: int | None) -> str:
    """Turn a child's exit code into a reason a person can act on."""
    if code is None:
        return "the run process did not exit"
    if code < 0:
        sig = signal.Signals(-code).name if -code in signal.Signals._value2member_map_ else str(-code)
        if -code == signal.SIGKILL:
            return "killed by SIGKILL — out of memory? (the kernel's OOM killer sends SIGKILL; lower train.batch_size)"
        return f"the run process was terminated by {sig}"
    return f"the run process exited with code {code} before recording a result"


def run_processes(engine: Engine, run_id: str) -> int:
    """The run's process count (resources.gpus): a run of several whose rank 0 was SIGKILLed lost a rank, and
    is resumed like one whose other rank died (its attempts bounded), instead of failing as out of memory."""
    try:
        return run_gpus(get_run(engine, run_id).spec)
    except Exception:  # noqa: BLE001 - unreadable now: treated as a one-process run (its end recorded as failed)
        return 1
