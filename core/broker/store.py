"""The broker's durable part: dispatched tasks, each with its end and how far its readers got.

Seed 003 promises a chat system the `auto` inject of every task it dispatched. Redis alone cannot keep
that promise across a stop: a result queued while Redis is down lives in memory, and a task cut by
kill -9 never ends. So a task is written when it is accepted, and its end is written once, in its own
row: state, time and the result's text in one statement. The seed's injects reader keeps its position
there too (`published_position`, moved to the result once Redis has it). At the next start
(`interrupt_running`, then `pending`), the tasks this instance left running end with "interrupted by a
server restart", and every result Redis never got is sent. In a cluster, the reaper ends the tasks of a
replica that is gone the same way while serving (`adopt_running`).

Writes are grouped: the tasks accepted and ended while one transaction commits are written together
in the next one (one commit for many concurrent tasks, as the pipelined sender does for Redis), and
each caller waits for the commit that holds its row.

Progress (`delay`) is not kept: it is throttled chatter that a restart may lose. The app's own chat is
another reader: its position in a task is the positions of the notes saved in its session
(`AgentMessage.inject_position`), so a result whose note is not there yet (the process stopped between
the two) is delivered again, and saved once.
"""

from __future__ import annotations

import asyncio
from collections.abc import Set as AbstractSet
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import delete, exists, insert, update
from sqlmodel import col, select
from sqlmodel.ext.asyncio.session import AsyncSession

from core.broker.inject import AUTO, RESULT_POSITION, Inject
from core.db import Database
from models import AgentMessage, BrokerTaskRecord, utcnow

KEEP_FINISHED = timedelta(days=7)  # finished tasks whose result went out are deleted after this
INTERRUPTED = "The task was interrupted by a server restart."


@dataclass(frozen=True, slots=True)
class PendingInject:
    """A result to send again at start: to Redis when `to_redis`, to the app's chat when `session_id`."""

    inject: Inject
    to_redis: bool


def result_inject(task: BrokerTaskRecord) -> Inject:
    """A finished task's `auto` inject, read back from its row."""
    return Inject(
        agent_id=task.chat_agent_id,
        chat_id=task.chat_id,
        text=task.result or "",
        mode=AUTO,
        task_id=task.id,
        session_id=task.session_id,
    )


def _owed(*, redis: bool) -> Any:
    """The condition on a finished task's row that its result is still owed to a reader.

    The seed's injects reader (with `redis`) owes it until Redis has it; the app's chat inbox owes a result of
    its own dispatches until its position is in the chat session.
    """
    note_saved = exists().where(
        col(AgentMessage.session_id) == BrokerTaskRecord.session_id,
        col(AgentMessage.a2a_task_id) == BrokerTaskRecord.id,
        col(AgentMessage.inject_position) == RESULT_POSITION,
    )
    undelivered = col(BrokerTaskRecord.session_id).is_not(None) & ~note_saved
    unpublished = col(BrokerTaskRecord.published_position) < RESULT_POSITION
    return col(BrokerTaskRecord.result).is_not(None) & ((unpublished | undelivered) if redis else undelivered)


