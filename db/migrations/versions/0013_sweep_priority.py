"""A sweep's priority (-1 low, 0 normal, 1 high): the priority its trials are queued at (db/queue_order.py), changed
with its queued trials'. Existing sweeps: normal.

Revision ID: 0013
Revises: 0012
Create Date: 2026-12-03
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0013"
down_revision: str | None = "0012"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("sweep") as batch:
        batch.add_column(sa.Column("priority", sa.Integer(), server_default="0", nullable=False))


def downgrade() -> None:
    with op.batch_alter_table("sweep") as batch:
        batch.drop_column("priority")
