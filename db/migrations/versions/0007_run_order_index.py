"""The runs list's order as one index: `run (created_at, id)` replaces `run (created_at)`, so the first page of
the newest runs (filtered or not) is read from the index instead of sorting every run.

Revision ID: 0007
Revises: 0006
Create Date: 2026-12-02
"""

from __future__ import annotations

from collections.abc import Sequence

from alembic import op

revision: str = "0007"
down_revision: str | None = "0006"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_index("ix_run_created_at_id", "run", ["created_at", "id"])
    op.drop_index("ix_run_created_at", table_name="run")


def downgrade() -> None:
    op.create_index("ix_run_created_at", "run", ["created_at"])
    op.drop_index("ix_run_created_at_id", table_name="run")