class BrokerStore:
    """Reads and writes `broker_tasks` for one app instance."""

    def __init__(self, db: Database, instance: str) -> None:
        self.db = db
        self.instance = instance
        self._added: list[tuple[dict[str, Any], asyncio.Future[None]]] = []
        self._ended: list[tuple[dict[str, Any], asyncio.Future[None]]] = []
        self._writer: asyncio.Task[None] | None = None

    async def add_task(
        self,
        *,
        task_id: str,
        owner: str,
        target_agent: str,
        agent_name: str,
        chat_agent_id: Any,
        chat_id: str,
        session_id: str | None,
        task: str,
    ) -> None:
        """Record an accepted task (before the dispatch is acknowledged)."""
        row = {
            "id": task_id,
            "instance": self.instance,
            "owner": owner,
            "target_agent": target_agent,
            "agent_name": agent_name,
            "chat_agent_id": chat_agent_id,
            "chat_id": chat_id,
            "session_id": session_id,
            "task": task,
            "state": "submitted",
            "created_at": utcnow(),
        }
        future = asyncio.get_running_loop().create_future()
        self._added.append((row, future))
        await self._committed(future)

    async def finish_task(self, task_id: str, state: str, result: str, *, sent: bool) -> None:
        """Write the task's end with its result's text, once, in its row.

        `sent` is true when there is no Redis to send to (the in-process bus is the only transport): the
        result counts as published.
        """
        end = {
            "id": task_id,
            "state": state,
            "finished_at": utcnow(),
            "result": result,
            "published_position": RESULT_POSITION if sent else 0,
        }
        future = asyncio.get_running_loop().create_future()
        self._ended.append((end, future))
        await self._committed(future)

    async def _committed(self, future: asyncio.Future[None]) -> None:
        if self._writer is None or self._writer.done():
            self._writer = asyncio.get_running_loop().create_task(self._write(), name="broker store writer")
        # Shielded: a caller that is canceled (a task stopped mid-dispatch) leaves the batch alone.
        return await asyncio.shield(future)

    async def _write(self) -> None:
        """Write what is queued, one transaction per round, until the queue stays empty."""
        while self._added or self._ended:
            added, self._added = self._added, []
            ended, self._ended = self._ended, []
            try:
                async with self.db.session() as s:
                    if added:
                        await s.exec(insert(BrokerTaskRecord), params=[row for row, _ in added])
                    if ended:
                        await s.exec(update(BrokerTaskRecord), params=[end for end, _ in ended])
                    await s.commit()
            except Exception as exc:  # every caller of this round hears it (a dispatch is then refused)
                for _, future in added + ended:
                    if not future.done():
                        future.set_exception(exc)
                continue
            for _, future in added + ended:
                if not future.done():
                    future.set_result(None)

    async def mark_published(self, task_ids: list[str]) -> None:
        """Redis has these tasks' results: the injects reader's position moves to the result."""
        async with self.db.session() as s:
            await s.exec(
                update(BrokerTaskRecord)
                .where(col(BrokerTaskRecord.id).in_(task_ids))
                .values(published_position=RESULT_POSITION)
            )
            await s.commit()

    async def running_instances(self, *, chat_id: str | None = None, owner: str | None = None) -> set[str]:
        """The instances (replicas) that have running tasks (of that chat, dispatched by that owner)."""
        query = select(BrokerTaskRecord.instance).where(col(BrokerTaskRecord.finished_at).is_(None)).distinct()
        if chat_id is not None:
            query = query.where(BrokerTaskRecord.chat_id == chat_id)
        if owner is not None:
            query = query.where(BrokerTaskRecord.owner == owner)
        async with self.db.session() as s:
            return set((await s.exec(query)).all())

    async def owing_instances(self) -> set[str]:
        """The instances (replicas) with running tasks, or with results a reader has not got yet."""
        query = (
            select(BrokerTaskRecord.instance)
            .where(col(BrokerTaskRecord.finished_at).is_(None) | _owed(redis=True))
            .distinct()
        )
        async with self.db.session() as s:
            return set((await s.exec(query)).all())

    async def interrupt_running(self, *, sent: bool, adopt: AbstractSet[str] = frozenset()) -> int:
        """At start: end the tasks this instance left running, each with its terminal result; how many.

        `adopt`: instances that are gone for good (cluster mode: replicas no longer running); their
        running tasks end the same way and, with their finished tasks whose results are still owed, become
        this instance's, so `pending` sends those results. Also deletes the tasks that finished more than
        `KEEP_FINISHED` ago and whose result went out.
        """
        async with self.db.session() as s:
            now = utcnow()
            ended = await self._end_running(s, {self.instance, *adopt}, now, sent=sent)
            if adopt:
                await self._take_over_owed(s, set(adopt), redis=not sent)
            await s.exec(
                delete(BrokerTaskRecord).where(
                    col(BrokerTaskRecord.finished_at) < now - KEEP_FINISHED,
                    col(BrokerTaskRecord.published_position) == RESULT_POSITION,
                )
            )
            await s.commit()
        return len(ended)

    async def adopt_running(self, gone: set[str], *, sent: bool) -> list[PendingInject]:
        """While serving (the cluster's reaper): end the running tasks of gone instances as at start.

        They, and the gone instances' finished tasks whose results are still owed, become this instance's,
        like `adopt` of `interrupt_running`; returns those results, to send now (the caller publishes them;
        `pending` would send them again only if a reader still lacked one at the next start).
        """
        if not gone:
            return []
        async with self.db.session() as s:
            tasks = await self._end_running(s, gone, utcnow(), sent=sent)
            tasks += await self._take_over_owed(s, gone, redis=not sent)
            results = [
                PendingInject(result_inject(task), to_redis=not sent and task.published_position < RESULT_POSITION)
                for task in tasks
            ]
            await s.commit()
        return results

    async def _take_over_owed(self, s: AsyncSession, gone: set[str], *, redis: bool) -> list[BrokerTaskRecord]:
        """Make the finished tasks of `gone` instances whose results are still owed this instance's, in `s`.

        A replica killed between a task's end and its note (or while Redis was down) left them; no one else
        would send them. Rows another transaction holds are skipped, as in `_end_running`.
        """
        owed = list(
            (
                await s.exec(
                    select(BrokerTaskRecord)
                    .where(
                        col(BrokerTaskRecord.instance).in_(gone),
                        col(BrokerTaskRecord.finished_at).is_not(None),
                        _owed(redis=redis),
                    )
                    .with_for_update(skip_locked=True)
                )
            ).all()
        )
        for task in owed:
            task.instance = self.instance
            s.add(task)
        return owed

    async def _end_running(
        self, s: AsyncSession, instances: set[str], now: datetime, *, sent: bool
    ) -> list[BrokerTaskRecord]:
        """End the running tasks of `instances` as failed (interrupted), each with its result, in session `s`.

        Rows another transaction holds are skipped (PostgreSQL `FOR UPDATE SKIP LOCKED`): a replica starting
        up and the reaper may adopt the same gone replica's tasks at once, and each task ends once.
        """
        running = list(
            (
                await s.exec(
                    select(BrokerTaskRecord)
                    .where(col(BrokerTaskRecord.instance).in_(instances), col(BrokerTaskRecord.finished_at).is_(None))
                    .with_for_update(skip_locked=True)
                )
            ).all()
        )
        for task in running:
            task.state, task.finished_at, task.instance = "failed", now, self.instance
            task.result = f"[{task.agent_name}] {INTERRUPTED}"
            task.published_position = RESULT_POSITION if sent else 0
            s.add(task)
        return running

    async def pending(self, *, redis: bool) -> list[PendingInject]:
        """The results to send again at start, oldest first.

        With `redis`: every result of this instance's tasks that Redis never got (the injects reader's
        position is short of it). And for the app's own chat, whatever Redis does: every result whose
        position is not in its chat session (the chat inbox's position is short of it).
        """
        query = (
            select(BrokerTaskRecord)
            .where(BrokerTaskRecord.instance == self.instance, _owed(redis=redis))
            .order_by(col(BrokerTaskRecord.finished_at), col(BrokerTaskRecord.id))
        )
        async with self.db.session() as s:
            rows = (await s.exec(query)).all()
        return [
            PendingInject(result_inject(task), to_redis=redis and task.published_position < RESULT_POSITION)
            for task in rows
        ]
