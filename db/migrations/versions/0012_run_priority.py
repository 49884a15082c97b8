"""A fair queue: `run.queue` (the queue its spec sends it to, core.names.queue_of) and `run.priority` (-1 low,
0 normal, 1 high). A worker's message is a token for its queue: the worker claims the best queued run of that queue
(db/queue_order.py), which it must find among the queued runs by queue, hence the column and its index; the
owners' recent GPU time is read from the runs finished lately, hence the index on finished_at. Existing
runs get their queue from their stored spec.

Revision ID: 0012
Revises: 0011
Create Date: 2026-12-03
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

from core.names import queue_of

revision: str = "0012"
down_revision: str | None = "0011"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

BATCH = 1000


def upgrade() -> None:
    with op.batch_alter_table("run") as batch:
        batch.add_column(sa.Column("queue", sa.String(16), nullable=True))
        batch.add_column(sa.Column("priority", sa.Integer(), server_default="0", nullable=False))
        batch.create_index("ix_run_queue_order", ["status", "queue", "priority", "owner", "created_at"], unique=False)
        batch.create_index("ix_run_finished_at", ["finished_at"], unique=False)
    conn = op.get_bind()
    run = sa.table("run", sa.column("id", sa.String), sa.column("spec", sa.JSON), sa.column("queue", sa.String))
    rows = conn.execute(sa.select(run.c.id, run.c.spec)).all()
    by_queue: dict[str, list[str]] = {}
    for run_id, spec in rows:
        by_queue.setdefault(queue_of(spec), []).append(run_id)
    for queue, ids in by_queue.items():
        for i in range(0, len(ids), BATCH):
            conn.execute(sa.update(run).where(run.c.id.in_(ids[i : i + BATCH])).values(queue=queue))


def downgrade() -> None:
    with op.batch_alter_table("run") as batch:
        batch.drop_index("ix_run_finished_at")
        batch.drop_index("ix_run_queue_order")
        batch.drop_column("priority")
        batch.drop_column("queue")
