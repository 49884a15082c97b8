"""Sweeps and seed groups.

- `sweep`: many runs as one experiment (a base spec, a search space, a method, an objective, a budget).
- `sweep_trial`: one configuration of a sweep, its number taken once (the primary key).
- `sweep_decision`: the pruner's verdict on a trial at an epoch end, taken once.
- `run.sweep_id`, `run.trial`, `run.group_id`: a trial is an ordinary run; runs that differ only by seed share
  a group.
- `run.status` may be `pruned`.

Revision ID: 0004
Revises: 0003
Create Date: 2026-12-01
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0004"
down_revision: str | None = "0003"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

OLD = "'queued', 'running', 'completed', 'early_stopped', 'cancelled', 'failed', 'diverged', 'lost'"
NEW = OLD + ", 'pruned'"
SWEEP_STATUSES = "'running', 'completed', 'cancelled', 'failed'"


def upgrade() -> None:
    op.create_table(
        "sweep",
        sa.Column("id", sa.String(32), nullable=False),
        sa.Column("name", sa.String(200), nullable=False),
        sa.Column("owner", sa.String(400), nullable=False),
        sa.Column("status", sa.String(16), nullable=False),
        sa.Column("spec", sa.JSON(), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("finished_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("error", sa.Text(), nullable=True),
        sa.CheckConstraint(f"status IN ({SWEEP_STATUSES})", name=op.f("ck_sweep_status")),
        sa.PrimaryKeyConstraint("id", name="pk_sweep"),
    )
    for column in ("owner", "status", "created_at"):
        op.create_index(f"ix_sweep_{column}", "sweep", [column])
    _children()
    with op.batch_alter_table("run") as batch:
        batch.add_column(sa.Column("sweep_id", sa.String(32), nullable=True))
        batch.add_column(sa.Column("trial", sa.Integer(), nullable=True))
        batch.add_column(sa.Column("group_id", sa.String(32), nullable=True))
        batch.create_foreign_key(op.f("fk_run_sweep_id_sweep"), "sweep", ["sweep_id"], ["id"])
        batch.drop_constraint(op.f("ck_run_status"), type_="check")
        batch.create_check_constraint(op.f("ck_run_status"), f"status IN ({NEW})")
    op.create_index("ix_run_sweep_id", "run", ["sweep_id"])
    op.create_index("ix_run_group_id", "run", ["group_id"])


def _children() -> None:
    def common(table: str) -> list:
        return [
            sa.Column("sweep_id", sa.String(32), nullable=False),
            sa.Column("number", sa.Integer(), nullable=False),
            sa.ForeignKeyConstraint(
                ["sweep_id"], ["sweep.id"], name=op.f(f"fk_{table}_sweep_id_sweep"), ondelete="CASCADE"
            ),
        ]

    op.create_table(
        "sweep_trial",
        *common("sweep_trial"),
        sa.Column("params", sa.JSON(), nullable=False),
        sa.Column("attrs", sa.JSON(), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("sweep_id", "number", name="pk_sweep_trial"),
    )
    op.create_table(
        "sweep_decision",
        *common("sweep_decision"),
        sa.Column("epoch", sa.Integer(), nullable=False),
        sa.Column("pruned", sa.Boolean(), nullable=False),
        sa.Column("value", sa.Double(), nullable=True),
        sa.Column("reason", sa.Text(), nullable=True),
        sa.Column("attrs", sa.JSON(), nullable=False),
        sa.Column("run_id", sa.String(32), nullable=True),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("sweep_id", "number", "epoch", name="pk_sweep_decision"),
    )


def downgrade() -> None:
    # The older schema has no `pruned`: such runs stay, as cancelled (their events still say why they stopped).
    op.execute("UPDATE run SET status = 'cancelled' WHERE status = 'pruned'")
    op.drop_index("ix_run_group_id", table_name="run")
    op.drop_index("ix_run_sweep_id", table_name="run")
    with op.batch_alter_table("run") as batch:
        batch.drop_constraint(op.f("ck_run_status"), type_="check")
        batch.create_check_constraint(op.f("ck_run_status"), f"status IN ({OLD})")
        batch.drop_constraint(op.f("fk_run_sweep_id_sweep"), type_="foreignkey")
        batch.drop_column("group_id")
        batch.drop_column("trial")
        batch.drop_column("sweep_id")
    op.drop_table("sweep_decision")
    op.drop_table("sweep_trial")
    for column in ("owner", "status", "created_at"):
        op.drop_index(f"ix_sweep_{column}", table_name="sweep")
    op.drop_table("sweep")
