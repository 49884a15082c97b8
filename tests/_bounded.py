"""Run a snippet in a fresh Python whose address space is capped, and measure what it allocates.

The snippet is code that would build something huge if a size check were missing (a sweep grid of 10^12
points): in the test process it would take the machine's memory with it. Here the cap turns that into a
MemoryError within ~1 GB, and tracemalloc's peak (deterministic, unlike a timing) says what each case
allocated. The CPU limit only stops a runaway; no test asserts on time.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

PRELUDE = """
import json, resource, sys, tracemalloc

def _vm_bytes():
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) * 1024 for line in f if line.startswith("VmSize:"))

def measure(call):
    # (what call returned or raised, tracemalloc's peak in bytes); a crash is reported, never raised
    tracemalloc.start()
    try:
        result = {"value": call()}
    except MemoryError:
        result = {"crash": "MemoryError"}
    except Exception as e:
        result = {"raised": type(e).__name__, "errors": list(getattr(e, "errors", [])) or [[None, str(e)[:300]]]}
    result["peak"] = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    return result

def cap(extra_bytes, cpu_s):
    resource.setrlimit(resource.RLIMIT_AS, (_vm_bytes() + extra_bytes, resource.RLIM_INFINITY))
    resource.setrlimit(resource.RLIMIT_CPU, (cpu_s, cpu_s + 5))
"""


def run_bounded(body: str, *, extra_bytes: int = 1 << 30, cpu_s: int = 120) -> dict:
    """Run `body` (after its imports, it calls `cap(...)` itself via the placeholder CAP, then prints one JSON
    line: `print(json.dumps(...))`) and return that JSON. Asserts the process ended normally."""
    code = PRELUDE + textwrap.dedent(body).replace("CAP", f"cap({extra_bytes}, {cpu_s})")
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])
