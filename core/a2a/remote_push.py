"""Remote A2A tasks that end by push to this app (issue 36, `A2A_REMOTE_PUSH`): the webhook and the waits.

When a remote agent's card says `pushNotifications: true` and `A2A_REMOTE_PUSH` is on, a delegation to it
(`HttpRemoteAgent.stream`, `core/a2a/client.py`) holds no stream: its `SendMessage` asks the agent to answer
at once and to push the task's updates to `POST /a2a/push/{id}` with a token of its own
(`X-A2A-Notification-Token`). A wait is a row of `a2a_remote_push_waits` (the token only as its SHA-256), so
it outlives the process:

    open      the row (`waiting`), its webhook URL and its token
    receive   a notification: an unknown id or a wrong token is 404 (the same answer); a right one goes to
              the delegation that waits (its progress to the side panel; its end read back with GetTask)
    finish    the remote task's end state and answer on the row

While it waits, the delegation also reads the task with `GetTask` every `A2A_REMOTE_PUSH_POLL_S` (a push
may be lost). At a restart, a task still waiting is not failed with the others (`TaskRecords.
fail_interrupted`): `resume` waits for its push (or polls) again and, at its end, saves the answer and
the end state on the task (`TaskRecords.end_task`), as the delegation would have.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import hmac
import importlib
import logging
import secrets
from dataclasses import dataclass, field
from typing import Any

from sqlmodel import col, select

from core.db import Database
from core.delegation.tasks import TaskRecords
from core.settings import Settings
from models import A2ATaskSession, RemotePushWait, utcnow

log = logging.getLogger(__name__)

WAITING = "waiting"
MAX_QUEUED = 256  # notifications of one task not read yet; more are dropped (the end is read with GetTask)


@dataclass(slots=True)
class Wait:
    """One remote task waiting for its end by push.

    Attributes:
        id: its id (in the webhook URL).
        token: what the remote agent must send back in `X-A2A-Notification-Token`.
        url: the webhook URL.
        updates: the notifications received (`StreamResponse`s), for the delegation that waits.
    """

    id: str
    token: str
    url: str
    updates: asyncio.Queue[Any] = field(default_factory=lambda: asyncio.Queue(MAX_QUEUED))


def _hash(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


class RemotePushWaits:
    """The waits of this app's remote tasks that end by push; the webhook's work.

    Args:
        db: the database.
        settings: `A2A_REMOTE_PUSH`, `A2A_REMOTE_PUSH_POLL_S`, and the URL remote agents reach this app at.
    """

    def __init__(self, db: Database, settings: Settings) -> None:
        self.db = db
        self.settings = settings
        #: Ends tasks resumed after a restart (`Services.build` sets it: the delegation's records).
        self.records: TaskRecords | None = None
        #: True once the app stops: a delegation cut off then leaves its wait for the next start.
        self.closing = False
        self._live: dict[str, Wait] = {}
        self._jobs: set[asyncio.Task[None]] = set()

    @property
    def enabled(self) -> bool:
        """Whether remote agents that offer push end long tasks by push (`A2A_REMOTE_PUSH`)."""
        return bool(self.settings.a2a_remote_push)

    @property
    def poll_s(self) -> float:
        """How often a waiting task is also read with GetTask."""
        return float(self.settings.a2a_remote_push_poll_s)

    async def open(self, *, task_id: str, remote_agent_id: str) -> Wait:
        """A new wait for the delegated task `task_id` (its row written), with its webhook URL and token."""
        wait = Wait(id=secrets.token_hex(16), token=secrets.token_urlsafe(32), url="")
        wait.url = f"{self.settings.base_url}/a2a/push/{wait.id}"
        async with self.db.session() as s:
            s.add(
                RemotePushWait(
                    id=wait.id, task_id=task_id, remote_agent_id=remote_agent_id, token_hash=_hash(wait.token)
                )
            )
            await s.commit()
        self._live[wait.id] = wait
        return wait

    def follow(self, wait_id: str) -> Wait:
        """Receive the notifications of a wait read back from the database (`resume`)."""
        wait = self._live.get(wait_id) or Wait(id=wait_id, token="", url="")
        self._live[wait_id] = wait
        return wait

    def release(self, wait_id: str) -> None:
        """No one in this process waits for the wait any more (its row stays as it is)."""
        self._live.pop(wait_id, None)

    async def named(self, wait_id: str, remote_task_id: str) -> None:
        """The remote agent named its task (for GetTask after a restart)."""
        async with self.db.session() as s:
            row = await s.get(RemotePushWait, wait_id)
            if row is not None:
                row.remote_task_id = remote_task_id[:255]
                s.add(row)
                await s.commit()

    async def finish(self, wait_id: str, state: str, *, answer: str | None = None, error: str | None = None) -> None:
        """The remote task ended: its state and answer on the row, which waits no more."""
        async with self.db.session() as s:
            row = await s.get(RemotePushWait, wait_id)
            if row is not None and row.state == WAITING:
                row.state, row.answer, row.error, row.finished_at = state, answer, error, utcnow()
                s.add(row)
                await s.commit()

    async def receive(self, wait_id: str, token: str | None, body: Any) -> bool:
        """A notification for `wait_id`; False when there is no such wait or the token is not its own."""
        async with self.db.read() as s:
            row = await s.get(RemotePushWait, wait_id)
        if row is None or not token or not hmac.compare_digest(row.token_hash, _hash(token)):
            return False
        wait = self._live.get(wait_id)
        if row.state != WAITING or wait is None:
            return True  # taken: its end is known already, or the start's `resume` reads it with GetTask
        push = importlib.import_module("core.a2a.protocol.push")  # the a2a-sdk: loaded by now (a call sent it)
        response = push.read_notification(body)
        if response is not None:
            with contextlib.suppress(asyncio.QueueFull):
                wait.updates.put_nowait(response)
        return True

    # -- after a restart ------------------------------------------------------------------

    async def resume(self, registry: Any) -> int:
        """Wait again for every task left waiting by the last run (at start); returns how many."""
        async with self.db.read() as s:
            rows = list((await s.exec(select(RemotePushWait).where(col(RemotePushWait.state) == WAITING))).all())
        for row in rows:
            job = asyncio.get_running_loop().create_task(self._resume(row, registry), name=f"push wait {row.id}")
            self._jobs.add(job)
            job.add_done_callback(self._jobs.discard)
        return len(rows)

    async def _resume(self, row: RemotePushWait, registry: Any) -> None:
        wait = self.follow(row.id)
        try:
            while True:
                agent = registry.remote(row.remote_agent_id)
                if agent is not None and row.remote_task_id and hasattr(agent, "read_end"):
                    end = await agent.read_end(row.remote_task_id, wait)
                    if end is not None:
                        await self._end(row, agent.id, *end)
                        return
                with contextlib.suppress(TimeoutError):  # nothing came: read it with GetTask again
                    async with asyncio.timeout(self.poll_s):
                        await wait.updates.get()
        except asyncio.CancelledError:
            raise
        except Exception:
            log.exception("the remote task of delegated task %s is not followed any more", row.task_id)
        finally:
            self.release(row.id)

    async def _end(self, row: RemotePushWait, agent_id: str, state: str, answer: str | None, error: str | None) -> None:
        """Save a resumed task's end as its delegation would have: the answer in its session, its state."""
        await self.finish(row.id, state, answer=answer, error=error)
        if self.records is None:
            return
        async with self.db.read() as s:
            task = await s.get(A2ATaskSession, row.task_id)
        if task is None:
            return
        message = {
            "role": "assistant",
            "content": answer or "",
            "model_id": f"a2a/{agent_id}",
            "status": "complete" if state == "completed" else "error",
            "error": error,
            "source": "a2a",
            "a2a_task_id": task.id,
            "caller_agent_id": task.caller_agent_id,
            "caller_session_id": task.caller_session_id,
        }
        await self.records.end_task(
            task.id, task.session_id, state, error, rows=[message], input_tokens=0, output_tokens=0
        )
        log.info("delegated task %s ended by its remote agent after a restart: %s", task.id, state)

    async def close(self) -> None:
        """The app stops: waits stay waiting for the next start."""
        self.closing = True
        for job in list(self._jobs):
            job.cancel()
        await asyncio.gather(*self._jobs, return_exceptions=True)
