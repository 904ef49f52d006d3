"""The app's own chat as a consumer of the broker's injects (seed 003, "xz-chat" side).

When a chat of this app dispatches work to a broker agent in the background (an
`a2a_<id>` tool call, `core.broker.tools`), the task's progress comes back as
`inject_system_message` events, exactly as for an outside chat system. This
inbox takes the injects of those tasks, and only those, off the broker's
in-process bus and applies seed 003's two modes to the chat session:

- `delay` (working progress): appended to the session as a quiet system note;
  no reply, the model sees it next time the user speaks;
- `auto` (the result: completed, failed, canceled, timeout): appended the same
  way, then the agent announces it in a turn of its own.

Neither happens in the middle of a running turn: the session's injects wait
until its turn ends and are then saved in the order they came, and the
announcement is a turn that starts only when none runs. Several results that
arrive together get one announcement.

An inject of such a task carries the session's id (`Inject.session_id`, set by
the broker for the app's own dispatches, never from outside); injects without
it are ignored here: an outside chat system reads them from Redis.

The inbox reads each task by position (`Inject.log_position`, the task's events
counted so far; the result comes last): every note keeps its position, and a
note is saved only beyond the position the session already holds for its task
(`core.chat.sessions.add_notes`). So an inject read twice is saved once, and a
result is announced once, found by its position, never by its text: after a
restart, or when a replica ends the tasks of one that is gone, the broker hands
over again every result whose position is not in its session yet
(`core.broker.store`), and whatever was saved before is skipped.

Every process (each replica in a cluster) has its inbox on its own broker's bus:
it saves the notes of the tasks that process relays, into the shared database,
whoever's replica serves the chat. Only the wait for a running turn differs in a
cluster (`shared_turns`): the turn may run on another replica.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import deque

from core.broker.inject import AUTO, Inject, InjectBus
from core.chat.engine import ChatEngine, ChatError, TurnInProgressError
from core.streaming.background import BackgroundTasks
from core.streaming.redis_hub import refresh as refresh_stream

log = logging.getLogger(__name__)

RETRY_S = 0.05  # a turn claimed the session just before the announcement: look again after this pause
TURN_POLL_S = 0.2  # cluster mode: how often to look whether another replica's turn of the session has ended
SAVE_ATTEMPTS = 3  # a note that cannot be saved after this many tries is dropped (and the error logged)


class ChatInbox:
    """Delivers the injects of background tasks into the chat sessions that started them."""

    def __init__(self, chat: ChatEngine, bus: InjectBus | None, *, shared_turns: bool = False) -> None:
        self.chat = chat
        self.bus = bus  # None: injects come through `receive` only
        self.shared_turns = shared_turns  # cluster mode: a session's turn may run on another replica
        self.delivered = 0
        self.announced = 0
        self._pending: dict[str, deque[Inject]] = {}
        self._announce: set[str] = set()
        self._workers: dict[str, asyncio.Task[None]] = {}
        self._tasks = BackgroundTasks()

    async def start(self) -> None:
        """Listen to the broker's bus (when there is one)."""
        if self.bus is None:
            return
        subscribed = asyncio.Event()
        self._tasks.spawn(self._listen(subscribed), name="chat inbox")
        await subscribed.wait()

    async def stop(self) -> None:
        """Stop listening and delivering (injects not yet saved are dropped with a warning)."""
        waiting = sum(len(q) for q in self._pending.values())
        if waiting:
            log.warning("stopping with %d background-task injects not yet delivered to their chats", waiting)
        await self._tasks.shutdown()
        self._workers.clear()
        self._pending.clear()

    async def _listen(self, subscribed: asyncio.Event) -> None:
        assert self.bus is not None
        async with self.bus.subscribe() as queue:
            subscribed.set()
            while True:
                self.receive(await queue.get())

    def receive(self, inject: Inject) -> None:
        """Queue an inject for its session (ignored when it is not one of this app's background tasks)."""
        session_id = inject.session_id
        if session_id is None:
            return
        self._pending.setdefault(session_id, deque()).append(inject)
        worker = self._workers.get(session_id)
        if worker is None or worker.done():
            self._workers[session_id] = self._tasks.spawn(self._deliver(session_id), name=f"inbox {session_id}")

    async def _deliver(self, session_id: str) -> None:
        """Save the session's waiting injects between turns, then announce results; until none is left."""
        failures = 0
        pending: deque[Inject] = deque()
        try:
            while self._pending.get(session_id) or session_id in self._announce:
                await self._turn_over(session_id)
                pending = self._pending.pop(session_id, deque())
                if pending:
                    try:
                        saved = await self.chat.save_notes(session_id, [_note(i) for i in pending])
                    except ChatError:
                        raise
                    except Exception:  # the database hiccuped: keep them, try again shortly
                        failures += 1
                        if failures > SAVE_ATTEMPTS:
                            raise
                        log.warning(
                            "saving %d injects into session %s failed; trying again",
                            len(pending),
                            session_id,
                            exc_info=True,
                        )
                        self._pending.setdefault(session_id, deque()).extendleft(reversed(pending))
                        await asyncio.sleep(RETRY_S * 20 * failures)
                        continue
                    self.delivered += len(saved)
                    pending = deque()
                    if any(row.inject_mode == AUTO for row in saved):
                        self._announce.add(session_id)
                if session_id in self._announce and not self._pending.get(session_id):
                    try:
                        await self.chat.start_announcement(session_id)
                    except TurnInProgressError:
                        await asyncio.sleep(RETRY_S)  # the user spoke first: announce after that turn
                        continue
                    self._announce.discard(session_id)
                    self.announced += 1
        except Exception as exc:  # the session was deleted (ChatError), or the database keeps failing
            if isinstance(exc, ChatError):
                log.info("dropping background-task injects for session %s: %s", session_id, exc.message)
            else:
                log.exception("dropping background-task injects for session %s", session_id)
            self._pending.pop(session_id, None)
            self._announce.discard(session_id)
        finally:
            if self._workers.get(session_id) is asyncio.current_task():
                del self._workers[session_id]

    async def _turn_over(self, session_id: str) -> None:
        if not self.shared_turns:  # one process: `is_running` and `wait` know every turn
            while self.chat.is_running(session_id):
                await self.chat.wait(session_id)
            return
        # Cluster mode: the turn may run on another replica; the shared stream's state says whether it does
        # (a dead replica's turn is ended by the reaper; waited for no longer than a turn may run).
        deadline = time.monotonic() + self.chat.turn_timeout_s
        while time.monotonic() < deadline:
            try:
                await refresh_stream(self.chat.hub, session_id)
            except Exception:  # Redis is unreachable: what this replica last knew of the session's turn decides
                log.debug("could not refresh the state of session %s", session_id, exc_info=True)
            if not self.chat.is_running(session_id):
                return
            await self.chat.wait(session_id, timeout=TURN_POLL_S)  # a turn here: until it ends
            await asyncio.sleep(TURN_POLL_S)  # a turn elsewhere: look again shortly


def _note(inject: Inject) -> dict[str, object]:
    """The session note of an inject: its text, mode, task and (when it has one) its position in the task."""
    note: dict[str, object] = {"content": inject.text, "inject_mode": inject.mode, "a2a_task_id": inject.task_id}
    if inject.task_id is not None and inject.log_position is not None:
        note["inject_position"] = inject.log_position
    return note
