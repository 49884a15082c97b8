"""What a run's process needs before its first step, imported ahead of any run.

Imported once per worker by its fork server (worker.tasks.Spare, start method `forkserver`, the default): every
run process is then forked from a process that already holds torch, torchvision, core and the digits reader, so
it starts in a fraction of a second instead of paying about 4-5 s of CPU for these imports (8-14 s of wall time
on a busy 2-core host, where a sweep's pruned trial can end before a freshly spawned process is ready). With the
`spawn` start method each spare process imports them itself (worker.child.spare_main).

The fork server must never initialise CUDA (a forked process could not use it): these imports only load the
libraries; the device is chosen inside each run's own process (tests/worker/test_spare.py checks that nothing
here calls into torch.cuda). A failing import is left to the run that needs it, where it is recorded on the run:
the fork server itself never dies of it.
"""

from __future__ import annotations

import importlib

HEAVY = ("core.train", "worker.sink", "worker.artifacts", "sklearn.datasets")  # sklearn: the digits reader (~2 s)


def import_heavy() -> list[str]:
    """Import HEAVY (instant for what is already imported); the names that could not be imported."""
    missing = []
    for name in HEAVY:
        try:
            importlib.import_module(name)
        except Exception:  # noqa: BLE001 - the run that needs it imports it again and fails there, recorded
            missing.append(name)
    return missing


import_heavy()  # the point of this module: importing it imports them
