"""task input, tool call id, token totals and finish time of delegated tasks

Revision ID: 0002
Revises: 0001
Create Date: 2026-12-02 14:40:00
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0002"
down_revision: str | None = "0001"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("a2a_task_sessions") as batch:
        batch.add_column(sa.Column("input", sa.Text(), server_default="", nullable=False))
        batch.add_column(sa.Column("tool_call_id", sa.String(length=128), nullable=True))
        batch.add_column(sa.Column("input_tokens", sa.Integer(), server_default=sa.text("0"), nullable=False))
        batch.add_column(sa.Column("output_tokens", sa.Integer(), server_default=sa.text("0"), nullable=False))
        batch.add_column(sa.Column("finished_at", sa.DateTime(timezone=True), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("a2a_task_sessions") as batch:
        batch.drop_column("finished_at")
        batch.drop_column("output_tokens")
        batch.drop_column("input_tokens")
        batch.drop_column("tool_call_id")
        batch.drop_column("input")
