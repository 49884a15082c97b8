"""Errors the repository raises, each saying what was wrong and what to do."""

from __future__ import annotations


class RunNotFound(LookupError):
    def __init__(self, run_id: str) -> None:
        super().__init__(f"run {run_id!r} not found")
        self.run_id = run_id


class ArtifactNotFound(LookupError):
    def __init__(self, artifact_id: str) -> None:
        super().__init__(f"artifact {artifact_id!r} not found")
        self.artifact_id = artifact_id


class DatasetNotFound(LookupError):
    def __init__(self, dataset_id: str) -> None:
        super().__init__(f"dataset {dataset_id!r} not found")
        self.dataset_id = dataset_id


class RunStillActive(ValueError):
    """Deleting a run a worker is still writing to would make the worker fail."""

    def __init__(self, run_id: str, status: str) -> None:
        super().__init__(f"run {run_id!r} is {status}: cancel it and wait until it stops, or delete with force=True")
        self.run_id = run_id


class RunRegistered(ValueError):
    """Deleting a run whose exports are versions of registered models would break their links (by alias too)."""

    def __init__(self, run_id: str, versions: list[str]) -> None:
        super().__init__(
            f"run {run_id!r} holds the files of registered model version(s) {', '.join(versions)}: deleting it would "
            "break their download links"
        )
        self.run_id, self.versions = run_id, versions


class QueueLimitReached(ValueError):
    """An owner has as many queued runs as the deployment allows (TORCHDECK_MAX_QUEUED_PER_OWNER)."""

    def __init__(self, owner: str, queued: int, limit: int, adding: int = 1) -> None:
        more = f", and these {adding} would make {queued + adding}" if adding > 1 else ""
        super().__init__(
            f"{owner} has {queued} queued runs; this dashboard allows {limit} per person "
            f"(TORCHDECK_MAX_QUEUED_PER_OWNER){more}: wait for some to start, or cancel some"
        )
        self.owner, self.queued, self.limit, self.adding = owner, queued, limit, adding


class NotOwned(RuntimeError):
    """A write on behalf of a worker that no longer owns the run (another worker claimed it, or it ended)."""

    def __init__(self, run_id: str, worker_id: str) -> None:
        super().__init__(f"run {run_id!r} is no longer owned by worker {worker_id!r}")
        self.run_id, self.worker_id = run_id, worker_id


class SchemaOutOfDate(RuntimeError):
    """The database schema is not the one this code was written for."""

    def __init__(self, current: str | None, head: str, url: str, *, newer: bool = False) -> None:
        if newer:
            message = (
                f"the database at {url} has schema revision {current}, which this version of "
                f"torchdeck (revision {head}) does not know: a newer torchdeck upgraded it. "
                "Run that newer version; `torchdeck db upgrade` cannot go back."
            )
        else:
            message = (
                f"the database at {url} has schema revision {current or 'empty (no tables)'}, "
                f"but this version of torchdeck needs {head}. Run `torchdeck db upgrade` "
                "(with the same TORCHDECK_DATABASE_URL) and start again."
            )
        super().__init__(message)
        self.current = current
        self.head = head


class SweepNotFound(LookupError):
    def __init__(self, sweep_id: str) -> None:
        super().__init__(f"sweep {sweep_id!r} not found")
        self.sweep_id = sweep_id
