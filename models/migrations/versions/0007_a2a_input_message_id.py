"""The A2A client's own `messageId` of a task's input message.

`a2a_task_sessions.input_message_id` keeps the `messageId` an A2A client sent with the
message that started the task, so the task's history shows it back unchanged (issue 16).
Empty for delegations started in the app (their history uses `<taskId>-in`).

Revision ID: 0007
Revises: 0006
Create Date: 2026-12-03 14:00:00
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0007"
down_revision: str | None = "0006"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("a2a_task_sessions") as batch:
        batch.add_column(sa.Column("input_message_id", sa.String(length=255), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("a2a_task_sessions") as batch:
        batch.drop_column("input_message_id")
