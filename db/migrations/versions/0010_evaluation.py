"""`evaluation`: a finished run's export scored on a registered dataset (which file, which data and its
fingerprint, the scores, the per-class details and confusion matrix, when and by whom).

Revision ID: 0010
Revises: 0009
Create Date: 2026-12-03
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0010"
down_revision: str | None = "0009"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

ID, NAME, OWNER = 32, 200, 400


def upgrade() -> None:
    op.create_table(
        "evaluation",
        sa.Column("id", sa.String(ID), nullable=False),
        sa.Column("run_id", sa.String(ID), nullable=False),
        sa.Column("artifact_id", sa.String(ID), nullable=False),
        sa.Column("dataset", sa.String(NAME), nullable=False),
        sa.Column("dataset_path", sa.Text(), nullable=True),
        sa.Column("fingerprint", sa.String(64), nullable=False),
        sa.Column("metrics", sa.JSON(), nullable=False),
        sa.Column("details", sa.JSON(), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("created_by", sa.String(OWNER), nullable=False),
        sa.ForeignKeyConstraint(["run_id"], ["run.id"], name=op.f("fk_evaluation_run_id_run"), ondelete="CASCADE"),
        sa.PrimaryKeyConstraint("id", name="pk_evaluation"),
    )
    op.create_index("ix_evaluation_run_id", "evaluation", ["run_id"])


def downgrade() -> None:
    op.drop_index("ix_evaluation_run_id", table_name="evaluation")
    op.drop_table("evaluation")
