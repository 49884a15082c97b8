"""Execution settings, from the environment (TORCHDECK_*), each with a reason for its default."""

from __future__ import annotations

from pathlib import Path
from typing import Literal
from urllib.parse import urlsplit

from pydantic import Field, field_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from core.names import FINISHED_STATUSES, STALE_AFTER_S
from core.redact import redact
from db.artifacts import ArtifactStore, local_run_root, open_store
from db.queue_order import DEFAULT_HALF_LIFE_S


class WorkerSettings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="TORCHDECK_", extra="ignore", hide_input_in_errors=True)

    broker_url: str = Field("redis://127.0.0.1:6379/0", description="Celery broker (Redis).")
    artifacts: str | None = Field(
        None,
        description="Artifact store URL: a folder (default $TORCHDECK_HOME/artifacts) or s3://bucket/prefix "
        "(endpoint from TORCHDECK_S3_ENDPOINT_URL, credentials from the AWS variables) shared by all hosts.",
    )
    heartbeat_s: float = Field(2.0, gt=0, description="Run heartbeat period; ≤ 5 s so a cancel lands within seconds.")
    stale_after_s: float = Field(
        STALE_AFTER_S, gt=0, description="A running run whose heartbeat is older is lost (worker died)."
    )
    reap_every_s: float = Field(
        10.0, gt=0, description="How often each worker looks for lost runs and checks the alert rules."
    )
    requeue_after_s: float = Field(
        120.0,
        gt=0,
        description="A lost run nobody claimed for this long is sent again "
        "(its first message may never have left a reaper that died).",
    )
    script_silent_after_s: float = Field(
        900.0,
        gt=0,
        description="A run logged by a person's own script (the MLflow endpoint) is lost when the script wrote "
        "nothing for this long (killed, or its machine gone); it is running again if the script writes again.",
    )
    max_attempts: int = Field(3, ge=1, description="A lost run is re-queued until it has been tried this many times.")
    fair_half_life_s: float = Field(
        DEFAULT_HALF_LIFE_S,
        gt=0,
        description="The fair queue forgets a person's GPU time with this half-life: within a priority, the run of "
        "the person with the least decayed GPU time goes first (db/queue_order.py).",
    )
    cancel_grace_s: float = Field(
        30.0, ge=0, description="After a cancel, time the run gets to stop cleanly before SIGTERM, then SIGKILL."
    )
    flush_s: float = Field(
        1.0,
        gt=0,
        description="Metric sink flush period (the training step never waits for it). "
        "Each write has a fixed cost (transaction, rollup lookups): 1 s keeps the sink's threads "
        "under 1 % of a core on a fast loop while charts stay within a refresh of live.",
    )
    flush_points: int = Field(1000, ge=1, description="Flush early once this many points are buffered.")
    sink_buffer_points: int = Field(
        200_000,
        ge=10,
        description="Metric points a run holds in memory while the database is unreachable (a few "
        "minutes of a fast run); beyond, they are spilled to the run's folder and stored when it is back.",
    )
    flush_timeout_s: float = Field(
        60.0,
        gt=0,
        description="How long a checkpoint waits for the run's metrics to be "
        "stored; past it they are spilled to disk and the run is marked degraded.",
    )
    sys_metrics_s: float = Field(5.0, gt=0, description="System metrics (CPU, RSS, GPU) sampling period.")
    run_start: Literal["forkserver", "spawn"] = Field(
        "forkserver",
        description="How a run's process starts. forkserver: forked from a server process of the "
        "worker that imported torch, core and the data readers once (and never touches CUDA), so a process is "
        "ready in well under a second and a sweep's next trial never waits for an import. spawn: a fresh "
        "interpreter that imports them itself (4-5 s of CPU per run; the next run's process is still spawned "
        "while a run trains, but a run shorter than that import leaves its successor waiting). Either way each "
        "run has a process of its own, which exits when the run ends.",
    )
    visibility_timeout_s: int = Field(
        3600,
        ge=60,
        description="Redis redelivers an unacknowledged task after this; a duplicate is refused by the database claim.",
    )
    webhook_url: str | None = Field(
        None,
        description="Run-end notifications: a JSON POST (a Slack-compatible `text` and the run's figures) to this "
        "http(s) URL when a run ends, e.g. a Slack incoming webhook. Unset or empty: none is sent.",
    )
    webhook_on: str = Field(
        ",".join(FINISHED_STATUSES),
        description="Comma-separated final statuses that notify (e.g. failed,diverged); unset or empty: every one.",
    )
    public_url: str | None = Field(
        None,
        description="The dashboard's public address (https://torchdeck.example.com): "
        "notifications link to the run's page.",
    )

    @field_validator("webhook_url", "public_url", mode="before")
    @classmethod
    def _http_url(cls, value: object, info) -> str | None:
        if value is None or (isinstance(value, str) and not value.strip()):
            return None
        text = str(value).strip()
        parts = urlsplit(text)
        if parts.scheme.lower() not in ("http", "https") or not parts.hostname:
            raise ValueError(
                f"TORCHDECK_{info.field_name.upper()} must be an http:// or https:// URL with a host "
                f"(e.g. https://hooks.slack.com/services/...), not {redact(text)!r}"
            )
        return text

    @field_validator("webhook_on", mode="before")
    @classmethod
    def _final_statuses(cls, value: object) -> str:
        names = [v.strip().lower() for v in str(value or "").split(",") if v.strip()]
        unknown = [n for n in names if n not in FINISHED_STATUSES]
        if unknown:
            raise ValueError(
                f"TORCHDECK_WEBHOOK_ON: {', '.join(unknown)} is not a final status; "
                f"use a comma-separated list of {', '.join(FINISHED_STATUSES)}"
            )
        return ",".join(dict.fromkeys(names)) or ",".join(FINISHED_STATUSES)

    @property
    def webhook_statuses(self) -> tuple[str, ...]:
        """The final statuses that notify (TORCHDECK_WEBHOOK_ON)."""
        return tuple(self.webhook_on.split(","))

    def artifact_root(self) -> Path:
        """This host's run root: the store's folder when it is local, else a local working copy."""
        root = local_run_root(self.artifacts)
        root.mkdir(parents=True, exist_ok=True)
        return root.resolve()

    def store(self) -> ArtifactStore:
        return open_store(self.artifacts)

    def run_dir(self, run_id: str) -> Path:
        return self.artifact_root() / "runs" / run_id
