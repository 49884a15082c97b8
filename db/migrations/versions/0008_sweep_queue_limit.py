"""A sweep's queued-runs limit: `sweep.max_queued`, the per-person limit of queued runs the dashboard applied
when the sweep was launched (NULL: none). Its trials are created later, often by a worker, which does not know
the dashboard's settings: the controller reads the limit here, so that a trial waits while its owner is at it.

Revision ID: 0008
Revises: 0007
Create Date: 2026-12-03
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0008"
down_revision: str | None = "0007"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("sweep") as batch:
        batch.add_column(sa.Column("max_queued", sa.Integer(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("sweep") as batch:
        batch.drop_column("max_queued")
