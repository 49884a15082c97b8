"""Projects: the project table, who belongs to which (project_member, with a role), and the project of every run,
sweep, dataset and registered model. Existing rows go to the default project, which every member of the
dashboard may use as a member (open_role), as they could before projects.

Revision ID: 0014
Revises: 0013
Create Date: 2026-12-03
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import UTC, datetime

import sqlalchemy as sa
from alembic import op

revision: str = "0014"
down_revision: str | None = "0013"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

DEFAULT = "default"
ROLES = "'viewer', 'member', 'maintainer'"
TABLES = ("run", "sweep", "dataset", "registered_model")


def upgrade() -> None:
    project = op.create_table(
        "project",
        sa.Column("name", sa.String(40), nullable=False),
        sa.Column("description", sa.Text(), server_default="", nullable=False),
        sa.Column("open_role", sa.String(16), nullable=True),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("created_by", sa.String(400), nullable=False),
        sa.CheckConstraint(f"open_role IS NULL OR open_role IN ({ROLES})", name=op.f("ck_project_open_role")),
        sa.PrimaryKeyConstraint("name", name=op.f("pk_project")),
    )
    op.create_table(
        "project_member",
        sa.Column("project", sa.String(40), nullable=False),
        sa.Column("person", sa.String(400), nullable=False),
        sa.Column("role", sa.String(16), nullable=False),
        sa.Column("added_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("added_by", sa.String(400), nullable=False),
        sa.CheckConstraint(f"role IN ({ROLES})", name=op.f("ck_project_member_role")),
        sa.ForeignKeyConstraint(
            ["project"], ["project.name"], name=op.f("fk_project_member_project_project"), ondelete="CASCADE"
        ),
        sa.PrimaryKeyConstraint("project", "person", name=op.f("pk_project_member")),
    )
    op.create_index(op.f("ix_project_member_person"), "project_member", ["person"])
    op.bulk_insert(
        project,
        [
            {
                "name": DEFAULT,
                "description": "Every run made before projects, and every run made without choosing one.",
                "open_role": "member",
                "created_at": datetime.now(UTC),
                "created_by": "torchdeck",
            }
        ],
    )
    for table in TABLES:
        with op.batch_alter_table(table) as batch:
            batch.add_column(sa.Column("project", sa.String(40), server_default=DEFAULT, nullable=False))
            batch.create_index(batch.f(f"ix_{table}_project"), ["project"])
            batch.create_foreign_key(batch.f(f"fk_{table}_project_project"), "project", ["project"], ["name"])
    with op.batch_alter_table("alert_rule") as batch:  # a project's rules: they watch its runs and sweeps
        batch.add_column(sa.Column("project", sa.String(40), nullable=True))
        batch.create_index(batch.f("ix_alert_rule_project"), ["project"])
        batch.create_foreign_key(
            batch.f("fk_alert_rule_project_project"), "project", ["project"], ["name"], ondelete="CASCADE"
        )
        batch.drop_constraint(batch.f("ck_alert_rule_scope"), type_="check")
        batch.create_check_constraint(batch.f("ck_alert_rule_scope"), "scope IN ('global', 'project', 'run')")
        batch.create_check_constraint(
            batch.f("ck_alert_rule_project_scope"), "(scope = 'project') = (project IS NOT NULL)"
        )


def downgrade() -> None:
    op.execute("DELETE FROM alert_rule WHERE scope = 'project'")  # a project's rules have no place before projects
    with op.batch_alter_table("alert_rule") as batch:
        batch.drop_constraint(batch.f("ck_alert_rule_project_scope"), type_="check")
        batch.drop_constraint(batch.f("ck_alert_rule_scope"), type_="check")
        batch.create_check_constraint(batch.f("ck_alert_rule_scope"), "scope IN ('global', 'run')")
        batch.drop_constraint(batch.f("fk_alert_rule_project_project"), type_="foreignkey")
        batch.drop_index(batch.f("ix_alert_rule_project"))
        batch.drop_column("project")
    for table in TABLES:
        with op.batch_alter_table(table) as batch:
            batch.drop_constraint(batch.f(f"fk_{table}_project_project"), type_="foreignkey")
            batch.drop_index(batch.f(f"ix_{table}_project"))
            batch.drop_column("project")
    op.drop_index(op.f("ix_project_member_person"), table_name="project_member")
    op.drop_table("project_member")
    op.drop_table("project")
