#!/usr/bin/env bash
# `make up`: start torchdeck on its embedded default (a private Redis, SQLite, local workers, the UI).
set -euo pipefail
VENV=${VENV:-.venv}
exec "$VENV/bin/torchdeck" up
