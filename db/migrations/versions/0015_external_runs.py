"""Runs logged by people's own scripts through the MLflow client (app/tracking/), and the personal API tokens they
send: `run.source` says who writes a run (`torchdeck`: its worker; `mlflow`: a script through the tracking endpoint),
existing runs are torchdeck's; `api_token` holds each token's SHA-256 only, with whose it is.

Revision ID: 0015
Revises: 0014
Create Date: 2026-12-03
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0015"
down_revision: str | None = "0014"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("run") as batch:
        batch.add_column(sa.Column("source", sa.String(16), server_default="torchdeck", nullable=False))
        batch.create_index("ix_run_source_status", ["source", "status"])
    op.create_table(
        "api_token",
        sa.Column("id", sa.String(32), primary_key=True),
        sa.Column("digest", sa.String(64), nullable=False),
        sa.Column("person", sa.String(400), nullable=False),
        sa.Column("person_name", sa.String(200), nullable=False),
        sa.Column("email", sa.String(320), nullable=True),
        sa.Column("groups", sa.JSON(), nullable=False),
        sa.Column("label", sa.String(200), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("last_used_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("revoked_at", sa.DateTime(timezone=True), nullable=True),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_api_token")),
        sa.UniqueConstraint("digest", name=op.f("uq_api_token_digest")),
    )
    op.create_index("ix_api_token_person", "api_token", ["person"])


def downgrade() -> None:
    op.drop_index("ix_api_token_person", table_name="api_token")
    op.drop_table("api_token")
    with op.batch_alter_table("run") as batch:
        batch.drop_index("ix_run_source_status")
        batch.drop_column("source")
