"""Issue 39: the admin area: accounts an admin disabled, and the global model connection set in the browser.

Revision ID: 0011
Revises: 0010
Create Date: 2026-12-07 00:20:00
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0011"
down_revision: str | None = "0010"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("users") as batch:
        batch.add_column(sa.Column("disabled_at", sa.DateTime(timezone=True), nullable=True))
    op.create_table(
        "model_connection",
        sa.Column("id", sa.Integer(), primary_key=True),
        sa.Column("default_model", sa.String(255), nullable=True),
        sa.Column("api_base", sa.String(1000), nullable=True),
        sa.Column("api_key", sa.Text(), nullable=True),
        sa.Column("updated_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("updated_by", sa.Integer(), nullable=True),
    )


def downgrade() -> None:
    op.drop_table("model_connection")
    with op.batch_alter_table("users") as batch:
        batch.drop_column("disabled_at")
