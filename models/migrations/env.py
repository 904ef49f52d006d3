"""Alembic environment: SQLModel metadata, URL from the app's settings (not alembic.ini)."""

from __future__ import annotations

from alembic import context
from sqlalchemy import Connection, engine_from_config, pool
from sqlmodel import SQLModel

import models  # noqa: F401  (registers the tables on SQLModel.metadata)

config = context.config
target_metadata = SQLModel.metadata


def _url() -> str:
    url = config.attributes.get("sync_url") or config.get_main_option("sqlalchemy.url")
    if url:
        return url
    from core.db import sync_url
    from core.settings import load_settings

    return sync_url(load_settings().database)


def run_migrations_offline() -> None:
    """Emit SQL to stdout instead of running it."""
    context.configure(url=_url(), target_metadata=target_metadata, literal_binds=True, compare_type=True)
    with context.begin_transaction():
        context.run_migrations()


def run_migrations_online() -> None:
    """Run against a live connection (given by the app, or made here)."""
    connection = config.attributes.get("connection")
    if connection is not None:
        _run(connection)
        return
    engine = engine_from_config({"sqlalchemy.url": _url()}, prefix="sqlalchemy.", poolclass=pool.NullPool)
    with engine.connect() as conn:
        _run(conn)


def _run(connection: Connection) -> None:
    context.configure(
        connection=connection,
        target_metadata=target_metadata,
        compare_type=True,
        render_as_batch=connection.dialect.name == "sqlite",  # SQLite ALTER needs batch mode
    )
    with context.begin_transaction():
        context.run_migrations()


if context.is_offline_mode():
    run_migrations_offline()
else:
    run_migrations_online()
