"""The repository: every read and write the workers and the UI need, as plain
functions taking an engine first and returning frozen dataclasses (db/types.py).

The functions live in small modules by subject; this module is the one place
callers import them from.
"""

from db.errors import (
    ArtifactNotFound,
    DatasetNotFound,
    NotOwned,
    QueueLimitReached,
    RunNotFound,
    RunStillActive,
    SchemaOutOfDate,
    SweepNotFound,
)
from db.filters import FilterError, parse as parse_filter, spec_fields
from db.listing import list_runs, owners_and_tags
from db.metrics import append_metrics, metric_keys, point_problem, series_counts
from db.records import (
    accounts,
    upsert_account,
    add_artifact,
    append_events,
    event_problem,
    create_dataset,
    delete_dataset,
    get_artifact,
    get_dataset,
    list_artifacts,
    list_datasets,
    list_events,
    list_workers,
    remove_worker,
    update_dataset,
    upsert_worker,
)
from db.handoff import mark_run_lost
from db.quota import queued_count
from db.runs import (
    check_notes,
    check_tags,
    claim_run,
    create_run,
    create_runs,
    delete_run,
    finish_run,
    get_run,
    heartbeat,
    mark_degraded,
    mark_lost,
    new_group_id,
    unclaimed_runs,
    readable_name,
    request_cancel,
    set_notes,
    set_tags,
    set_tags_and_notes,
    stale_runs,
)
from db.sweeps import (
    add_trial,
    create_sweep,
    decisions,
    epoch_values,
    finish_sweep,
    get_sweep,
    group_runs,
    list_sweeps,
    record_decision,
    set_group,
    sweep_runs,
    trials,
)
from db.units import Members, Unit, UnitPage, list_units, members
from db.series import compare, epoch_anchors, iter_points, series, series_many
from db.types import (
    AccountRecord,
    ArtifactRecord,
    Comparison,
    DatasetRecord,
    EventInput,
    EventRecord,
    HeartbeatReply,
    MetricPoint,
    MetricSummary,
    RunPage,
    RunRecord,
    Series,
    SeriesPoint,
    DecisionRecord,
    SweepRecord,
    TrialRecord,
    WorkerRecord,
)
from db.follows import FollowedRun, follow, followed, unfollow

__all__ = [
    "series_counts", "series_many",
    "ArtifactNotFound", "DatasetNotFound", "NotOwned", "QueueLimitReached", "RunNotFound", "RunStillActive", "SchemaOutOfDate",
    "ArtifactRecord", "Comparison", "DatasetRecord", "EventInput", "EventRecord",
    "HeartbeatReply", "MetricPoint", "MetricSummary", "RunPage", "RunRecord", "Series",
    "SeriesPoint", "WorkerRecord",
    "create_run", "create_runs", "queued_count", "get_run", "set_tags", "claim_run", "heartbeat", "request_cancel",
    "finish_run", "stale_runs", "mark_lost", "mark_run_lost", "mark_degraded", "unclaimed_runs", "delete_run", "list_runs",
    "append_metrics", "metric_keys", "point_problem", "series", "compare", "epoch_anchors", "iter_points",
    "owners_and_tags",
    "append_events", "event_problem", "list_events", "add_artifact", "get_artifact", "list_artifacts",
    "upsert_worker", "list_workers", "remove_worker",
    "create_dataset", "get_dataset", "list_datasets", "update_dataset", "delete_dataset",
    "AccountRecord", "upsert_account", "accounts",
    "SweepNotFound", "SweepRecord", "TrialRecord", "DecisionRecord", "create_sweep", "get_sweep", "list_sweeps",
    "finish_sweep", "add_trial", "trials", "sweep_runs", "group_runs", "set_group", "epoch_values", "record_decision",
    "decisions", "new_group_id", "Unit", "UnitPage", "list_units", "Members", "members",
    "set_notes", "set_tags_and_notes", "check_notes", "check_tags", "readable_name", "FilterError", "parse_filter", "spec_fields",
    "FollowedRun", "follow", "unfollow", "followed",
]
