"""Idempotent events and degraded runs: `event.key` (unique per run, NULL for events stored as they
come) and `run.degraded` (why a run's stored record may be incomplete).

Revision ID: 0002
Revises: 0001
Create Date: 2026-12-01
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0002"
down_revision: str | None = "0001"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("event") as batch:
        batch.add_column(sa.Column("key", sa.String(160), nullable=True))
    # Both backends let a unique index hold many NULLs: keyless events never conflict.
    op.create_index("uq_event_run_id_key", "event", ["run_id", "key"], unique=True)
    with op.batch_alter_table("run") as batch:
        batch.add_column(sa.Column("degraded", sa.Text(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("run") as batch:
        batch.drop_column("degraded")
    op.drop_index("uq_event_run_id_key", table_name="event")
    with op.batch_alter_table("event") as batch:
        batch.drop_column("key")
