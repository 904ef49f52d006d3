"""SQLite for the async engine with one trip to the driver's thread per statement.

aiosqlite runs every call of the `sqlite3` API on its connection's thread and hands
the result back to the event loop. Through SQLAlchemy's adapter a statement makes four
such trips (open a cursor, execute, fetch the rows, close the cursor), and each trip
wakes the loop from another thread: on this project's two-CPU machine about 100 µs
apiece, so a read by primary key cost 1.3 ms of CPU, most of a chat or A2A turn's
database work (docs/ARCHITECTURE.md, "The streaming hot path").

`OneTripConnection` is aiosqlite's connection whose cursors do all four steps in one
trip: the statement runs, its rows are read and its cursor is closed on the driver's
thread, and the cursor the adapter holds serves the rows it already has. Everything
still runs on the one thread that owns the `sqlite3` connection, in order, as before;
what changes is how often the loop is woken. Rows are always read in full at execute
time, which is what the adapter's default (buffered) cursor does anyway.

`async_creator(url, connect_args)` is the engine's `async_creator` (SQLAlchemy's
documented hook for supplying the driver connection). Like SQLAlchemy's own adapter,
which reaches into aiosqlite's `_tx` and `_conn`, this uses aiosqlite's `_execute`
(the one way onto its thread), so aiosqlite is pinned to 0.22 in pyproject.toml.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Awaitable, Callable, Iterable, Sequence
from functools import partial
from typing import Any

import aiosqlite
from sqlalchemy.dialects.sqlite.aiosqlite import SQLiteDialect_aiosqlite
from sqlalchemy.engine import URL

__all__ = ["OneTripConnection", "async_creator"]


class OneTripCursor:
    """A cursor whose `execute` runs, fetches and closes in one trip to the connection's thread."""

    arraysize = 1

    def __init__(self, connection: OneTripConnection) -> None:
        self._connection = connection
        self.description: Any = None
        self.rowcount = -1
        self.lastrowid: int | None = None
        self._rows: list[Any] = []

    async def execute(self, sql: str, parameters: Iterable[Any] | None = None) -> OneTripCursor:
        """Run one statement and keep its rows."""
        result = await self._connection.run(_execute_and_fetch, sql, () if parameters is None else parameters)
        self.description, self.rowcount, self.lastrowid, self._rows = result
        return self

    async def executemany(self, sql: str, parameters: Iterable[Iterable[Any]]) -> OneTripCursor:
        """Run one statement for each set of parameters (no rows)."""
        result = await self._connection.run(_execute_many, sql, parameters)
        self.description, self.rowcount, self.lastrowid, self._rows = result
        return self

    async def fetchone(self) -> Any:
        """The next row kept from `execute`, or None."""
        return self._rows.pop(0) if self._rows else None

    async def fetchmany(self, size: int | None = None) -> Sequence[Any]:
        """Up to `size` (default `arraysize`) of the rows kept from `execute`."""
        count = self.arraysize if size is None else size
        rows, self._rows = self._rows[:count], self._rows[count:]
        return rows

    async def fetchall(self) -> Sequence[Any]:
        """The rows kept from `execute` that were not fetched yet."""
        rows, self._rows = self._rows, []
        return rows

    async def close(self) -> None:
        """Nothing to release on the driver's thread: its cursor was closed after `execute`."""
        self._rows = []

    async def __aenter__(self) -> OneTripCursor:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.close()


