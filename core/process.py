"""Process helpers shared by the process starter (app/cli/processes.py) and the workers: torch-free, importing
nothing of ours."""

from __future__ import annotations

import ctypes
import signal

_PR_SET_PDEATHSIG = 1


def die_with_parent(sig: int = signal.SIGKILL) -> None:
    """Linux: have the kernel send `sig` to this process when its parent dies (even by SIGKILL), so a
    child never goes on unseen after the process that supervised it is gone. Elsewhere: nothing."""
    try:
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(_PR_SET_PDEATHSIG, sig)
    except (OSError, AttributeError):
        return
