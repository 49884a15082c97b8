"""Owners for datasets, room for issuer-keyed identities, and the accounts that name them.

- `dataset.owner`: who uploaded it (NULL for datasets uploaded before datasets had owners: only an
  admin may delete those).
- `run.owner` widened: a team-mode identity is `<issuer>#<subject>`, longer than an e-mail.
- `account`: one row per identity seen signing in, with the name to show and the e-mail only
  when the provider verified it.

Revision ID: 0003
Revises: 0002
Create Date: 2026-12-01
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0003"
down_revision: str | None = "0002"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

OWNER_LEN = 400


def upgrade() -> None:
    with op.batch_alter_table("run") as batch:
        batch.alter_column("owner", existing_type=sa.String(100), type_=sa.String(OWNER_LEN), existing_nullable=False)
    with op.batch_alter_table("dataset") as batch:
        batch.add_column(sa.Column("owner", sa.String(OWNER_LEN), nullable=True))
    op.create_index("ix_dataset_owner", "dataset", ["owner"])
    op.create_table(
        "account",
        sa.Column("key", sa.String(OWNER_LEN), nullable=False),
        sa.Column("name", sa.String(200), nullable=False),
        sa.Column("email", sa.String(320), nullable=True),
        sa.Column("seen_at", sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("key", name="pk_account"),
    )


def downgrade() -> None:
    op.drop_table("account")
    op.drop_index("ix_dataset_owner", table_name="dataset")
    with op.batch_alter_table("dataset") as batch:
        batch.drop_column("owner")
    # run.owner stays 400 wide: the owners stored since (<issuer>#<subject>) would not fit in 100, and the
    # older code reads a wider column unchanged.
