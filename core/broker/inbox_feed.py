"""Cluster mode: the app's inbox reads the injects of every replica from one Redis stream.

A task dispatched from a chat may run on any replica (its agent's socket is
where it is), and its injects must reach that chat once. Every replica's
`InjectPublisher` adds the injects of the app's own chats to the stream
`<prefix>broker:inbox`; one replica at a time consumes it, the one that holds
the PostgreSQL advisory lock `INBOX_LOCK_KEY` (on a connection of its own:
when that replica stops or dies, the server drops the lock and another replica
takes over within `ELECTION_S`).

The consumer reads in the consumer group `inbox` under one fixed consumer name,
so a new leader first reads what the last one had read but not acknowledged
(`XREADGROUP ... 0`), then new entries (`>`). Each entry is handed to
`ChatInbox`, which acknowledges it (`XACK`) once its note is saved, and skips
an entry read again whose position its session already holds: each note is
saved once, and each result announced once. docs/ARCHITECTURE.md, "Cluster: the broker
across replicas".
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from typing import Any

from sqlalchemy import text

from core.aio import cancel_and_wait
from core.broker.inbox import ChatInbox
from core.broker.inject import Inject
from core.db import Database

log = logging.getLogger(__name__)

INBOX_LOCK_KEY = 180_003  # PostgreSQL advisory lock of the inbox consumer (the number space of core/db.py's keys)
GROUP = "inbox"
CONSUMER = "leader"  # one name for whichever replica leads: its pending entries pass to the next leader
ELECTION_S = 2.0  # a replica that is not the leader tries to become it this often
BLOCK_MS = 2_000
BATCH = 100


def inbox_stream_key(prefix: str) -> str:
    """The stream every replica adds the app's own chats' injects to."""
    return f"{prefix}broker:inbox"


class InboxStreamFeed:
    """Feeds `ChatInbox` from the inbox stream while this replica leads (see the module docstring)."""

    def __init__(self, db: Database, redis_url: str, prefix: str) -> None:
        self.db = db
        self.redis_url = redis_url
        self.stream = inbox_stream_key(prefix)
        self.inbox: ChatInbox | None = None
        self.leading = False
        self.read = 0
        self.acked = 0
        self._redis: Any = None
        self._task: asyncio.Task[None] | None = None
        self._in_hand: set[str] = set()  # handed to the inbox, not acknowledged yet: never handed twice

    async def start(self, inbox: ChatInbox) -> None:
        """Take part in the election; feed `inbox` while leading."""
        import redis.asyncio as redis

        self.inbox = inbox
        self._redis = redis.Redis.from_url(
            self.redis_url, socket_connect_timeout=5.0, socket_timeout=(BLOCK_MS / 1000) + 10
        )
        self._task = asyncio.get_running_loop().create_task(self._run(), name="inbox stream feed")

    async def stop(self) -> None:
        """Stop reading (unacknowledged entries stay pending for the next leader) and leave the election."""
        await cancel_and_wait(self._task)
        self._task = None
        if self._redis is not None:
            with contextlib.suppress(Exception):
                await self._redis.aclose()
            self._redis = None

    async def acknowledge(self, injects: list[Inject]) -> None:
        """Their notes are saved: the entries are done."""
        ids = [i.stream_id for i in injects if i.stream_id is not None]
        self._in_hand.difference_update(ids)
        if ids and self._redis is not None:
            self.acked += await self._redis.xack(self.stream, GROUP, *ids)

    async def _run(self) -> None:
        while True:
            try:
                # Not `Database.advisory_lock`: the leader checks the lock's own connection before each read.
                async with self.db.engine.connect() as conn:
                    leader = await conn.scalar(text("SELECT pg_try_advisory_lock(:key)"), {"key": INBOX_LOCK_KEY})
                    await conn.commit()  # the lock is the session's; no transaction stays open
                    if leader:
                        try:
                            await self._lead(conn)
                        finally:
                            self.leading = False
                            with contextlib.suppress(Exception):
                                await asyncio.shield(
                                    conn.execute(text("SELECT pg_advisory_unlock(:key)"), {"key": INBOX_LOCK_KEY})
                                )
                                await asyncio.shield(conn.commit())
            except asyncio.CancelledError:
                raise
            except Exception:
                log.warning("the inbox stream consumer stopped; trying again", exc_info=True)
            await asyncio.sleep(ELECTION_S)

    async def _lead(self, conn: Any) -> None:
        log.info("this replica now reads the inbox stream %s", self.stream)
        self.leading = True
        with contextlib.suppress(Exception):  # BUSYGROUP: it exists
            await self._redis.xgroup_create(self.stream, GROUP, id="0", mkstream=True)
        await self._read(conn, "0")  # what the last leader read and did not acknowledge
        while True:
            await self._read(conn, ">")

    async def _read(self, conn: Any, start: str) -> None:
        """One pass: from `start` ("0": every pending entry, in batches; ">": new ones, one block)."""
        cursor = start
        while True:
            await conn.execute(text("SELECT 1"))  # still leading: the lock's connection is alive
            await conn.commit()
            reply = await self._redis.xreadgroup(
                GROUP, CONSUMER, {self.stream: cursor}, count=BATCH, block=BLOCK_MS if start == ">" else None
            )
            entries = reply[0][1] if reply else []
            for entry_id, fields in entries:
                stream_id = entry_id.decode() if isinstance(entry_id, bytes) else str(entry_id)
                if start != ">":
                    cursor = stream_id
                if stream_id in self._in_hand:
                    continue
                inject = Inject.from_stream(stream_id, fields or {})
                self.read += 1
                if inject is None or inject.session_id is None or self.inbox is None:
                    await self._redis.xack(self.stream, GROUP, stream_id)  # not one of ours: drop it
                    continue
                self._in_hand.add(stream_id)
                self.inbox.receive(inject)
            if start == ">" or len(entries) < BATCH:
                return
