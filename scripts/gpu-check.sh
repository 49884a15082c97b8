#!/usr/bin/env bash
# Check torchdeck on a CUDA host in one call (at most 8 minutes): the core on CUDA (digits, fp16/bf16/fp32,
# compile), throughput against a hand-written loop, photos into the GPU, the whole stack, several GPUs.
# A thin wrapper around benchmarks/bench_gpu.py: it prints name=value lines, writes one JSON report (its path on the
# last line, report=...) and exits non-zero when a check fails. Needs only the repository and `make install`.
#
#   scripts/gpu-check.sh                       # every check, on CUDA (no CUDA device here: an error, exit 2)
#   scripts/gpu-check.sh --only throughput     # one check (repeatable)
#   scripts/gpu-check.sh --report out.json --budget-s 420
#   scripts/gpu-check.sh --dry-run             # the same steps on the CPU, tiny sizes (what the test suite runs)
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-.venv/bin/python}
if [[ ! -x $PY ]]; then
  echo "gpu-check: no $PY here: run \`make install\` first (or set PYTHON)" >&2
  exit 2
fi
exec "$PY" benchmarks/bench_gpu.py --require-cuda "$@"
