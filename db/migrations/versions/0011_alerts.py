"""`alert_rule` and `alert_firing`: rules that watch runs, workers and sweeps, and each time one fired (unique per
rule, subject and episode, so concurrent evaluators fire once).

Revision ID: 0011
Revises: 0010
Create Date: 2026-12-03
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0011"
down_revision: str | None = "0010"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

ID, KEY, OWNER, SUBJECT = 32, 200, 400, 220


def upgrade() -> None:
    op.create_table(
        "alert_rule",
        sa.Column("id", sa.String(ID), nullable=False),
        sa.Column("scope", sa.String(16), nullable=False),
        sa.Column("run_id", sa.String(ID), nullable=True),
        sa.Column("kind", sa.String(16), nullable=False),
        sa.Column("key", sa.String(KEY), nullable=True),
        sa.Column("op", sa.String(8), nullable=True),
        sa.Column("threshold", sa.Double(), nullable=True),
        sa.Column("epochs", sa.Integer(), nullable=True),
        sa.Column("minutes", sa.Double(), nullable=True),
        sa.Column("cooldown_min", sa.Double(), nullable=False),
        sa.Column("created_by", sa.String(OWNER), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.CheckConstraint("scope IN ('global', 'run')", name=op.f("ck_alert_rule_scope")),
        sa.CheckConstraint("(scope = 'run') = (run_id IS NOT NULL)", name=op.f("ck_alert_rule_run_scope")),
        sa.ForeignKeyConstraint(["run_id"], ["run.id"], name=op.f("fk_alert_rule_run_id_run"), ondelete="CASCADE"),
        sa.PrimaryKeyConstraint("id", name="pk_alert_rule"),
    )
    op.create_index("ix_alert_rule_run_id", "alert_rule", ["run_id"])
    op.create_table(
        "alert_firing",
        sa.Column("id", sa.BigInteger().with_variant(sa.Integer(), "sqlite"), autoincrement=True, nullable=False),
        sa.Column("rule_id", sa.String(ID), nullable=False),
        sa.Column("subject", sa.String(SUBJECT), nullable=False),
        sa.Column("episode", sa.Integer(), nullable=False),
        sa.Column("run_id", sa.String(ID), nullable=True),
        sa.Column("reason", sa.Text(), nullable=False),
        sa.Column("fired_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("cleared_at", sa.DateTime(timezone=True), nullable=True),
        sa.ForeignKeyConstraint(
            ["rule_id"], ["alert_rule.id"], name=op.f("fk_alert_firing_rule_id_alert_rule"), ondelete="CASCADE"
        ),
        sa.ForeignKeyConstraint(["run_id"], ["run.id"], name=op.f("fk_alert_firing_run_id_run"), ondelete="CASCADE"),
        sa.PrimaryKeyConstraint("id", name="pk_alert_firing"),
    )
    op.create_index(
        "uq_alert_firing_rule_id_subject_episode", "alert_firing", ["rule_id", "subject", "episode"], unique=True
    )
    op.create_index("ix_alert_firing_fired_at", "alert_firing", ["fired_at"])
    op.create_index("ix_alert_firing_run_id", "alert_firing", ["run_id"])


def downgrade() -> None:
    op.drop_index("ix_alert_firing_run_id", table_name="alert_firing")
    op.drop_index("ix_alert_firing_fired_at", table_name="alert_firing")
    op.drop_index("uq_alert_firing_rule_id_subject_episode", table_name="alert_firing")
    op.drop_table("alert_firing")
    op.drop_index("ix_alert_rule_run_id", table_name="alert_rule")
    op.drop_table("alert_rule")
