#!/usr/bin/env bash
# `make up`: start torchdeck on its embedded default. Until the dashboard and the worker
# land, this trains the digits preset locally so a new user sees the training core work.
set -euo pipefail
VENV=${VENV:-.venv}
if "$VENV/bin/torchdeck" up --help >/dev/null 2>&1; then
  exec "$VENV/bin/torchdeck" up
fi
echo "torchdeck: the dashboard is not part of this version yet; running a demo training instead"
echo "           (configs/digits_simple_cnn.yaml → runs/demo)."
exec "$VENV/bin/torchdeck" train configs/digits_simple_cnn.yaml --out runs/demo
