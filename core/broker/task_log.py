"""A broker task's events in the hub stream `a2a_<taskId>`: the task's log, readable and resumable by id.

Local and remote A2A delegations already write their events to the hub buffer
`a2a_<taskId>` (`core.delegation.tasks.task_stream_key`); the broker's relay writes
there too, so `GET /api/agents/a2a/stream?taskId=` serves a broker task like any
other (replay, then live; `Last-Event-ID` resume), on any replica when the hub is
the Redis one. The events are the seed-000 task shapes the delegation streams use:
`state`, `text-delta` (each event's text, not throttled), `error` when the task did
not complete, and `done` with the end state, then the buffer is finished.

The app's own dispatches (`core.broker.tools`) already have that buffer, fed by
their delegation record (the relay's `TaskObserver`); the relay leaves it to it
(`writes` is false for them), so each event is in the log once.
"""

from __future__ import annotations

import logging
import time

from core.delegation.tasks import state_event, task_stream_key
from core.streaming import events as ev
from core.streaming.backend import StreamHubBackend
from core.streaming.hub import StreamBusyError

log = logging.getLogger(__name__)


class TaskLog:
    """Writes one broker task's events to its hub stream; a hub failure is logged, never stops the relay."""

    def __init__(self, hub: StreamHubBackend | None, task_id: str, *, writes: bool) -> None:
        self.hub = hub
        self.key = task_stream_key(task_id)
        self.writes = writes and hub is not None
        self._started = time.monotonic()
        self._state = "submitted"

    async def open(self, agent: str, agent_name: str, user_id: int | None) -> None:
        """Open the stream with the first `state` event, `working`; its meta says whose task it is (`userId`).

        `user_id`: the user whose API key dispatched it (None for the dispatch token and open mode).
        """
        if not self.writes:
            return
        assert self.hub is not None
        meta = {"kind": "broker", "agent": agent, "agentName": agent_name, "userId": user_id}
        try:
            await self.hub.create(self.key, meta)
        except StreamBusyError:  # a stream under this id is open: it is not this relay's to write
            log.warning("the stream %s is already open; the broker task's events are not logged", self.key)
            self.writes = False
            return
        except Exception:
            log.warning("could not open the stream %s", self.key, exc_info=True)
            self.writes = False
            return
        await self._append(state_event("working", self._state))
        self._state = "working"

    async def text(self, piece: str) -> None:
        """One event's text, as it arrives."""
        if piece:
            await self._append(ev.TextDelta("text-0", piece))

    async def end(self, state: str, text: str) -> None:
        """The task's end: `error` (unless completed), the last `state`, `done`, then the stream is finished."""
        if not self.writes:
            return
        assert self.hub is not None
        error = None if state == "completed" else text
        if error is not None:
            await self._append(ev.Error(error))
        await self._append(state_event(state, self._state, error))
        await self._append(ev.TaskDone(state, error, int((time.monotonic() - self._started) * 1000)))
        try:
            await self.hub.finish(self.key, error=error)
        except Exception:
            log.warning("could not finish the stream %s", self.key, exc_info=True)
        self.writes = False

    async def _append(self, event: ev.Event) -> None:
        if not self.writes:
            return
        assert self.hub is not None
        try:
            await ev.publish(self.hub, self.key, event)
        except Exception:
            log.warning("could not append to the stream %s", self.key, exc_info=True)
