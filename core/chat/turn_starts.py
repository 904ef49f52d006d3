"""What a user's turn saves as it starts, and the new messages of turns that start together, written together.

`ChatEngine._start_users_turn` reads the chat, claims its turn and reads the agent, history and tools,
then hands the write to `TurnStarts.save`: the user's message and the turn's draft (`rewind`), in a unit
of work that holds only the writes.

The new messages of the turns that start while a write is on its way wait for it and are written together
in the next one, as `DraftWriter` writes the drafts. The first start after a quiet spell is written at once.
If such a batch fails (a chat deleted in between, say), each of its starts is written again on its own, so
only the one at fault fails.

On SQLite the units of work of the process take turns (`Database.session`), and under load each
statement waits for the busy event loop to come back to it: at 100 sends at once a trip to SQLite's
thread took p50 2-4 ms and p90 5-10 ms (0.12 ms idle), so a send held the writer for 20-30 ms and
the sends were accepted one after the other, the last after 3-5 s (issue 38, item 2; bench/README.md).
There a batch is one read of the chats' highest positions, their rows, one UPDATE of the chats (run for
each), one commit, however many turns start.

On PostgreSQL a start alone is its own unit: in a cluster with a per-user limit the user's lock, the chat's
UPDATE that also counts the user's running turns (`RunningTurnsLimit`), the INSERT. A batch takes the users'
locks (in one round trip), counts their running turns in one statement, then writes every chat's rows with
one UPDATE run for each (one round trip) and one INSERT: 6 round trips with its BEGIN and COMMIT however many
turns start, where each start alone is 5, and the starts of one user wait for each other's locks (issue 41:
a cluster replica's turn starts cost twice one process's, which batches them on SQLite).

Rewinds (regenerate, edit and send again) delete rows as well, and are rare: they keep their own unit.
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass
from typing import Any

from sqlmodel import col, func, select
from sqlmodel.ext.asyncio.session import AsyncSession

from core.chat import rewind
from core.chat import running_turns as running_turns_store
from core.chat import sessions as sessions_store
from core.chat.errors import TooManyRunningTurnsError
from core.chat.turns import limit_message
from core.db import RUNNING_WORK_LOCK_KEY, Database
from models import Agent, AgentMessage

__all__ = ["RunningTurnsLimit", "TurnStarts", "append_to_chats"]

log = logging.getLogger(__name__)


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


@dataclass(frozen=True, slots=True)
class _Start:
    """A new message's rows waiting to be written with others (`TurnStarts`), within `limit` if any."""

    session_id: str
    messages: list[dict[str, Any]]
    limit: RunningTurnsLimit | None
    saved: asyncio.Future[list[AgentMessage]]


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
    """Saves what turns start with; new messages that come together go in one unit of work (SQLite, PostgreSQL).

    Args:
        db: the database.
    """

    def __init__(self, db: Database) -> None:
        self.db = db
        self.batched = db.dialect in ("sqlite", "postgresql")
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
        # SQLite counts no limit in a batch (no cluster runs on it: the process's claims count its turns).
        if self.batched and isinstance(prepare, rewind.NewMessage) and (limit is None or self.db.dialect != "sqlite"):
            rows = await self._together(session_id, prepare.rows(agent), limit)
            return prepare.prepared(history, rows)
        async with self.db.session() as s:
            if limit is not None:
                await limit.lock(s)
            return await prepare(s, session_id, agent, history, limit)

    def _together(
        self, session_id: str, messages: list[dict[str, Any]], limit: RunningTurnsLimit | None
    ) -> asyncio.Future[list[AgentMessage]]:
        loop = asyncio.get_running_loop()
        saved: asyncio.Future[list[AgentMessage]] = loop.create_future()
        self._pending.append(_Start(session_id, messages, limit, saved))
        if self._writer is None or self._writer.done():
            self._writer = loop.create_task(self._write(), name="save turn starts")
        return saved

    async def _write(self) -> None:
        batch: list[_Start] = []
        try:
            while self._pending:
                batch, self._pending = self._pending, []
                if len(batch) == 1 and self.db.dialect == "postgresql":  # its own unit: the count rides on the UPDATE
                    await self._each_alone(batch)
                    continue
                try:
                    async with self.db.session() as s:
                        outcomes = await self._unit(s, batch)
                        await s.commit()
                except Exception:
                    if len(batch) > 1:
                        log.warning("writing %d turn starts together failed; writing each on its own", len(batch))
                    await self._each_alone(batch)
                    continue
                for start, outcome in zip(batch, outcomes, strict=True):
                    if start.saved.done():
                        continue
                    if isinstance(outcome, Exception):
                        start.saved.set_exception(outcome)
                    else:
                        start.saved.set_result(outcome)
        finally:  # canceled (the app stops): no start waits for a write that will not come
            for start in [*batch, *self._pending]:
                if not start.saved.done():
                    start.saved.set_exception(RuntimeError("the app stopped before this message was saved"))
            self._pending = []

    async def _unit(self, s: AsyncSession, batch: list[_Start]) -> list[list[AgentMessage] | Exception]:
        """The batch's writes in `s`: each start's rows, or why it was refused (its user's limit)."""
        if self.db.dialect != "postgresql":  # SQLite: no cluster, so no limit counted here
            return list(await append_to_chats(s, [(start.session_id, start.messages) for start in batch]))
        # PostgreSQL: the users' locks (in the order of their ids, as every unit takes them), then one count of their
        # running turns (after the locks: it sees every start that held them before), then the writes.
        limits = {start.limit.user_id: start.limit for start in batch if start.limit is not None}
        running: dict[int, int] = {}
        if limits:
            await self.db.lock_for_transaction(s, RUNNING_WORK_LOCK_KEY, *sorted(limits))
            running = await running_turns_store.count_users_running_turns(s, user_ids=sorted(limits))
        outcomes: list[list[AgentMessage] | Exception] = []
        accepted: list[tuple[str, list[dict[str, Any]]]] = []
        for start in batch:
            if start.limit is not None:
                count = running.get(start.limit.user_id, 0)
                try:
                    start.limit(count)
                except TooManyRunningTurnsError as exc:
                    outcomes.append(exc)
                    continue
                running[start.limit.user_id] = count + 1  # this start's draft counts for the next
            accepted.append((start.session_id, start.messages))
            outcomes.append([])
        written = iter(await sessions_store.append_to_locked_chats(s, accepted) if accepted else [])
        return [outcome if isinstance(outcome, Exception) else next(written) for outcome in outcomes]

    async def _each_alone(self, batch: list[_Start]) -> None:
        for start in batch:
            try:
                async with self.db.session() as s:
                    if start.limit is not None:
                        await start.limit.lock(s)
                    written = await sessions_store.add_messages(
                        s, session_id=start.session_id, messages=start.messages, check=start.limit
                    )
            except Exception as exc:
                if not start.saved.done():
                    start.saved.set_exception(exc)
            else:
                if not start.saved.done():
                    start.saved.set_result(written)
