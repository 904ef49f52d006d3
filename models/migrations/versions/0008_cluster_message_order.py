"""Cluster (issue 18): a session's messages have distinct sort orders.

Several replicas may append to one session at once (a turn's answer on one, a
background task's note on another). `core/chat/sessions.py` `add_messages`
locks the session's row before it reads the highest sort order; this unique
index is the guarantee behind that lock. Sessions that already hold equal sort
orders (written concurrently before this migration) are renumbered first,
keeping their order (sort order, then id).

Revision ID: 0008
Revises: 0007
Create Date: 2026-12-03 16:30:00
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0008"
down_revision: str | None = "0007"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    bind = op.get_bind()
    duplicated = (
        bind.execute(
            sa.text("SELECT session_id FROM agent_messages GROUP BY session_id, sort_order HAVING COUNT(*) > 1")
        )
        .scalars()
        .all()
    )
    for session_id in dict.fromkeys(duplicated):
        ids = (
            bind.execute(
                sa.text("SELECT id FROM agent_messages WHERE session_id = :s ORDER BY sort_order, id"),
                {"s": session_id},
            )
            .scalars()
            .all()
        )
        for order, message_id in enumerate(ids, start=1):
            bind.execute(
                sa.text("UPDATE agent_messages SET sort_order = :o WHERE id = :i"), {"o": order, "i": message_id}
            )
    with op.batch_alter_table("agent_messages") as batch:
        batch.drop_index("idx_agent_messages_session_order")
        batch.create_index("idx_agent_messages_session_order", ["session_id", "sort_order"], unique=True)


def downgrade() -> None:
    with op.batch_alter_table("agent_messages") as batch:
        batch.drop_index("idx_agent_messages_session_order")
        batch.create_index("idx_agent_messages_session_order", ["session_id", "sort_order"], unique=False)
