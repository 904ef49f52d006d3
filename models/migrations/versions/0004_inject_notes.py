"""Inject notes in chat sessions; the general assistant may dispatch to broker agents.

`agent_messages.inject_mode` marks a message that arrived as an `inject_system_message`
(seed 003): 'delay' (progress, kept quietly) or 'auto' (a result the agent announced).
An existing general assistant gets the `a2a-dispatch` tool that new installs seed.

Revision ID: 0004
Revises: 0003
Create Date: 2026-12-02 19:30:00
"""

from collections.abc import Sequence
from datetime import UTC, datetime

import sqlalchemy as sa
from alembic import op

revision: str = "0004"
down_revision: str | None = "0003"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

_tools = sa.table(
    "agent_tools",
    sa.column("agent_id", sa.Integer()),
    sa.column("tool_type", sa.String()),
    sa.column("config", sa.JSON()),
    sa.column("enabled", sa.Boolean()),
    sa.column("created_at", sa.DateTime(timezone=True)),
)


def upgrade() -> None:
    with op.batch_alter_table("agent_messages") as batch:
        batch.add_column(sa.Column("inject_mode", sa.String(length=8), nullable=True))
    conn = op.get_bind()
    general = conn.execute(sa.text("SELECT id FROM agents WHERE slug = 'general-assistant'")).scalar()
    if general is not None:
        has_tool = conn.execute(
            sa.text("SELECT 1 FROM agent_tools WHERE agent_id = :id AND tool_type = 'a2a-dispatch'"), {"id": general}
        ).first()
        if has_tool is None:
            op.bulk_insert(
                _tools,
                [
                    {
                        "agent_id": general,
                        "tool_type": "a2a-dispatch",
                        "config": {},
                        "enabled": True,
                        "created_at": datetime.now(UTC),
                    }
                ],
            )


def downgrade() -> None:
    op.execute("DELETE FROM agent_tools WHERE tool_type = 'a2a-dispatch'")
    with op.batch_alter_table("agent_messages") as batch:
        batch.drop_column("inject_mode")
