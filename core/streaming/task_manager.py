"""Task events: a task's progress, state changes and artifacts, to every open stream of that task.

The seed-002 TaskManager integration, built on the stream hub: each task has one
hub buffer (`a2a_<taskId>` by default, the delegated-task key of docs/ARCHITECTURE.md), so
every subscriber (an SSE client through `response()`, the UI in-process through
`subscribe()`) gets replay of what happened so far, then live events, and can
resume after the last id it saw. A late subscriber needs no "current status"
message: the replay is the status.

Event types and payloads (the seed's, with ISO 8601 timestamps):

    progress   {taskId, message, progress (0-100 or null), timestamp}
    state      {taskId, from, to, timestamp}
    artifact   {taskId, artifact, timestamp}
    done       {taskId, result, timestamp}          then the buffer is finished
    error      {taskId, errorText, timestamp}       then the buffer is finished (errored)

plus any other type through `emit()` (e.g. the callee's `text-delta`). Over SSE,
`progress`, `state` and `artifact` are named events (`addEventListener('progress', ...)`);
the rest are unnamed `{"type": ..., ...}` messages (`onmessage`).

A value that cannot be serialised to JSON raises `SSEDataError` at the call,
before anything is appended. Sending to a task that was never opened raises
`UnknownStreamError`; to a finished one, `StreamClosedError`.

    events = TaskEvents(services.hub)
    await events.open(task_id, {"callee": "coding-assistant"})
    await events.state(task_id, "submitted", "working")
    await events.progress(task_id, "reading the file", 40)
    await events.artifact(task_id, {"type": "report", "content": "..."})
    await events.done(task_id)
    ...
    return events.response(task_id, request)   # in the task's SSE endpoint
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from starlette.requests import Request
from starlette.responses import Response

from core.streaming.backend import HubSubscription, StreamHubBackend
from core.streaming.hub import BufferInfo, BufferState
from core.streaming.sse import SEED_EVENT_TYPES, hub_sse_response, last_event_id, to_json
from core.streaming.sse_stream import (
    artifact_payload,
    done_payload,
    error_payload,
    progress_payload,
    state_payload,
)

KEY_PREFIX = "a2a_"


@dataclass(frozen=True, slots=True)
class TaskSnapshot:
    """Where a task stands, from its buffer's bookkeeping."""

    task_id: str
    #: The last `to` of a state change (None before the first).
    state: str | None
    #: The last progress message and percentage (None before the first).
    message: str | None
    progress: float | None
    #: False once `done` or `fail` was called.
    open: bool
    error: str | None
    last_event_id: int
    meta: dict[str, Any]


class TaskEvents:
    """Progress, state changes and artifacts of tasks, one hub buffer per task.

    Args:
        hub: the stream hub holding the buffers.
        key_prefix: a task's buffer key is `key_prefix + task_id`.
    """

    def __init__(self, hub: StreamHubBackend, *, key_prefix: str = KEY_PREFIX) -> None:
        self.hub = hub
        self.key_prefix = key_prefix

    def key(self, task_id: str) -> str:
        """The hub key of a task's buffer."""
        return f"{self.key_prefix}{task_id}"

    # -- producers ---------------------------------------------------------------------------

    async def open(self, task_id: str, meta: dict[str, Any] | None = None) -> BufferInfo:
        """Start the task's buffer (a finished one under the same id is replaced; ids continue).

        Raises:
            StreamBusyError: the task is still open.
        """
        return await self.hub.create(self.key(task_id), {**(meta or {}), "taskId": task_id})

    async def progress(self, task_id: str, message: str, progress: float | None = None) -> int:
        """A `progress` event (`progress`: 0-100 or None); returns its id."""
        payload = progress_payload(task_id, message, progress)
        if not _all_text(task_id, message):
            to_json(payload, "the progress message")
        key = self.key(task_id)
        event_id = await self.hub.append(key, "progress", payload)
        await self.hub.update_meta(key, message=message, progress=progress)
        return event_id

    async def state(self, task_id: str, old: str | None, new: str) -> int:
        """A `state` event (`from` old, `to` new); returns its id."""
        payload = state_payload(task_id, old, new)
        if not _all_text(task_id, old, new):
            to_json(payload, "the state change")
        key = self.key(task_id)
        event_id = await self.hub.append(key, "state", payload)
        await self.hub.update_meta(key, state=new)
        return event_id

    async def artifact(self, task_id: str, artifact: Any) -> int:
        """An `artifact` event; returns its id."""
        payload = artifact_payload(task_id, artifact)
        to_json(payload, "the artifact")
        return await self.hub.append(self.key(task_id), "artifact", payload)

    async def emit(self, task_id: str, type: str, data: dict[str, Any] | None = None) -> int:
        """Any other event (`text-delta`, ...); `data` is sent as is. Returns its id."""
        payload = dict(data or {})
        to_json(payload, f"the data of event {type!r}")
        return await self.hub.append(self.key(task_id), type, payload)

    async def done(self, task_id: str, result: Any = None) -> None:
        """A `done` event, then the buffer is finished: every stream of the task ends after it."""
        payload = done_payload(task_id, result)
        to_json(payload, "the result")
        key = self.key(task_id)
        await self.hub.append(key, "done", payload)
        await self.hub.finish(key)

    async def fail(self, task_id: str, error: str) -> None:
        """An `error` event (`errorText`), then the buffer is finished as errored."""
        key = self.key(task_id)
        await self.hub.append(key, "error", error_payload(task_id, error))
        await self.hub.finish(key, error=error)

    # -- consumers ---------------------------------------------------------------------------

    def get(self, task_id: str) -> TaskSnapshot | None:
        """Where the task stands, or None when it has no buffer (never opened, or evicted)."""
        info = self.hub.get(self.key(task_id))
        if info is None:
            return None
        meta = info.meta
        return TaskSnapshot(
            task_id=task_id,
            state=meta.get("state"),
            message=meta.get("message"),
            progress=meta.get("progress"),
            open=info.state is BufferState.OPEN,
            error=info.error,
            last_event_id=info.last_id,
            meta=dict(meta),
        )

    def subscribe(self, task_id: str, after: int | None = None) -> HubSubscription:
        """In-process: the task's events after `after` (all when None), then live ones."""
        return self.hub.subscribe(self.key(task_id), after=after)

    def response(
        self,
        task_id: str,
        request: Request | None = None,
        *,
        last_event_id: str | None = None,
        **options: Any,
    ) -> Response:
        """The task's SSE response (404 JSON when the task is unknown), resuming after the client's id.

        `options` go to `hub_sse_response` (`keepalive_s`, `retry_ms`, `send_timeout_s`, `named`).
        """
        resume = last_event_id if last_event_id is not None or request is None else _resume_id_of(request)
        options.setdefault("named", SEED_EVENT_TYPES)
        return hub_sse_response(self.hub, self.key(task_id), resume, **options)


def _all_text(*values: Any) -> bool:
    """True when every value is a string or None (so the payload needs no JSON check)."""
    return all(v is None or type(v) is str for v in values)


_resume_id_of = last_event_id  # `TaskEvents.response` has a parameter of that name
