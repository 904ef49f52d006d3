"""The SQL statements an app's engine runs while a block runs: each with the connection (unit of work) it ran on."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from sqlalchemy import event

from core.db import Database


@contextmanager
def recorded_statements(db: Database) -> Iterator[list[tuple[int, str]]]:
    """`(id of the connection, statement)` of every statement `db`'s engine runs inside the block, in order."""
    statements: list[tuple[int, str]] = []

    def record(conn: Any, cursor: Any, statement: str, *args: Any) -> None:
        statements.append((id(conn), statement))

    engine = db.engine.sync_engine
    event.listen(engine, "before_cursor_execute", record)
    try:
        yield statements
    finally:
        event.remove(engine, "before_cursor_execute", record)
