"""Issue 36: A2A push notifications, served (callers' configs per task) and used (remote tasks ending by push).

Revision ID: 0013
Revises: 0012
Create Date: 2026-12-07 00:30:00
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0013"
down_revision: str | None = "0012"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "a2a_push_configs",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("task_id", sa.String(length=64), nullable=False),
        sa.Column("user_id", sa.Integer(), nullable=False),
        sa.Column("config_id", sa.String(length=128), nullable=False),
        sa.Column("url", sa.Text(), nullable=False),
        sa.Column("token", sa.Text(), nullable=True),
        sa.Column("auth_scheme", sa.String(length=64), nullable=True),
        sa.Column("auth_credentials", sa.Text(), nullable=True),
        sa.Column("deliveries", sa.Integer(), server_default=sa.text("0"), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.ForeignKeyConstraint(["task_id"], ["a2a_task_sessions.id"], ondelete="CASCADE"),
        sa.ForeignKeyConstraint(["user_id"], ["users.id"], ondelete="CASCADE"),
        sa.PrimaryKeyConstraint("id"),
        sa.UniqueConstraint("task_id", "user_id", "config_id", name="uq_a2a_push_configs_task_user_config"),
    )
    op.create_index("idx_a2a_push_configs_task", "a2a_push_configs", ["task_id"], unique=False)
    op.create_table(
        "a2a_remote_push_waits",
        sa.Column("id", sa.String(length=64), nullable=False),
        sa.Column("task_id", sa.String(length=64), nullable=False),
        sa.Column("remote_agent_id", sa.String(length=64), nullable=False),
        sa.Column("remote_task_id", sa.String(length=255), nullable=True),
        sa.Column("token_hash", sa.String(length=64), nullable=False),
        sa.Column("state", sa.String(length=24), nullable=False),
        sa.Column("answer", sa.Text(), nullable=True),
        sa.Column("error", sa.Text(), nullable=True),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("finished_at", sa.DateTime(timezone=True), nullable=True),
        sa.ForeignKeyConstraint(["task_id"], ["a2a_task_sessions.id"], ondelete="CASCADE"),
        sa.PrimaryKeyConstraint("id"),
    )
    op.create_index("idx_a2a_remote_push_waits_state", "a2a_remote_push_waits", ["state"], unique=False)


def downgrade() -> None:
    op.drop_index("idx_a2a_remote_push_waits_state", table_name="a2a_remote_push_waits")
    op.drop_table("a2a_remote_push_waits")
    op.drop_index("idx_a2a_push_configs_task", table_name="a2a_push_configs")
    op.drop_table("a2a_push_configs")
