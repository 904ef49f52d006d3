"""The broker's durable part: dispatched tasks and the outbox of their results, in the database.

Seed 003 promises a chat system the `auto` inject of every task it dispatched. Redis alone cannot keep
that promise across a stop: a result queued while Redis is down lives in memory, and a task cut by
kill -9 never ends. So a task is written when it is accepted, and its end is written together with its
result (one transaction); the pipelined sender marks results sent once Redis has them. At the next
start (`interrupt_running`, then `pending`), the tasks this instance left running end with "interrupted
by a server restart", and every result Redis never got is sent. In a cluster, the reaper ends the
tasks of a replica that is gone the same way while serving (`adopt_running`).

Writes are grouped: the tasks accepted and ended while one transaction commits are written together
in the next one (one commit for many concurrent tasks, as the pipelined sender does for Redis), and
each caller waits for the commit that holds its row.

Progress (`delay`) is not kept: it is throttled chatter that a restart may lose. The app's own chat is a
consumer too: a result whose note never reached its chat session (the process stopped between the two)
is delivered again, and the session's saved note is the proof of delivery, so nothing is announced twice.
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

from core.broker.inject import AUTO, Inject
from core.db import Database
from models import AgentMessage, BrokerOutboxInject, BrokerTaskRecord, utcnow

KEEP_FINISHED = timedelta(days=7)  # finished tasks and sent results are deleted after this
INTERRUPTED = "The task was interrupted by a server restart."


@dataclass(frozen=True, slots=True)
class PendingInject:
    """A result to send again at start: to Redis when `to_redis`, to the app's chat when `session_id`."""

    inject: Inject
    to_redis: bool


