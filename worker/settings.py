"""Execution settings, from the environment (TORCHDECK_*), each with a reason for its default."""

from __future__ import annotations

from pathlib import Path

from pydantic import Field
from pydantic_settings import BaseSettings, SettingsConfigDict

from db.engine import data_home


class WorkerSettings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="TORCHDECK_", extra="ignore")

    broker_url: str = Field("redis://127.0.0.1:6379/0", description="Celery broker (Redis).")
    artifacts: str | None = Field(None, description="Artifact root folder; default $TORCHDECK_HOME/artifacts.")
    heartbeat_s: float = Field(2.0, gt=0, description="Run heartbeat period; ≤ 5 s so a cancel lands within seconds.")
    stale_after_s: float = Field(30.0, gt=0, description="A running run whose heartbeat is older is lost (worker died).")
    reap_every_s: float = Field(10.0, gt=0, description="How often each worker looks for lost runs.")
    max_attempts: int = Field(3, ge=1, description="A lost run is re-queued until it has been tried this many times.")
    cancel_grace_s: float = Field(30.0, ge=0, description="After a cancel, time the run gets to stop cleanly before SIGTERM, then SIGKILL.")
    flush_s: float = Field(0.5, gt=0, description="Metric sink flush period (the training step never waits for it).")
    flush_points: int = Field(1000, ge=1, description="Flush early once this many points are buffered.")
    sys_metrics_s: float = Field(5.0, gt=0, description="System metrics (CPU, RSS, GPU) sampling period.")
    visibility_timeout_s: int = Field(
        3600, ge=60, description="Redis redelivers an unacknowledged task after this; a duplicate is refused by the database claim."
    )

    def artifact_root(self) -> Path:
        root = Path(self.artifacts).expanduser() if self.artifacts else data_home() / "artifacts"
        root.mkdir(parents=True, exist_ok=True)
        return root.resolve()

    def run_dir(self, run_id: str) -> Path:
        return self.artifact_root() / "runs" / run_id
