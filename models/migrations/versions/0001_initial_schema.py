"""initial schema

Revision ID: 0001
Revises:
Create Date: 2026-12-02 10:25:21.312835
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0001"
down_revision: str | None = None
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "agents",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("slug", sa.String(length=64), nullable=False),
        sa.Column("name", sa.String(length=128), nullable=False),
        sa.Column("description", sa.Text(), nullable=False),
        sa.Column("system_prompt", sa.Text(), nullable=False),
        sa.Column("model", sa.String(length=255), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("updated_at", sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("id"),
        sa.UniqueConstraint("slug"),
    )
    op.create_table(
        "users",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("username", sa.String(length=64), nullable=False),
        sa.Column("password_hash", sa.String(length=255), nullable=True),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("id"),
        sa.UniqueConstraint("username"),
    )
    op.create_table(
        "agent_sessions",
        sa.Column("id", sa.String(length=64), nullable=False),
        sa.Column("user_id", sa.Integer(), nullable=False),
        sa.Column("agent_id", sa.Integer(), nullable=False),
        sa.Column("title", sa.String(length=200), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("updated_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("deleted_at", sa.DateTime(timezone=True), nullable=True),
        sa.ForeignKeyConstraint(["agent_id"], ["agents.id"], ondelete="CASCADE"),
        sa.ForeignKeyConstraint(["user_id"], ["users.id"], ondelete="CASCADE"),
        sa.PrimaryKeyConstraint("id"),
    )
    with op.batch_alter_table("agent_sessions", schema=None) as batch_op:
        batch_op.create_index("idx_agent_sessions_user_updated", ["user_id", "updated_at"], unique=False)

    op.create_table(
        "agent_tools",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("agent_id", sa.Integer(), nullable=False),
        sa.Column("tool_type", sa.String(length=64), nullable=False),
        sa.Column("config", sa.JSON(), nullable=False),
        sa.Column("enabled", sa.Boolean(), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.ForeignKeyConstraint(["agent_id"], ["agents.id"], ondelete="CASCADE"),
        sa.PrimaryKeyConstraint("id"),
        sa.UniqueConstraint("agent_id", "tool_type", name="uq_agent_tools_agent_type"),
    )
    op.create_table(
        "a2a_task_sessions",
        sa.Column("id", sa.String(length=64), nullable=False),
        sa.Column("session_id", sa.String(length=64), nullable=False),
        sa.Column("callee_agent_id", sa.Integer(), nullable=True),
        sa.Column("callee_agent_slug", sa.String(length=64), nullable=False),
        sa.Column("caller_user_id", sa.Integer(), nullable=True),
        sa.Column("caller_agent_id", sa.Integer(), nullable=True),
        sa.Column("caller_session_id", sa.String(length=64), nullable=True),
        sa.Column("parent_task_id", sa.String(length=64), nullable=True),
        sa.Column("recursion_depth", sa.Integer(), nullable=False),
        sa.Column("state", sa.String(length=24), nullable=False),
        sa.Column("error", sa.Text(), nullable=True),
        sa.Column("visible_in_sidebar", sa.Integer(), server_default=sa.text("0"), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("updated_at", sa.DateTime(timezone=True), nullable=False),
        sa.ForeignKeyConstraint(["callee_agent_id"], ["agents.id"], ondelete="SET NULL"),
        sa.ForeignKeyConstraint(["caller_agent_id"], ["agents.id"], ondelete="SET NULL"),
        sa.ForeignKeyConstraint(["caller_user_id"], ["users.id"], ondelete="SET NULL"),
        sa.ForeignKeyConstraint(["session_id"], ["agent_sessions.id"], ondelete="CASCADE"),
        sa.PrimaryKeyConstraint("id"),
    )
    with op.batch_alter_table("a2a_task_sessions", schema=None) as batch_op:
        batch_op.create_index("idx_a2a_task_sessions_caller_session", ["caller_session_id"], unique=False)
        batch_op.create_index("idx_a2a_task_sessions_session", ["session_id"], unique=False)

    op.create_table(
        "agent_messages",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("session_id", sa.String(length=64), nullable=False),
        sa.Column("role", sa.String(length=16), nullable=False),
        sa.Column("content", sa.Text(), nullable=False),
        sa.Column("model_id", sa.String(length=255), nullable=True),
        sa.Column("input_tokens", sa.Integer(), nullable=True),
        sa.Column("output_tokens", sa.Integer(), nullable=True),
        sa.Column("sort_order", sa.Integer(), nullable=False),
        sa.Column("tool_calls", sa.JSON(), nullable=True),
        sa.Column("tool_results", sa.JSON(), nullable=True),
        sa.Column("status", sa.String(length=16), server_default="complete", nullable=False),
        sa.Column("error", sa.Text(), nullable=True),
        sa.Column("source", sa.String(length=10), server_default="user", nullable=False),
        sa.Column("a2a_task_id", sa.String(length=64), nullable=True),
        sa.Column("caller_agent_id", sa.Integer(), nullable=True),
        sa.Column("caller_session_id", sa.String(length=64), nullable=True),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.ForeignKeyConstraint(["caller_agent_id"], ["agents.id"], ondelete="SET NULL"),
        sa.ForeignKeyConstraint(["session_id"], ["agent_sessions.id"], ondelete="CASCADE"),
        sa.PrimaryKeyConstraint("id"),
    )
    with op.batch_alter_table("agent_messages", schema=None) as batch_op:
        batch_op.create_index("idx_agent_messages_session_order", ["session_id", "sort_order"], unique=False)
        batch_op.create_index("idx_agent_messages_source", ["source"], unique=False)


def downgrade() -> None:
    with op.batch_alter_table("agent_messages", schema=None) as batch_op:
        batch_op.drop_index("idx_agent_messages_source")
        batch_op.drop_index("idx_agent_messages_session_order")

    op.drop_table("agent_messages")
    with op.batch_alter_table("a2a_task_sessions", schema=None) as batch_op:
        batch_op.drop_index("idx_a2a_task_sessions_session")
        batch_op.drop_index("idx_a2a_task_sessions_caller_session")

    op.drop_table("a2a_task_sessions")
    op.drop_table("agent_tools")
    with op.batch_alter_table("agent_sessions", schema=None) as batch_op:
        batch_op.drop_index("idx_agent_sessions_user_updated")

    op.drop_table("agent_sessions")
    op.drop_table("users")
    op.drop_table("agents")
