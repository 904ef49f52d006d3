"""The broker's tasks and the outbox of their results, so a restart loses no `auto` inject

Revision ID: 0005
Revises: 0004
Create Date: 2026-12-03 13:30:00
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0005"
down_revision: str | None = "0004"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "broker_tasks",
        sa.Column("id", sa.String(length=64), nullable=False),
        sa.Column("instance", sa.String(length=255), nullable=False),
        sa.Column("owner", sa.String(length=64), nullable=False),
        sa.Column("target_agent", sa.String(length=256), nullable=False),
        sa.Column("agent_name", sa.String(length=200), nullable=False),
        sa.Column("chat_agent_id", sa.JSON(), nullable=False),
        sa.Column("chat_id", sa.String(length=256), nullable=False),
        sa.Column("session_id", sa.String(length=64), nullable=True),
        sa.Column("task", sa.Text(), server_default="", nullable=False),
        sa.Column("state", sa.String(length=24), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("finished_at", sa.DateTime(timezone=True), nullable=True),
        sa.PrimaryKeyConstraint("id"),
    )
    op.create_index("idx_broker_tasks_running", "broker_tasks", ["instance", "finished_at"], unique=False)
    op.create_table(
        "broker_outbox",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("task_id", sa.String(length=64), nullable=False),
        sa.Column("chat_agent_id", sa.JSON(), nullable=False),
        sa.Column("chat_id", sa.String(length=256), nullable=False),
        sa.Column("text", sa.Text(), nullable=False),
        sa.Column("mode", sa.String(length=8), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("sent_at", sa.DateTime(timezone=True), nullable=True),
        sa.ForeignKeyConstraint(["task_id"], ["broker_tasks.id"], ondelete="CASCADE"),
        sa.PrimaryKeyConstraint("id"),
    )
    op.create_index("idx_broker_outbox_sent", "broker_outbox", ["sent_at"], unique=False)
    op.create_index(op.f("ix_broker_outbox_task_id"), "broker_outbox", ["task_id"], unique=False)


def downgrade() -> None:
    op.drop_index(op.f("ix_broker_outbox_task_id"), table_name="broker_outbox")
    op.drop_index("idx_broker_outbox_sent", table_name="broker_outbox")
    op.drop_table("broker_outbox")
    op.drop_index("idx_broker_tasks_running", table_name="broker_tasks")
    op.drop_table("broker_tasks")
