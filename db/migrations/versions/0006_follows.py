"""Follows: `follow`, one row per person following a run (the dashboard tells them when it ends); deleting the
run deletes its follows.

Revision ID: 0006
Revises: 0005
Create Date: 2026-12-01
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0006"
down_revision: str | None = "0005"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "follow",
        sa.Column("owner", sa.String(400), nullable=False),
        sa.Column("run_id", sa.String(32), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.ForeignKeyConstraint(["run_id"], ["run.id"], name=op.f("fk_follow_run_id_run"), ondelete="CASCADE"),
        sa.PrimaryKeyConstraint("owner", "run_id", name="pk_follow"),
    )
    op.create_index("ix_follow_run_id", "follow", ["run_id"])


def downgrade() -> None:
    op.drop_index("ix_follow_run_id", table_name="follow")
    op.drop_table("follow")