class OneTripConnection(aiosqlite.Connection):
    """aiosqlite's connection (one thread owns the `sqlite3` connection) with `OneTripCursor` cursors.

    A transaction's `BEGIN` (`begin_with_next_statement`) travels with its first statement,
    and a commit or rollback with no transaction open costs no trip (SQLAlchemy's pool rolls
    back every connection it gets back, after the session has already ended its transaction).
    Whether one is open is only asked when the thread has finished every trip handed to it:
    a statement whose caller was cancelled still runs there, and may yet open one.
    """

    _pending_begin: str | None = None
    _trips_sent = 0  # counted on the event loop's thread
    _trips_done = 0  # counted on the connection's thread

    async def _execute(self, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        """The one way onto the connection's thread (aiosqlite's), counting the trips there and back."""
        self._trips_sent += 1
        # aiosqlite leaves `_execute` unannotated.
        return await super()._execute(self._counted, fn, *args, **kwargs)  # type: ignore[no-untyped-call]

    def _counted(self, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        try:
            return fn(*args, **kwargs)
        finally:
            self._trips_done += 1

    def cursor(self) -> OneTripCursor:  # type: ignore[override]
        """A cursor; opening it costs no trip (the adapter enters it with `async with`)."""
        return OneTripCursor(self)

    def begin_with_next_statement(self, begin: str) -> None:
        """Open a transaction with `begin` ("BEGIN", "BEGIN IMMEDIATE") just before the next statement runs.

        Its failure (another process holding the write lock past `busy_timeout`) is that statement's.
        A transaction ended before any statement ran was empty: it is never sent.
        """
        self._pending_begin = begin

    def run(self, function: Callable[..., Any], *args: Any) -> Awaitable[Any]:
        """`function(sqlite3_connection, *args)` on the connection's thread (after a pending `BEGIN`)."""
        begin, self._pending_begin = self._pending_begin, None
        if begin is None:
            return self._execute(function, self._conn, *args)
        return self._execute(_after_begin, begin, function, self._conn, *args)

    async def commit(self) -> None:
        """Commit the open transaction, if there is one."""
        if self._ends_nothing():
            return
        await super().commit()

    async def rollback(self) -> None:
        """Roll back the open transaction, if there is one."""
        if self._ends_nothing():
            return
        await super().rollback()

    def _ends_nothing(self) -> bool:
        """Whether ending the transaction now has nothing to end (then it costs no trip)."""
        empty = self._pending_begin is not None
        self._pending_begin = None
        if self._trips_done != self._trips_sent:
            return False  # a trip is still on its way (a cancelled caller's): end after it, in order
        return empty or (self._connection is not None and not self._connection.in_transaction)


def _after_begin(begin: str, function: Callable[..., Any], connection: sqlite3.Connection, *args: Any) -> Any:
    connection.execute(begin)
    return function(connection, *args)


def _execute_and_fetch(connection: sqlite3.Connection, sql: str, parameters: Any) -> tuple[Any, int, Any, list[Any]]:
    cursor = connection.cursor()
    try:
        cursor.execute(sql, parameters)
        rows = cursor.fetchall() if cursor.description else []
        return cursor.description, cursor.rowcount, cursor.lastrowid, rows
    finally:
        cursor.close()


def _execute_many(connection: sqlite3.Connection, sql: str, parameters: Any) -> tuple[Any, int, Any, list[Any]]:
    cursor = connection.cursor()
    try:
        cursor.executemany(sql, parameters)
        return cursor.description, cursor.rowcount, cursor.lastrowid, []
    finally:
        cursor.close()


def async_creator(url: URL, connect_args: dict[str, Any]) -> Callable[[], Awaitable[OneTripConnection]]:
    """The engine's `async_creator`: a new `OneTripConnection` to the database of `url`.

    The `sqlite3.connect` arguments are the ones SQLAlchemy's aiosqlite dialect would pass
    for `url`, updated with `connect_args`.
    """
    args, kwargs = SQLiteDialect_aiosqlite(dbapi=SQLiteDialect_aiosqlite.import_dbapi()).create_connect_args(url)
    kwargs = {**kwargs, **connect_args}

    async def connect() -> OneTripConnection:
        connection = OneTripConnection(partial(sqlite3.connect, *args, **kwargs), iter_chunk_size=64)
        connection._thread.daemon = True  # as SQLAlchemy does for aiosqlite: never holds up the interpreter's exit
        await connection  # starts its thread and opens the database; the result is `connection` itself
        return connection

    return connect
