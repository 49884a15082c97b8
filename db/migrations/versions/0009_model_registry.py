"""The model registry: `registered_model` (a name and its owner), `model_version` (a run's verified export set and
its lineage, numbered 1, 2, … per model), `model_alias` (where `production`, `staging`, … point now) and
`model_alias_move` (every move of an alias: who, when, from which version to which).

Revision ID: 0009
Revises: 0008
Create Date: 2026-12-03
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0009"
down_revision: str | None = "0008"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

NAME, OWNER, ID, ALIAS = 200, 400, 32, 64


def upgrade() -> None:
    op.create_table(
        "registered_model",
        sa.Column("name", sa.String(NAME), nullable=False),
        sa.Column("owner", sa.String(OWNER), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("name", name="pk_registered_model"),
    )
    op.create_index("ix_registered_model_owner", "registered_model", ["owner"])
    op.create_table(
        "model_version",
        sa.Column("model_name", sa.String(NAME), nullable=False),
        sa.Column("version", sa.Integer(), nullable=False),
        sa.Column("run_id", sa.String(ID), nullable=False),
        sa.Column("artifacts", sa.JSON(), nullable=False),
        sa.Column("lineage", sa.JSON(), nullable=False),
        sa.Column("created_by", sa.String(OWNER), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.ForeignKeyConstraint(
            ["model_name"],
            ["registered_model.name"],
            name=op.f("fk_model_version_model_name_registered_model"),
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("model_name", "version", name="pk_model_version"),
    )
    op.create_index("ix_model_version_run_id", "model_version", ["run_id"])
    op.create_table(
        "model_alias",
        sa.Column("model_name", sa.String(NAME), nullable=False),
        sa.Column("alias", sa.String(ALIAS), nullable=False),
        sa.Column("version", sa.Integer(), nullable=False),
        sa.Column("updated_by", sa.String(OWNER), nullable=False),
        sa.Column("updated_at", sa.DateTime(timezone=True), nullable=False),
        sa.ForeignKeyConstraint(
            ["model_name", "version"],
            ["model_version.model_name", "model_version.version"],
            name=op.f("fk_model_alias_model_name_model_version"),
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("model_name", "alias", name="pk_model_alias"),
    )
    op.create_table(
        "model_alias_move",
        sa.Column("id", sa.BigInteger().with_variant(sa.Integer(), "sqlite"), autoincrement=True, nullable=False),
        sa.Column("model_name", sa.String(NAME), nullable=False),
        sa.Column("alias", sa.String(ALIAS), nullable=False),
        sa.Column("from_version", sa.Integer(), nullable=True),
        sa.Column("to_version", sa.Integer(), nullable=False),
        sa.Column("moved_by", sa.String(OWNER), nullable=False),
        sa.Column("moved_at", sa.DateTime(timezone=True), nullable=False),
        sa.ForeignKeyConstraint(
            ["model_name"],
            ["registered_model.name"],
            name=op.f("fk_model_alias_move_model_name_registered_model"),
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("id", name="pk_model_alias_move"),
    )
    op.create_index("ix_model_alias_move_model_name_id", "model_alias_move", ["model_name", "id"])


def downgrade() -> None:
    op.drop_index("ix_model_alias_move_model_name_id", table_name="model_alias_move")
    op.drop_table("model_alias_move")
    op.drop_table("model_alias")
    op.drop_index("ix_model_version_run_id", table_name="model_version")
    op.drop_table("model_version")
    op.drop_index("ix_registered_model_owner", table_name="registered_model")
    op.drop_table("registered_model")
