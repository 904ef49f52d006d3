"""Issue 36: files of chats and tasks.

`attachments` holds a file's owner, chat, name, type and size; `attachment_blobs` its bytes (in the
database, so every replica of a cluster reads them and a backup of the database has them). A message
names the files it carries in `agent_messages.attachments` (JSON: id, name, mime, size).

Revision ID: 0014
Revises: 0013
Create Date: 2026-12-07 00:10:00
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0014"
down_revision: str | None = "0013"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "attachments",
        sa.Column("id", sa.String(length=64), nullable=False),
        sa.Column("user_id", sa.Integer(), nullable=False),
        sa.Column("session_id", sa.String(length=64), nullable=True),
        sa.Column("task_id", sa.String(length=64), nullable=True),
        sa.Column("name", sa.String(length=255), nullable=False),
        sa.Column("mime", sa.String(length=255), nullable=False),
        sa.Column("size", sa.Integer(), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.ForeignKeyConstraint(["user_id"], ["users.id"], ondelete="CASCADE"),
        sa.ForeignKeyConstraint(["session_id"], ["agent_sessions.id"], ondelete="CASCADE"),
        sa.PrimaryKeyConstraint("id"),
    )
    op.create_index("idx_attachments_session", "attachments", ["session_id"], unique=False)
    op.create_table(
        "attachment_blobs",
        sa.Column("id", sa.String(length=64), nullable=False),
        sa.Column("data", sa.LargeBinary(), nullable=False),
        sa.ForeignKeyConstraint(["id"], ["attachments.id"], ondelete="CASCADE"),
        sa.PrimaryKeyConstraint("id"),
    )
    op.add_column("agent_messages", sa.Column("attachments", sa.JSON(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("agent_messages") as batch:
        batch.drop_column("attachments")
    op.drop_table("attachment_blobs")
    op.drop_index("idx_attachments_session", table_name="attachments")
    op.drop_table("attachments")
