"""`torchdeck doctor`'s worker checks, read from the workers' heartbeat rows: each live worker (the Workers page's
rule, app.services.broker.is_alive) with what it takes (in the Workers page's words, queue_words.takes) and the
devices it sees; whether every queue with runs waiting has a live worker; whether one serves the jobs queue.

A worker that consumes a gpu queue but sees no GPU fails in team mode, where the gpu queue is the GPU hosts' (its
container lacks the NVIDIA runtime). In local mode it is the worker `make up` starts on a machine without a GPU,
which runs the gpu queue's runs on its CPU, as the Workers page says: a note, not a failure."""

from __future__ import annotations

from datetime import UTC, datetime

from app.cli.check import Check, first_line
from app.services import queue_words
from core.names import JOBS_QUEUE, MULTI_GPU_PREFIX, gpus_offered, queue_of

START_FIX = (
    "start one: team mode `docker compose up -d worker-gpu worker-cpu` (or on a GPU host "
    "`torchdeck worker --gpus 0`); a CPU machine: `torchdeck worker --queues cpu`"
)
NO_GPU_FIX = (
    "it consumes a gpu queue but sees no GPU: give its container the NVIDIA runtime "
    "(deploy.resources.reservations.devices in docker-compose.yml, NVIDIA Container Toolkit on the "
    "host) and check CUDA_VISIBLE_DEVICES"
)
ON_ITS_CPU = (
    "note: it consumes a gpu queue and sees no GPU, so it trains those runs on its CPU (the local worker "
    "`make up` starts on a machine without one); on a GPU host, check the NVIDIA driver and CUDA_VISIBLE_DEVICES"
)


def check_workers(engine) -> list[Check]:
    """Workers whose heartbeat is fresh, what they consume and which devices they see; a queue with
    runs waiting and nobody consuming it is a failure."""
    from app.services.broker import heartbeat_age_s, is_alive, stale_after_s
    from db.repo import list_runs, list_workers

    now = datetime.now(UTC)
    try:
        workers = list_workers(engine)
        queued = list_runs(engine, status="queued", limit=1000).runs
    except Exception as e:  # noqa: BLE001
        fix = "run `torchdeck db upgrade`, then `torchdeck doctor` again"
        return [Check("workers", False, f"cannot read the worker table: {first_line(e)}", fix)]
    live = [w for w in workers if is_alive(w, now)]
    stale_after = stale_after_s()
    stale_note = _stale_note([w for w in workers if not is_alive(w, now)], stale_after)
    if not live:
        heard = f"no worker has sent a heartbeat in the last {stale_after:.0f} s"
        return [Check("workers", False, heard, START_FIX, stale_note)]
    strict = gpus_expected()
    checks = [worker_check(w, heartbeat_age_s(w, now), strict) for w in live]
    checks.append(_queues_check(live, queued, START_FIX, stale_note))
    if JOBS_QUEUE not in {q for w in live for q in w.queues}:
        checks.append(_jobs_check())
    return checks


def gpus_expected() -> bool:
    """Whether a worker that consumes a gpu queue must see a GPU: in team mode (TORCHDECK_MODE, read as the
    sign-in check reads it), not in local mode. A mode that is not one counts as team: the sign-in check fails it."""
    from app import auth

    try:
        return auth.team_mode()
    except auth.AuthNotConfigured:
        return True


def worker_check(w, age: float, gpus_expected: bool) -> Check:
    """One live worker: its host, queues, what it takes, its devices, its heartbeat and run."""
    detail = (
        f"on {w.hostname}, queues {', '.join(w.queues) or '-'} (takes {queue_words.takes(w.queues, w.devices)}), "
        f"{_device_text(w.devices)}, heartbeat {age:.0f} s ago"
        + (f", running {w.current_run_id}" if w.current_run_id else "")
    )
    if gpus_offered(w.queues) == 0 or any(d.get("kind") == "gpu" for d in w.devices):
        return Check(f"worker {w.id}", True, detail)
    if gpus_expected:
        return Check(f"worker {w.id}", False, detail, NO_GPU_FIX)
    return Check(f"worker {w.id}", True, detail, notes=[ON_ITS_CPU])


def _device_text(devices) -> str:
    parts = []
    for d in devices:
        if d.get("kind") == "gpu":
            mem = f", {d['mem_mb']:.0f} MB used" if isinstance(d.get("mem_mb"), (int, float)) else ""
            parts.append(f"GPU {d.get('index', '?')}{mem}")
        elif d.get("kind") == "cpu":
            parts.append(f"CPU ({d.get('cores', '?')} cores)")
    return ", ".join(parts) or "no devices reported"


def _stale_note(stale: list, stale_after: float) -> list[str]:
    if not stale:
        return []
    gone = ", ".join(w.id for w in stale[:5])
    return [f"{len(stale)} worker(s) not seen for more than {stale_after:.0f} s (stopped or gone): {gone}"]


def _queues_check(live: list, queued: list, start_fix: str, stale_note: list[str]) -> Check:
    """Whether every queue with queued runs has a live worker; a multi-GPU queue (gpu-xN) nobody consumes is told
    its own command (a worker owning N GPUs), since a GPU worker of fewer GPUs never takes it."""
    consumed = {q for w in live for q in w.queues}
    waiting: dict[str, int] = {}
    for r in queued:
        q = queue_of(r.spec)
        waiting[q] = waiting.get(q, 0) + 1
    orphaned = {q: n for q, n in waiting.items() if q not in consumed}
    if not orphaned:
        return Check("workers", True, f"{len(live)} live, consuming {', '.join(sorted(consumed))}", notes=stale_note)
    what = ", ".join(f"{n} queued run(s) need the {q} queue" for q, n in orphaned.items())
    most = max((gpus_offered(w.queues) for w in live), default=0)
    fixes = [queue_words.fix(q, most) for q in orphaned if q.startswith(MULTI_GPU_PREFIX)]
    return Check("workers", False, f"{what}, which no live worker consumes", "; ".join(fixes) or start_fix, stale_note)


def _jobs_check() -> Check:
    return Check(
        "jobs",
        False,
        "no live worker serves the jobs queue: the dashboard's pre-flight and "
        "'Export now' wait for one wherever the dashboard cannot run them itself (the "
        "torch-free team image, or a run trained on another host)",
        "`torchdeck worker` starts a jobs worker next to its run workers (unless --no-jobs); "
        "team mode: `docker compose up -d worker-cpu`",
    )
