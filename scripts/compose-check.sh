#!/usr/bin/env bash
# The team deployment, built and run on this machine: an acceptance check of docker/ and docker-compose.yml
# (not part of `make test`: it builds images of several GB).
#
#   scripts/compose-check.sh [--keep]        # --keep: leave the stack up at the end
#
# 1. a Docker engine (dockerd started when none answers) and a compose command (`docker compose`, else
#    Debian's `docker-compose`);
# 2. the base image: python:3.11-slim-bookworm when it can be pulled, else scripts/debian-base.sh's
#    equivalent made from Debian's archive;
# 3. a wheelhouse of everything the images install (pip on this host: its indexes and caches), served on
#    127.0.0.1 to the image builds (`docker build --network host`): no build reaches an index itself;
# 4. the app and worker images, and Postgres and Redis: postgres:16 and redis:7 when they can be pulled, else
#    docker/postgres.Dockerfile and docker/redis.Dockerfile (Debian's packages);
# 5. the stack (docker-compose.yml, a CPU worker, no GPU worker) on free loopback ports, its own
#    project name and volumes; every health check waited for, the migration's exit checked;
# 6. the digits preset submitted through the dashboard's own service (app.services.runs.submit, in the app
#    container), run by the CPU worker to its end (completed, or stopped early by its own early stopping)
#    with its exports verified (parity), one artifact
#    downloaded through the app container's download route and its SHA-256 compared; `torchdeck doctor` in the
#    app and worker containers;
# 7. everything torn down (containers, network, volumes), the wheel server stopped.
# The dashboard runs in local mode here (team mode needs an OpenID Connect provider): it answers its own
# container only, which is where the check talks to it. Each step prints `step_<name>_s=<seconds>`; the
# images' sizes are printed as `image_<name>_mb=`; the last line is `compose_check=passed` or the failure.
# Exits non-zero on any failure. CHECK_DIR (default .compose-check/) keeps the wheelhouse between runs.
set -euo pipefail
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
cd "$ROOT"
KEEP=0
[ "${1:-}" = "--keep" ] && KEEP=1
WORK="${CHECK_DIR:-$ROOT/.compose-check}"
PROJECT="torchdeck-check"
mkdir -p "$WORK"
PY="$(command -v python3)"
[ -x "$ROOT/.venv/bin/python" ] && PY="$ROOT/.venv/bin/python"
export DOCKER_BUILDKIT=0 # the classic builder: no builder image to pull, `--network host` for the wheel server
SERVER_PID=""
COMPOSE=()
ENV_FILE="$WORK/check.env"

