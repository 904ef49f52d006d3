"""Agents are edited in the app: model endpoint, key, sampling, soft delete; users carry an admin flag

`agents` gets `api_base`, `api_key` (sealed), `temperature`, `max_output_tokens` and
`deleted_at` (a deleted agent keeps its row, so its chats and audit records stay readable).
`users` gets `is_admin`; on an existing install the first account with a password becomes admin.

Revision ID: 0006
Revises: 0005
Create Date: 2026-12-04 10:00:00
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0006"
down_revision: str | None = "0005"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    # Plain ADD COLUMN (no batch): on SQLite a batch rebuild of `agents` would cascade into its chats.
    op.add_column("agents", sa.Column("api_base", sa.String(length=1000), nullable=True))
    op.add_column("agents", sa.Column("api_key", sa.Text(), nullable=True))
    op.add_column("agents", sa.Column("temperature", sa.Float(), nullable=True))
    op.add_column("agents", sa.Column("max_output_tokens", sa.Integer(), nullable=True))
    op.add_column("agents", sa.Column("deleted_at", sa.DateTime(timezone=True), nullable=True))
    op.add_column("users", sa.Column("is_admin", sa.Boolean(), server_default=sa.false(), nullable=False))
    op.execute(
        "UPDATE users SET is_admin = true WHERE id = (SELECT min(id) FROM users WHERE password_hash IS NOT NULL)"
    )


def downgrade() -> None:
    # SQLite 3.35+ drops a column in place (no table rebuild).
    op.drop_column("users", "is_admin")
    for column in ("deleted_at", "max_output_tokens", "temperature", "api_key", "api_base"):
        op.drop_column("agents", column)