class BrokerStore:
    """Reads and writes `broker_tasks` and `broker_outbox` for one app instance."""

    def __init__(self, db: Database, instance: str) -> None:
        self.db = db
        self.instance = instance
        self._added: list[tuple[dict[str, Any], asyncio.Future[int | None]]] = []
        self._ended: list[tuple[dict[str, Any], dict[str, Any], asyncio.Future[int | None]]] = []
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

    async def finish_task(self, task_id: str, state: str, result: Inject, *, sent: bool) -> int:
        """Write the task's end and its result in one transaction; the outbox id of the result.

        `sent` is true when there is no Redis to send to (the in-process bus is the only transport).
        """
        now = utcnow()
        end = {"id": task_id, "state": state, "finished_at": now}
        out = {
            "task_id": task_id,
            "chat_agent_id": result.agent_id,
            "chat_id": result.chat_id,
            "text": result.text,
            "mode": AUTO,
            "created_at": now,
            "sent_at": now if sent else None,
        }
        future = asyncio.get_running_loop().create_future()
        self._ended.append((end, out, future))
        outbox_id = await self._committed(future)
        assert outbox_id is not None
        return outbox_id

    async def _committed(self, future: asyncio.Future[int | None]) -> int | None:
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
                    outbox_ids: list[int] = []
                    if ended:
                        await s.exec(update(BrokerTaskRecord), params=[end for end, _, _ in ended])
                        rows = await s.exec(
                            insert(BrokerOutboxInject).returning(
                                col(BrokerOutboxInject.id), sort_by_parameter_order=True
                            ),
                            params=[out for _, out, _ in ended],
                        )
                        outbox_ids = list(rows.scalars())
                    await s.commit()
            except Exception as exc:  # every caller of this round hears it (a dispatch is then refused)
                for future in [f for _, f in added] + [f for _, _, f in ended]:
                    if not future.done():
                        future.set_exception(exc)
                continue
            for _, future in added:
                if not future.done():
                    future.set_result(None)
            for (_, _, future), outbox_id in zip(ended, outbox_ids, strict=True):
                if not future.done():
                    future.set_result(outbox_id)

    async def mark_sent(self, outbox_ids: list[int]) -> None:
        """Redis has these results."""
        async with self.db.session() as s:
            await s.exec(
                update(BrokerOutboxInject).where(col(BrokerOutboxInject.id).in_(outbox_ids)).values(sent_at=utcnow())
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

    async def interrupt_running(self, *, sent: bool, adopt: AbstractSet[str] = frozenset()) -> int:
        """At start: end the tasks this instance left running, each with its terminal result; how many.

        `adopt`: instances that are gone for good (cluster mode: replicas no longer running); their
        running tasks end the same way and become this instance's, so `pending` sends their results.
        Also deletes finished tasks and sent results older than `KEEP_FINISHED`.
        """
        async with self.db.session() as s:
            now = utcnow()
            ended = await self._end_running(s, {self.instance, *adopt}, now, sent=sent)
            old = now - KEEP_FINISHED
            await s.exec(delete(BrokerOutboxInject).where(col(BrokerOutboxInject.sent_at) < old))
            await s.exec(
                delete(BrokerTaskRecord).where(
                    col(BrokerTaskRecord.finished_at) < old,
                    ~exists().where(col(BrokerOutboxInject.task_id) == BrokerTaskRecord.id),
                )
            )
            await s.commit()
        return len(ended)

    async def adopt_running(self, gone: set[str], *, sent: bool) -> list[Inject]:
        """While serving (the cluster's reaper): end the running tasks of gone instances as at start.

        They become this instance's, like `adopt` of `interrupt_running`; returns their results, to send
        now (the caller publishes them; `pending` would send them again only if Redis never got them).
        """
        if not gone:
            return []
        async with self.db.session() as s:
            ended = await self._end_running(s, gone, utcnow(), sent=sent)
            await s.flush()  # the outbox ids
            results = [
                Inject(
                    agent_id=out.chat_agent_id,
                    chat_id=out.chat_id,
                    text=out.text,
                    mode=AUTO,
                    task_id=task.id,
                    session_id=task.session_id,
                    outbox_id=out.id,
                )
                for task, out in ended
            ]
            await s.commit()
        return results

    async def _end_running(
        self, s: AsyncSession, instances: set[str], now: datetime, *, sent: bool
    ) -> list[tuple[BrokerTaskRecord, BrokerOutboxInject]]:
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
        ended = []
        for task in running:
            task.state, task.finished_at, task.instance = "failed", now, self.instance
            s.add(task)
            out = BrokerOutboxInject(
                task_id=task.id,
                chat_agent_id=task.chat_agent_id,
                chat_id=task.chat_id,
                text=f"[{task.agent_name}] {INTERRUPTED}",
                mode=AUTO,
                created_at=now,
                sent_at=now if sent else None,
            )
            s.add(out)
            ended.append((task, out))
        return ended

    async def pending(self, *, redis: bool) -> list[PendingInject]:
        """The results to send again at start, oldest first.

        With `redis`: every result of this instance's tasks that Redis never got. And for the app's own
        chat, whatever Redis does: every result whose note is not in its chat session.
        """
        query = (
            select(BrokerOutboxInject, BrokerTaskRecord)
            .join(BrokerTaskRecord, col(BrokerTaskRecord.id) == BrokerOutboxInject.task_id)
            .where(BrokerTaskRecord.instance == self.instance)
            .order_by(col(BrokerOutboxInject.id))
        )
        note_saved = exists().where(
            col(AgentMessage.session_id) == BrokerTaskRecord.session_id,
            col(AgentMessage.a2a_task_id) == BrokerTaskRecord.id,
            col(AgentMessage.inject_mode) == AUTO,
        )
        unsent = col(BrokerOutboxInject.sent_at).is_(None)
        undelivered = col(BrokerTaskRecord.session_id).is_not(None) & ~note_saved
        async with self.db.session() as s:
            rows = (await s.exec(query.where(unsent | undelivered if redis else undelivered))).all()
        return [
            PendingInject(
                Inject(
                    agent_id=out.chat_agent_id,
                    chat_id=out.chat_id,
                    text=out.text,
                    mode=AUTO,
                    task_id=task.id,
                    session_id=task.session_id,
                    outbox_id=out.id,
                ),
                to_redis=redis and out.sent_at is None,
            )
            for out, task in rows
        ]