say() { echo "# $*"; }
fail() {
  echo "compose_check=failed: $*"
  exit 1
}
timed() { # timed NAME COMMAND...: runs it, prints step_NAME_s
  local name="$1" t0="$EPOCHREALTIME" rc
  shift
  set +e
  "$@"
  rc=$?
  set -e
  awk -v n="$name" -v a="$t0" -v b="$EPOCHREALTIME" 'BEGIN { printf "step_%s_s=%.1f\n", n, b - a }'
  [ "$rc" -eq 0 ] || fail "step $name exited $rc"
}
free_port() { "$PY" -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'; }
secret() { "$PY" -c 'import secrets; print(secrets.token_hex(16))'; }

cleanup() {
  local rc=$?
  if [ "$KEEP" -eq 0 ] && [ "${#COMPOSE[@]}" -gt 0 ] && [ -f "$ENV_FILE" ]; then
    "${COMPOSE[@]}" down -v --remove-orphans >/dev/null 2>&1 || true
  fi
  [ -n "$SERVER_PID" ] && kill "$SERVER_PID" 2>/dev/null || true
  exit "$rc"
}
trap cleanup EXIT

engine() {
  if ! docker info >/dev/null 2>&1; then
    command -v dockerd >/dev/null || fail "no Docker engine answers and dockerd is not installed (apt-get install -y docker.io)"
    say "starting dockerd (log: $WORK/dockerd.log)"
    nohup dockerd >"$WORK/dockerd.log" 2>&1 &
    for _ in $(seq 1 120); do
      docker info >/dev/null 2>&1 && break
      sleep 0.5
    done
    docker info >/dev/null 2>&1 || fail "dockerd did not answer within 60 s (see $WORK/dockerd.log)"
  fi
  say "engine $(docker info --format '{{.ServerVersion}}')"
}

compose_command() {
  if docker compose version >/dev/null 2>&1; then
    COMPOSE=(docker compose)
  elif command -v docker-compose >/dev/null; then
    COMPOSE=(docker-compose)
  else
    fail "no compose command (apt-get install -y docker-compose)"
  fi
  COMPOSE+=(-p "$PROJECT" --env-file "$ENV_FILE" -f "$ROOT/docker-compose.yml")
  say "compose: ${COMPOSE[*]:0:2}"
}

pullable() { timeout 120 docker pull -q "$1" >/dev/null 2>&1; }

base_image() {
  BASE="python:3.11-slim-bookworm"
  if pullable "$BASE"; then
    say "base image $BASE (pulled)"
  elif docker image inspect torchdeck/debian-python:bookworm >/dev/null 2>&1; then
    BASE="torchdeck/debian-python:bookworm"
    say "base image $BASE (made earlier from Debian's archive)"
  else
    say "$BASE cannot be pulled: making one from Debian's archive"
    BASE="$("$ROOT/scripts/debian-base.sh")"
  fi
}

wheelhouse() {
  local reqs="$WORK/requirements.txt" version
  "$PY" - "$reqs" <<'PYEOF'
import sys, tomllib
project = tomllib.load(open("pyproject.toml", "rb"))
wanted = project["project"]["dependencies"] + project["project"]["optional-dependencies"]["worker"]
wanted += project["build-system"]["requires"]
open(sys.argv[1], "w").write("\n".join(wanted) + "\n")
PYEOF
  mkdir -p "$WORK/wheels"
  "$PY" -m pip download --quiet --disable-pip-version-check -d "$WORK/wheels" -r "$reqs" 2>&1 |
    grep -v 'is ignored: it is neither a file nor a directory' || true
  # the base's own Python may differ in its micro version (Debian's 3.11.2): what its markers add, as wheels
  version="$(docker run --rm "$BASE" python3 -c 'import platform; print(platform.python_version())')"
  "$PY" -m pip download --quiet --disable-pip-version-check -d "$WORK/wheels" -r "$reqs" \
    --python-version "$version" --only-binary=:all: 2>&1 |
    grep -v 'is ignored: it is neither a file nor a directory' || true
  say "wheelhouse: $(find "$WORK/wheels" -name '*.whl' | wc -l) wheels, $(du -sh "$WORK/wheels" | cut -f1), for Python $version"
  WHEEL_PORT="${CHECK_WHEEL_PORT:-8765}" # the same port each time: the build arguments, and so the layers, are reused
  if ! "$PY" -c "import socket, sys; socket.create_server(('127.0.0.1', int(sys.argv[1]))).close()" "$WHEEL_PORT" 2>/dev/null; then
    WHEEL_PORT="$(free_port)"
  fi
  "$PY" -m http.server --bind 127.0.0.1 --directory "$WORK/wheels" "$WHEEL_PORT" >"$WORK/wheels.log" 2>&1 &
  SERVER_PID=$!
  for _ in $(seq 1 100); do
    curl -fs "http://127.0.0.1:$WHEEL_PORT/" >/dev/null 2>&1 && return 0
    sleep 0.1
  done
  fail "the wheel server did not start (see $WORK/wheels.log)"
}

build() { # build TAG DOCKERFILE CONTEXT
  docker build --network host -q -t "$1" -f "$2" \
    --build-arg BASE_IMAGE="$BASE" --build-arg WHEELS="http://127.0.0.1:$WHEEL_PORT/" "$3" >"$WORK/build-${1%%:*}.log" 2>&1 ||
    { tail -n 30 "$WORK/build-${1%%:*}.log"; return 1; }
}

services_images() {
  PG_IMAGE="postgres:16"
  REDIS_IMAGE="redis:7"
  if ! pullable "$PG_IMAGE"; then
    PG_IMAGE="torchdeck-postgres:15"
    say "postgres:16 cannot be pulled: building $PG_IMAGE from Debian's packages"
    build "$PG_IMAGE" docker/postgres.Dockerfile docker
  fi
  if ! pullable "$REDIS_IMAGE"; then
    REDIS_IMAGE="torchdeck-redis:7"
    say "redis:7 cannot be pulled: building $REDIS_IMAGE from Debian's packages"
    build "$REDIS_IMAGE" docker/redis.Dockerfile docker
  fi
}

sizes() {
  local image
  for image in torchdeck-app:latest torchdeck-worker:latest "$PG_IMAGE" "$REDIS_IMAGE"; do
    printf 'image_%s_mb=%d\n' "$(echo "${image%%:*}" | tr -c 'a-z0-9\n' '_')" \
      "$(($(docker image inspect -f '{{.Size}}' "$image") / 1000000))"
  done
}

write_env() {
  local pg redis
  pg="$(secret)"
  redis="$(secret)"
  cat >"$ENV_FILE" <<ENVEOF
POSTGRES_USER=torchdeck
POSTGRES_PASSWORD=$pg
POSTGRES_DB=torchdeck
TORCHDECK_DATABASE_URL=postgresql+psycopg://torchdeck:$pg@postgres:5432/torchdeck
REDIS_PASSWORD=$redis
TORCHDECK_BROKER_URL=redis://:$redis@redis:6379/0
TORCHDECK_MODE=local
TORCHDECK_BIND=127.0.0.1
TORCHDECK_APP_BIND=127.0.0.1
POSTGRES_PORT=$(free_port)
REDIS_PORT=$(free_port)
TORCHDECK_PORT=$(free_port)
TORCHDECK_CPU_WORKERS=1
TORCHDECK_WORKER_SHM=1gb
TORCHDECK_APP_IMAGE=torchdeck-app:latest
TORCHDECK_WORKER_IMAGE=torchdeck-worker:latest
TORCHDECK_POSTGRES_IMAGE=$PG_IMAGE
TORCHDECK_REDIS_IMAGE=$REDIS_IMAGE
ENVEOF
  chmod 600 "$ENV_FILE"
}

container() { "${COMPOSE[@]}" ps -q "$1" | head -n1; }

healthy() { # every service with a health check healthy, the migration exited 0
  local deadline=$(($(date +%s) + 600)) svc id state pending
  while :; do
    pending=""
    for svc in postgres redis app worker-cpu; do
      id="$(container "$svc")"
      state="$([ -n "$id" ] && docker inspect -f '{{.State.Health.Status}}' "$id" 2>/dev/null || echo missing)"
      [ "$state" = "healthy" ] || pending="$pending $svc:$state"
    done
    id="$(container migrate)"
    if [ -n "$id" ] && [ "$(docker inspect -f '{{.State.Status}}' "$id")" = "exited" ]; then
      [ "$(docker inspect -f '{{.State.ExitCode}}' "$id")" = "0" ] || {
        docker logs "$id" 2>&1 | tail -n 20
        fail "the migration exited $(docker inspect -f '{{.State.ExitCode}}' "$id")"
      }
    else
      pending="$pending migrate:running"
    fi
    [ -z "$pending" ] && return 0
    if [ "$(date +%s)" -gt "$deadline" ]; then
      "${COMPOSE[@]}" ps
      fail "not healthy within 600 s:$pending"
    fi
    sleep 2
  done
}

in_app() { "${COMPOSE[@]}" exec -T app python - "$@"; }

digits_run() {
  in_app <<'PYEOF'
import hashlib, time, urllib.request
from pathlib import Path
from app.services.broker import get_engine
from app.services.runs import submit
from core.config import RunSpec
from core.names import SUCCESS_STATUSES
from db.records import list_artifacts
from db.run_records import get_run

spec = RunSpec.from_yaml(Path("configs/digits_simple_cnn.yaml").read_text(), ["device=cpu"])
run = submit(spec, name="compose-check digits")
print(f"# submitted run {run.id} to the cpu queue", flush=True)
engine, deadline = get_engine(), time.monotonic() + 900
while (rec := get_run(engine, run.id)).status in ("queued", "running", "lost") and time.monotonic() < deadline:
    time.sleep(2)
print(f"run_status={rec.status}")
assert rec.status in SUCCESS_STATUSES, f"the run ended {rec.status}: {rec.error}"
acc = rec.metrics.get("val/acc")
print(f"run_val_acc_max={acc.max_value if acc else None}")
export = rec.summary.get("export") or {}  # format: verified (exported, reloaded, its outputs the model's)
for fmt, ok in export.items():
    print(f"export_{fmt}={'verified' if ok else 'failed'}")
assert export and all(export.values()), f"exports not all verified: {export}"
artifacts = list_artifacts(engine, run.id)
onnx = [a for a in artifacts if a.uri.endswith(".onnx")] or [a for a in artifacts if a.sha256]
art = onnx[0]
with urllib.request.urlopen(f"http://127.0.0.1:8501/_torchdeck/download/{art.id}", timeout=60) as r:
    body = r.read()
got = hashlib.sha256(body).hexdigest()
print(f"download_{art.kind}_bytes={len(body)}")
assert got == art.sha256, f"downloaded {got}, stored {art.sha256}"
print("download_sha256=matches")
PYEOF
}

doctor() {
  "${COMPOSE[@]}" exec -T app torchdeck doctor
  "${COMPOSE[@]}" exec -T worker-cpu torchdeck doctor
}

timed engine engine
compose_command
timed base_image base_image
timed wheelhouse wheelhouse
timed build_app build torchdeck-app:latest docker/app.Dockerfile .
timed build_worker build torchdeck-worker:latest docker/worker.Dockerfile .
timed services_images services_images
sizes
write_env
timed up "${COMPOSE[@]}" up -d --scale worker-gpu=0
timed healthy healthy
timed digits_run digits_run
timed doctor doctor
if [ "$KEEP" -eq 0 ]; then
  timed down "${COMPOSE[@]}" down -v --remove-orphans
fi
echo "compose_check=passed"
