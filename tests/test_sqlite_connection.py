"""SQLite through the async engine with one trip to the driver's thread per statement (core/sqlite_connection.py)."""

from __future__ import annotations

import asyncio
import sqlite3
from collections import Counter
from pathlib import Path

import pytest
from sqlalchemy import text
from sqlalchemy.engine import make_url
from sqlmodel import select

from core.db import Database
from core.sqlite_connection import OneTripConnection, async_creator
from models import User


@pytest.fixture
async def db(tmp_path: Path):
    database = Database(f"sqlite:///{tmp_path / 'app.db'}")
    database.migrate()
    yield database
    await database.close()


@pytest.fixture
def trips(monkeypatch: pytest.MonkeyPatch) -> Counter:
    """Every trip to a connection's thread, by what it ran."""
    counted: Counter = Counter()
    real = OneTripConnection._execute

    async def counting(self, fn, *args, **kwargs):
        counted[getattr(fn, "__name__", repr(fn))] += 1
        return await real(self, fn, *args, **kwargs)

    monkeypatch.setattr(OneTripConnection, "_execute", counting)
    return counted


async def test_a_read_is_two_trips_and_a_write_one_per_statement_and_its_commit(db: Database, trips: Counter) -> None:
    async with db.session() as s:
        s.add(User(username="alice", password_hash="x"))
        await s.commit()
    trips.clear()
    async with db.read() as s:
        assert (await s.exec(select(User.username))).all() == ["alice"]
    # BEGIN travels with the SELECT; the session's rollback is the second trip; the pool's is none.
    assert trips == Counter({"_after_begin": 1, "rollback": 1})
    trips.clear()
    async with db.session() as s:
        user = (await s.exec(select(User).where(User.username == "alice"))).one()
        user.username = "alice-2"
        s.add(user)
        await s.commit()
    assert trips == Counter({"_after_begin": 1, "_execute_and_fetch": 1, "commit": 1})
    trips.clear()
    async with db.session() as s:  # a unit of work that never ran a statement sends nothing
        await s.commit()
    assert sum(trips.values()) == 0
    async with db.read() as s:
        assert (await s.exec(select(User.username))).all() == ["alice-2"]


async def test_a_rolled_back_unit_of_work_leaves_nothing_and_the_connection_goes_on(db: Database) -> None:
    async with db.session() as s:
        s.add(User(username="bob", password_hash="x"))
        await s.flush()
        await s.rollback()
    async with db.session() as s:
        assert (await s.exec(select(User).where(User.username == "bob"))).first() is None
        s.add(User(username="carol", password_hash="x"))
        await s.commit()
    async with db.read() as s:
        assert (await s.exec(select(User.username))).all() == ["carol"]


async def test_rows_counts_and_ids_are_the_drivers(tmp_path: Path) -> None:
    connect = async_creator(make_url(f"sqlite+aiosqlite:///{tmp_path / 'rows.db'}"), {"check_same_thread": False})
    connection = await connect()
    try:
        cursor = connection.cursor()
        await cursor.execute("CREATE TABLE t (id INTEGER PRIMARY KEY, name TEXT)")
        await cursor.executemany("INSERT INTO t (name) VALUES (?)", [("a",), ("b",), ("c",)])
        assert cursor.rowcount == 3
        await cursor.execute("INSERT INTO t (name) VALUES (?)", ("d",))
        assert cursor.lastrowid == 4 and cursor.description is None
        await cursor.execute("UPDATE t SET name = name || '!' WHERE id > ?", (2,))
        assert cursor.rowcount == 2
        await cursor.execute("SELECT id, name FROM t ORDER BY id")
        assert [d[0] for d in cursor.description] == ["id", "name"]
        assert await cursor.fetchone() == (1, "a")
        assert await cursor.fetchmany(2) == [(2, "b"), (3, "c!")]
        assert await cursor.fetchall() == [(4, "d!")]
        assert await cursor.fetchall() == [] and await cursor.fetchone() is None
        with pytest.raises(sqlite3.OperationalError, match="no such table"):
            await cursor.execute("SELECT * FROM missing")
    finally:
        await connection.close()


async def test_a_begin_that_cannot_take_the_write_lock_fails_its_first_statement(tmp_path: Path) -> None:
    path = tmp_path / "locked.db"
    other = sqlite3.connect(path, isolation_level=None)
    other.execute("PRAGMA journal_mode=WAL")
    other.execute("CREATE TABLE t (x INTEGER)")
    connection = await async_creator(make_url(f"sqlite+aiosqlite:///{path}"), {"check_same_thread": False})()
    try:
        cursor = connection.cursor()
        await cursor.execute("PRAGMA busy_timeout=0")
        other.execute("BEGIN IMMEDIATE")  # another process holds the write lock
        connection.begin_with_next_statement("BEGIN IMMEDIATE")
        with pytest.raises(sqlite3.OperationalError, match="locked"):
            await cursor.execute("INSERT INTO t VALUES (1)")
        await connection.rollback()  # nothing was opened: nothing to roll back
        other.execute("COMMIT")
        connection.begin_with_next_statement("BEGIN IMMEDIATE")
        await cursor.execute("INSERT INTO t VALUES (2)")
        await connection.commit()
        assert other.execute("SELECT x FROM t").fetchall() == [(2,)]
    finally:
        await connection.close()
        other.close()


async def test_an_in_memory_database_is_one_database_across_sessions() -> None:
    database = Database("sqlite://")
    async with database.engine.begin() as conn:
        await conn.execute(text("CREATE TABLE t (x INTEGER)"))
    async with database.session() as s:
        await s.exec(text("INSERT INTO t VALUES (7)"))  # type: ignore[call-overload]
        await s.commit()
    async with database.read() as s:
        assert (await s.exec(text("SELECT x FROM t"))).all() == [(7,)]  # type: ignore[call-overload]
    await database.close()


async def test_ending_a_transaction_whose_statement_was_cancelled_waits_for_that_statement(tmp_path: Path) -> None:
    # A cancelled statement still runs on the connection's thread, after whatever is ahead of it.
    # The rollback that follows must run after it too, or its transaction would stay open.
    connection = await async_creator(make_url(f"sqlite+aiosqlite:///{tmp_path / 'c.db'}"), {})()
    try:
        cursor = connection.cursor()
        await cursor.execute("CREATE TABLE t (x INTEGER)")
        slow = asyncio.ensure_future(
            connection.cursor().execute(
                "WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n WHERE i < 3000000) "
                "SELECT count(*) FROM n"
            )
        )
        await asyncio.sleep(0.01)  # the thread is busy with it
        connection.begin_with_next_statement("BEGIN IMMEDIATE")
        insert = asyncio.ensure_future(connection.cursor().execute("INSERT INTO t VALUES (1)"))
        await asyncio.sleep(0)
        insert.cancel()
        await connection.rollback()
        await slow
        assert not connection._connection.in_transaction
        await cursor.execute("SELECT count(*) FROM t")
        assert await cursor.fetchall() == [(0,)]
    finally:
        await connection.close()
