"""What a user's turn saves as it starts, and on SQLite the new messages of turns that start together, written together.

`ChatEngine._start_users_turn` reads the chat, claims its turn and reads the agent, history and tools,
then hands the write to `TurnStarts.save`: the user's message and the turn's draft (`rewind`), in a unit
of work that holds only the writes.

On SQLite the units of work of the process take turns (`Database.session`), and under load each
statement waits for the busy event loop to come back to it: at 100 sends at once a trip to SQLite's
thread took p50 2-4 ms and p90 5-10 ms (0.12 ms idle), so a send held the writer for 20-30 ms and
the sends were accepted one after the other, the last after 3-5 s (issue 38, item 2; bench/README.md).
So there the new messages of the turns that start while a write is on its way wait for it and are
written together in the next one, as `DraftWriter` writes the drafts: one read of the chats' highest
positions, their rows, one UPDATE of the chats (run for each), one commit, however many turns start.
The first start after a quiet spell is written at once. If such a batch fails (a chat deleted in
between, say), each of its starts is written again on its own, so only the one at fault fails.

Elsewhere each start is its own unit of work: on PostgreSQL writers do not take turns (the chat's row is
locked for its highest position, `sessions.append_messages`), and in a cluster with a per-user limit
the count of running turns belongs in the start's own transaction (`RunningTurnsLimit`). Rewinds
(regenerate, edit and send again) delete rows as well, and are rare: they keep their own unit too.
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass
from typing import Any

from sqlmodel import col, func, select
from sqlmodel.ext.asyncio.session import AsyncSession

from core.chat import rewind
from core.chat import sessions as sessions_store
from core.chat.errors import TooManyRunningTurnsError
from core.chat.turns import limit_message
from core.db import RUNNING_WORK_LOCK_KEY, Database
from models import Agent, AgentMessage

__all__ = ["RunningTurnsLimit", "TurnStarts", "append_to_chats"]

log = logging.getLogger(__name__)

_Start = tuple[str, list[dict[str, Any]], "asyncio.Future[list[AgentMessage]]"]


@dataclass(frozen=True, slots=True)
class RunningTurnsLimit:
    """A cluster's check, in the start's transaction, that `user_id` runs fewer than `limit` turns on any replica.

    The user's turns on every replica are their drafts in the database. The user's starts take turns: `lock`
    takes a lock held until the transaction commits its draft, and the count is read after it, so it sees
    every start before this one. The count comes back with the chat's UPDATE that the start runs anyway
    (`sessions.CountedCheck`: a statement that begins after the lock's, so its snapshot is taken after it):
    the lock, then the chat's UPDATE with the count, then the rows (issue 41: a count of its own was one
    statement and one round trip more; on SQLite, which no cluster runs on, it still is).
    """

    db: Database
    user_id: int
    limit: int

    async def lock(self, s: AsyncSession) -> None:
        """The user's starts (and delegated tasks' starts) one at a time, until `s` commits or rolls back."""
        await self.db.lock_for_transaction(s, RUNNING_WORK_LOCK_KEY, self.user_id)

    def __call__(self, count: int) -> None:
        """Refuse the start when the user already runs `limit` turns."""
        if count >= self.limit:
            raise TooManyRunningTurnsError(limit_message(self.limit))


async def append_to_chats(
    session: AsyncSession, chats: list[tuple[str, list[dict[str, Any]]]]
) -> list[list[AgentMessage]]:
    """`sessions.append_messages` for several chats at once (each chat once), in `session`'s transaction.

    One read of the chats' highest positions, their rows (flushed together), one UPDATE of the chats run
    for each (their time bumped, an untitled one titled after its first user message). For SQLite, whose
    one writer keeps the others out meanwhile (PostgreSQL locks each chat's row: `append_messages`).
    Returns each chat's rows; the caller commits.
    """
    ids = [session_id for session_id, _ in chats]
    highest: dict[str, int] = dict(
        (
            await session.exec(
                select(AgentMessage.session_id, func.max(AgentMessage.sort_order))
                .where(col(AgentMessage.session_id).in_(ids))
                .group_by(col(AgentMessage.session_id))
            )
        ).all()
    )
    written: list[list[AgentMessage]] = []
    chat_changes: list[dict[str, Any]] = []
    for session_id, messages in chats:
        order = highest.get(session_id) or 0
        rows = [
            AgentMessage(session_id=session_id, sort_order=order + i, **fields) for i, fields in enumerate(messages, 1)
        ]
        session.add_all(rows)
        written.append(rows)
        chat_changes.append(sessions_store.chat_bump(session_id, sessions_store.first_user_message(messages)))
    await session.flush()
    await session.exec(sessions_store.BUMP_CHAT, params=chat_changes)
    return written


class TurnStarts:
    """Saves what turns start with; on SQLite new messages that come together go in one unit of work.

    Args:
        db: the database.
    """

    def __init__(self, db: Database) -> None:
        self.db = db
        self.batched = db.dialect == "sqlite"
        self._pending: list[_Start] = []
        self._writer: asyncio.Task[None] | None = None

    async def save(
        self,
        prepare: rewind.PrepareTurn,
        session_id: str,
        agent: Agent,
        history: list[AgentMessage],
        *,
        limit: RunningTurnsLimit | None = None,
    ) -> rewind.PreparedTurn:
        """Save what `prepare` saves (committed) and return what the turn runs on, within `limit`, in its unit."""
        if self.batched and limit is None and isinstance(prepare, rewind.NewMessage):
            rows = await self._together(session_id, prepare.rows(agent))
            return prepare.prepared(history, rows)
        async with self.db.session() as s:
            if limit is not None:
                await limit.lock(s)
            return await prepare(s, session_id, agent, history, limit)

    def _together(self, session_id: str, messages: list[dict[str, Any]]) -> asyncio.Future[list[AgentMessage]]:
        loop = asyncio.get_running_loop()
        saved: asyncio.Future[list[AgentMessage]] = loop.create_future()
        self._pending.append((session_id, messages, saved))
        if self._writer is None or self._writer.done():
            self._writer = loop.create_task(self._write(), name="save turn starts")
        return saved

    async def _write(self) -> None:
        batch: list[_Start] = []
        try:
            while self._pending:
                batch, self._pending = self._pending, []
                try:
                    async with self.db.session() as s:
                        chats = [(session_id, messages) for session_id, messages, _ in batch]
                        rows = await append_to_chats(s, chats)
                        await s.commit()
                except Exception:
                    if len(batch) > 1:
                        log.warning("writing %d turn starts together failed; writing each on its own", len(batch))
                    await self._each_alone(batch)
                    continue
                for (_, _, saved), written in zip(batch, rows, strict=True):
                    if not saved.done():
                        saved.set_result(written)
        finally:  # canceled (the app stops): no start waits for a write that will not come
            for _, _, saved in [*batch, *self._pending]:
                if not saved.done():
                    saved.set_exception(RuntimeError("the app stopped before this message was saved"))
            self._pending = []

    async def _each_alone(self, batch: list[_Start]) -> None:
        for session_id, messages, saved in batch:
            try:
                async with self.db.session() as s:
                    written = await sessions_store.add_messages(s, session_id=session_id, messages=messages)
            except Exception as exc:
                if not saved.done():
                    saved.set_exception(exc)
            else:
                if not saved.done():
                    saved.set_result(written)
