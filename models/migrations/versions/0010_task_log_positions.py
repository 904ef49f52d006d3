"""Issue 35: a broker task's end in one row, and its readers' positions instead of the outbox.

A broker task's end was written to two tables (`broker_tasks` and its result in `broker_outbox`). The
result's text now lives on the task's row (`result`), written with its end in one statement, and the
seed's injects reader remembers how far it has published the task (`published_position`: the result's
position once Redis has it), which is what `broker_outbox.sent_at` said. The app's chat inbox reads the
same injects by position: each note of a background task keeps its position (`inject_position`), unique
per session and task, so an inject read twice (a restart, a new reader, a Redis cut) is saved once, found
by its position rather than by its text.

Existing results move onto their task's row (the newest one of a task that had several); existing result
notes take the result's position (the oldest of a session and task that had several, which the unique
index allows only once).

Revision ID: 0010
Revises: 0009
Create Date: 2026-12-06 21:00:00
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0010"
down_revision: str | None = "0009"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

RESULT_POSITION = 2_147_483_647  # core.broker.inject.RESULT_POSITION: a task's result comes after all else
HAS_POSITION = sa.text("inject_position IS NOT NULL")


def upgrade() -> None:
    op.add_column("broker_tasks", sa.Column("result", sa.Text(), nullable=True))
    op.add_column(
        "broker_tasks", sa.Column("published_position", sa.Integer(), server_default=sa.text("0"), nullable=False)
    )
    op.execute(
        f"""
        UPDATE broker_tasks SET
            result = (SELECT o.text FROM broker_outbox o WHERE o.task_id = broker_tasks.id ORDER BY o.id DESC LIMIT 1),
            published_position = CASE WHEN EXISTS (
                SELECT 1 FROM broker_outbox o WHERE o.task_id = broker_tasks.id AND o.sent_at IS NOT NULL
            ) THEN {RESULT_POSITION} ELSE 0 END
        WHERE EXISTS (SELECT 1 FROM broker_outbox o WHERE o.task_id = broker_tasks.id)
        """
    )
    op.drop_index(op.f("ix_broker_outbox_task_id"), table_name="broker_outbox")
    op.drop_index("idx_broker_outbox_sent", table_name="broker_outbox")
    op.drop_table("broker_outbox")

    op.add_column("agent_messages", sa.Column("inject_position", sa.Integer(), nullable=True))
    op.execute(
        f"""
        UPDATE agent_messages SET inject_position = {RESULT_POSITION}
        WHERE id IN (
            SELECT MIN(id) FROM agent_messages
            WHERE inject_mode = 'auto' AND a2a_task_id IS NOT NULL
            GROUP BY session_id, a2a_task_id
        )
        """
    )
    op.create_index(
        "idx_agent_messages_inject_position",
        "agent_messages",
        ["session_id", "a2a_task_id", "inject_position"],
        unique=True,
        sqlite_where=HAS_POSITION,
        postgresql_where=HAS_POSITION,
    )


def downgrade() -> None:
    op.drop_index("idx_agent_messages_inject_position", table_name="agent_messages")
    with op.batch_alter_table("agent_messages") as batch:
        batch.drop_column("inject_position")
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
    op.execute(
        f"""
        INSERT INTO broker_outbox (task_id, chat_agent_id, chat_id, text, mode, created_at, sent_at)
        SELECT id, chat_agent_id, chat_id, result, 'auto', finished_at,
               CASE WHEN published_position = {RESULT_POSITION} THEN finished_at ELSE NULL END
        FROM broker_tasks WHERE result IS NOT NULL AND finished_at IS NOT NULL
        """
    )
    with op.batch_alter_table("broker_tasks") as batch:
        batch.drop_column("published_position")
        batch.drop_column("result")
