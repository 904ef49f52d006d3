"""Issue 34: indexes of running work, for the per-user limits.

With accounts, every task start counts the user's running tasks
(`a2a_task_sessions` in state `submitted` or `working`), and in a cluster every
turn start counts the user's running turns (their `streaming` drafts in
`agent_messages`); deleting an agent looks for drafts of its chats. Both are
partial indexes over the running rows only, so they stay as small as the
running work, however many finished rows the tables hold.

Revision ID: 0009
Revises: 0008
Create Date: 2026-12-06 05:30:00
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0009"
down_revision: str | None = "0008"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

STREAMING = sa.text("status = 'streaming'")
RUNNING = sa.text("state IN ('submitted', 'working')")


def upgrade() -> None:
    op.create_index(
        "idx_agent_messages_streaming",
        "agent_messages",
        ["session_id"],
        sqlite_where=STREAMING,
        postgresql_where=STREAMING,
    )
    op.create_index(
        "idx_a2a_task_sessions_running",
        "a2a_task_sessions",
        ["caller_user_id"],
        sqlite_where=RUNNING,
        postgresql_where=RUNNING,
    )


def downgrade() -> None:
    op.drop_index("idx_a2a_task_sessions_running", table_name="a2a_task_sessions")
    op.drop_index("idx_agent_messages_streaming", table_name="agent_messages")
