"""Issue 39: the price of each answer and of each delegated task, at LiteLLM's list prices.

`agent_messages.cost_usd` (one model call's) and `a2a_task_sessions.cost_usd` (the callee's run's),
both US dollars; NULL where the model has no price (the demo model, a model the list lacks, a remote agent).

Revision ID: 0012
Revises: 0011
Create Date: 2026-12-07 00:30:00
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0012"
down_revision: str | None = "0011"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("agent_messages") as batch:
        batch.add_column(sa.Column("cost_usd", sa.Float(), nullable=True))
    with op.batch_alter_table("a2a_task_sessions") as batch:
        batch.add_column(sa.Column("cost_usd", sa.Float(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("a2a_task_sessions") as batch:
        batch.drop_column("cost_usd")
    with op.batch_alter_table("agent_messages") as batch:
        batch.drop_column("cost_usd")
