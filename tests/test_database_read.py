"""`Database.read`: reads that do not queue behind the writer, and cannot write (core/db.py).

On SQLite the units of work of `Database.session` take turns; a read has a snapshot of its own
(WAL) and goes past a writer that holds the turn. On both databases a read refuses to write.
"""

from __future__ import annotations

import asyncio
from datetime import timedelta

import pytest
from sqlmodel import select

from core.a2a import api_keys
from core.auth import accounts
from core.services import Services
from models import ApiKey, User, utcnow


async def test_a_read_does_not_wait_for_a_writer_and_sees_only_what_was_committed(services: Services) -> None:
    db = services.db
    async with db.session() as s:
        await accounts.create_user(s, username="alice", password="alice-password")
    writing, finish = asyncio.Event(), asyncio.Event()

    async def writer() -> None:
        async with db.session() as s:
            await accounts.create_user(s, username="bob", password="bob-password")  # committed at the end
            user = (await s.exec(select(User).where(User.username == "alice"))).one()
            user.username = "alice-renamed"
            s.add(user)
            await s.flush()  # holds SQLite's write lock (and, on SQLite, the process's turn)
            writing.set()
            await finish.wait()
            await s.commit()

    task = asyncio.create_task(writer())
    await asyncio.wait_for(writing.wait(), 10)
    async with asyncio.timeout(5):  # on SQLite, a `session` here would wait until the writer ends
        async with db.read() as r:
            names = set((await r.exec(select(User.username))).all())
    assert "alice" in names and "alice-renamed" not in names  # not the writer's uncommitted change
    finish.set()
    await task
    async with db.read() as r:
        names = set((await r.exec(select(User.username))).all())
    assert {"alice-renamed", "bob"} <= names


async def test_a_read_refuses_to_write(services: Services) -> None:
    async with services.db.read() as r:
        r.add(User(username="mallory", password_hash="x"))
        with pytest.raises(RuntimeError, match="Database.session"):
            await r.flush()
    async with services.db.read() as r:
        assert (await r.exec(select(User).where(User.username == "mallory"))).first() is None


async def test_a_read_can_be_opened_inside_a_unit_of_work(services: Services) -> None:
    async with services.db.session() as s:
        s.add(User(username="carol", password_hash="x"))
        await s.flush()  # written, not committed
        async with asyncio.timeout(5), services.db.read() as r:  # a nested `session` raises instead
            assert (await r.exec(select(User).where(User.username == "carol"))).first() is None


async def test_a_key_is_checked_with_a_read_and_its_use_noted_at_most_once_a_minute(services: Services) -> None:
    db = services.db
    async with db.session() as s:
        alice = await accounts.create_user(s, username="alice", password="alice-password")
        row, key = await api_keys.create_key(s, user_id=alice.id, name="bot")
    assert row.last_used_at is None

    first = await api_keys.authenticate(db, key)
    assert first is not None and first.user_id == alice.id
    async with db.read() as r:
        noted = (await r.get(ApiKey, row.id)).last_used_at
    assert noted is not None

    # Within the resolution, a check is a read only: while a writer holds the turn it still answers.
    hold, release = asyncio.Event(), asyncio.Event()

    async def writer() -> None:
        async with db.session() as s:
            await accounts.create_user(s, username="bob", password="bob-password")
            hold.set()
            await release.wait()
            await s.commit()

    task = asyncio.create_task(writer())
    await asyncio.wait_for(hold.wait(), 10)
    async with asyncio.timeout(5):
        assert (await api_keys.authenticate(db, key)) is not None
    release.set()
    await task
    async with db.read() as r:
        assert (await r.get(ApiKey, row.id)).last_used_at == noted

    async with db.session() as s:  # a minute later, the use is noted again
        stored = await s.get(ApiKey, row.id)
        stored.last_used_at = utcnow() - api_keys.LAST_USED_RESOLUTION - timedelta(seconds=1)
        s.add(stored)
        await s.commit()
    assert await api_keys.authenticate(db, key) is not None
    async with db.read() as r:
        assert (await r.get(ApiKey, row.id)).last_used_at > noted

    assert await api_keys.authenticate(db, key + "x") is None
    async with db.session() as s:
        assert await api_keys.revoke_key(s, user_id=alice.id, key_id=row.id)
    assert await api_keys.authenticate(db, key) is None
