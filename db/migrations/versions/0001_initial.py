"""Initial schema: runs, tags, metrics with their rollup, events, artifacts,
workers, uploaded datasets.

Revision ID: 0001
Revises:
Create Date: 2026-11-30
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0001"
down_revision: str | None = None
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

# Migrations spell their types out rather than import db.models: a migration
# must keep meaning what it meant when the models change.
UTC_TIME = sa.DateTime(timezone=True)
RUN_STATUSES = "'queued', 'running', 'completed', 'early_stopped', 'cancelled', 'failed', 'diverged', 'lost'"


def _run_fk(table: str, ondelete: str = "CASCADE") -> sa.ForeignKeyConstraint:
    return sa.ForeignKeyConstraint(["run_id"], ["run.id"], name=op.f(f"fk_{table}_run_id_run"), ondelete=ondelete)


def upgrade() -> None:
    op.create_table(
        "run",
        sa.Column("id", sa.String(32), nullable=False),
        sa.Column("name", sa.String(200), nullable=False),
        sa.Column("owner", sa.String(100), nullable=False),
        sa.Column("status", sa.String(16), nullable=False),
        sa.Column("spec", sa.JSON(), nullable=False),
        sa.Column("spec_hash", sa.String(64), nullable=False),
        sa.Column("created_at", UTC_TIME, nullable=False),
        sa.Column("started_at", UTC_TIME, nullable=True),
        sa.Column("finished_at", UTC_TIME, nullable=True),
        sa.Column("heartbeat_at", UTC_TIME, nullable=True),
        sa.Column("worker_id", sa.String(200), nullable=True),
        sa.Column("device", sa.String(64), nullable=True),
        sa.Column("attempt", sa.Integer(), nullable=False),
        sa.Column("progress", sa.Double(), nullable=True),
        sa.Column("summary", sa.JSON(), nullable=False),
        sa.Column("error", sa.Text(), nullable=True),
        sa.Column("parent_id", sa.String(32), nullable=True),
        sa.Column("cancel_requested", sa.Boolean(), nullable=False),
        sa.CheckConstraint(f"status IN ({RUN_STATUSES})", name=op.f("ck_run_status")),
        sa.CheckConstraint("attempt >= 0", name=op.f("ck_run_attempt")),
        sa.ForeignKeyConstraint(["parent_id"], ["run.id"], name=op.f("fk_run_parent_id_run"), ondelete="SET NULL"),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_run")),
    )
    for column in ("created_at", "owner", "parent_id", "spec_hash", "status"):
        op.create_index(op.f(f"ix_run_{column}"), "run", [column])

    op.create_table(
        "run_tag",
        sa.Column("run_id", sa.String(32), nullable=False),
        sa.Column("tag", sa.String(64), nullable=False),
        _run_fk("run_tag"),
        sa.PrimaryKeyConstraint("run_id", "tag", name=op.f("pk_run_tag")),
    )
    op.create_index(op.f("ix_run_tag_tag"), "run_tag", ["tag"])

    op.create_table(
        "metric",
        sa.Column("run_id", sa.String(32), nullable=False),
        sa.Column("key", sa.String(200), nullable=False),
        sa.Column("step", sa.BigInteger(), nullable=False),
        sa.Column("epoch", sa.Integer(), nullable=True),
        sa.Column("value", sa.Double(), nullable=True),
        sa.Column("nonfinite", sa.Boolean(), nullable=False),
        sa.Column("wall_time", sa.Double(), nullable=False),
        # No foreign key on the two metric tables: see db.models.Metric.
        sa.PrimaryKeyConstraint("run_id", "key", "step", name=op.f("pk_metric")),
        sqlite_with_rowid=False,
    )
    op.create_table(
        "metric_rollup",
        sa.Column("run_id", sa.String(32), nullable=False),
        sa.Column("level", sa.SmallInteger(), nullable=False),
        sa.Column("key", sa.String(200), nullable=False),
        sa.Column("bucket", sa.BigInteger(), nullable=False),
        sa.Column("count", sa.BigInteger(), nullable=False),
        sa.Column("nonfinite", sa.BigInteger(), nullable=False),
        sa.Column("min_step", sa.BigInteger(), nullable=True),
        sa.Column("min_value", sa.Double(), nullable=True),
        sa.Column("max_step", sa.BigInteger(), nullable=True),
        sa.Column("max_value", sa.Double(), nullable=True),
        sa.Column("first_step", sa.BigInteger(), nullable=False),
        sa.Column("first_value", sa.Double(), nullable=True),
        sa.Column("last_step", sa.BigInteger(), nullable=False),
        sa.Column("last_value", sa.Double(), nullable=True),
        sa.PrimaryKeyConstraint("run_id", "level", "key", "bucket", name=op.f("pk_metric_rollup")),
        sqlite_with_rowid=False,
    )

    op.create_table(
        "event",
        sa.Column(
            "id",
            sa.BigInteger().with_variant(sa.Integer(), "sqlite"),
            autoincrement=True,
            nullable=False,
        ),
        sa.Column("run_id", sa.String(32), nullable=False),
        sa.Column("time", UTC_TIME, nullable=False),
        sa.Column("kind", sa.String(32), nullable=False),
        sa.Column("level", sa.String(16), nullable=False),
        sa.Column("code", sa.String(64), nullable=True),
        sa.Column("message", sa.Text(), nullable=False),
        sa.Column("data", sa.JSON(), nullable=True),
        _run_fk("event"),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_event")),
    )
    op.create_index("ix_event_run_id_id", "event", ["run_id", "id"])

    op.create_table(
        "artifact",
        sa.Column("id", sa.String(32), nullable=False),
        sa.Column("run_id", sa.String(32), nullable=False),
        sa.Column("kind", sa.String(32), nullable=False),
        sa.Column("uri", sa.Text(), nullable=False),
        sa.Column("size", sa.BigInteger(), nullable=True),
        sa.Column("sha256", sa.String(64), nullable=True),
        sa.Column("meta", sa.JSON(), nullable=False),
        sa.Column("created_at", UTC_TIME, nullable=False),
        _run_fk("artifact"),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_artifact")),
    )
    op.create_index(op.f("ix_artifact_run_id"), "artifact", ["run_id"])

    op.create_table(
        "worker",
        sa.Column("id", sa.String(200), nullable=False),
        sa.Column("hostname", sa.String(200), nullable=False),
        sa.Column("queues", sa.JSON(), nullable=False),
        sa.Column("devices", sa.JSON(), nullable=False),
        sa.Column("started_at", UTC_TIME, nullable=False),
        sa.Column("heartbeat_at", UTC_TIME, nullable=False),
        sa.Column("current_run_id", sa.String(32), nullable=True),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_worker")),
    )

    op.create_table(
        "dataset",
        sa.Column("id", sa.String(32), nullable=False),
        sa.Column("name", sa.String(200), nullable=False),
        sa.Column("uri", sa.Text(), nullable=False),
        sa.Column("classes", sa.JSON(), nullable=False),
        sa.Column("counts", sa.JSON(), nullable=False),
        sa.Column("status", sa.String(16), nullable=False),
        sa.Column("error", sa.Text(), nullable=True),
        sa.Column("created_at", UTC_TIME, nullable=False),
        sa.CheckConstraint("status IN ('pending', 'ready', 'failed')", name=op.f("ck_dataset_status")),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_dataset")),
        sa.UniqueConstraint("name", name=op.f("uq_dataset_name")),
    )


def downgrade() -> None:
    for table in ("dataset", "worker", "artifact", "event", "metric_rollup", "metric", "run_tag", "run"):
        op.drop_table(table)
