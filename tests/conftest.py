"""Shared test settings: tests run offline, single-threaded per process, on the CPU."""

from __future__ import annotations

import os

# Keep the 2-core CI machine responsive and results repeatable across processes.
os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("MKL_NUM_THREADS", "1")
# Never reach a model/data hub from tests.
os.environ.setdefault("HF_HUB_OFFLINE", "1")
