"""The Celery application. Every setting says why; nothing here connects at import time.

The database is the source of truth (run status, claims, results), so Celery only moves
run ids: no result backend, JSON only, one task at a time per worker process.
"""

from __future__ import annotations

from celery import Celery

from core.names import CPU_QUEUE
from core.redact import redact_logs
from worker.settings import WorkerSettings


def make_app(settings: WorkerSettings | None = None) -> Celery:
    s = settings or WorkerSettings()
    app = Celery("torchdeck", broker=s.broker_url, include=["worker.tasks", "worker.jobs", "worker.alias_notify"])
    app.conf.update(
        # JSON only: a message never carries pickled code.
        task_serializer="json",
        accept_content=["json"],
        # No result backend: status and results live in the database.
        task_ignore_result=True,
        result_backend=None,
        # One run at a time: a solo-pool worker owns its GPU, prefetching would starve other workers.
        worker_prefetch_multiplier=1,
        # acks_late is set on the run task alone (safe to re-deliver thanks to the database claim);
        # other tasks keep the default early ack.
        task_acks_late=False,
        # A run can last hours: Redis re-delivers an unacked task after this many seconds. A re-delivery
        # while the run is alive is refused by the atomic claim, so a moderate value is safe and lets a
        # task whose worker died before claiming come back.
        broker_transport_options={"visibility_timeout": s.visibility_timeout_s},
        broker_connection_retry_on_startup=True,
        # Runs are routed by resource (core.names.queue_of): cpu → "cpu", one GPU → "gpu", N GPUs → "gpu-xN".
        task_default_queue=CPU_QUEUE,
        task_create_missing_queues=True,
        # A worker that loses Redis keeps retrying instead of exiting; the run's child is unaffected.
        broker_connection_max_retries=None,
        worker_hijack_root_logger=False,
        worker_send_task_events=False,
    )
    return app


redact_logs()  # every worker process: no password of a URL in its log lines
app = make_app()
