"""Seed 002's `SSEStream`: typed SSE events (progress, state, artifact, custom), sent before or after clients attach.

Events may be sent before any client attaches (a bounded buffer, oldest dropped
and counted), then `attach()` turns the stream into a response; several clients
may attach, each resuming after the last id it saw. The seed's other way,
`new SSEStream({res})`, is `SSEStream(request=request)`: the stream is attached
to that request from the start and its `response` is what the route returns. The bytes, the resume rules,
keep-alive, slow clients and connection care are those of every SSE response of
the app (`core/streaming/sse.py`). The seed's payloads (`progress_payload`,
`state_payload`, `artifact_payload`) are here too; `TaskEvents`
(`core/streaming/task_manager.py`) sends the same ones through the hub.

A producer's `send_*` calls only queue: a slow or failed client never raises
into them.

Not thread-safe: use an `SSEStream` from the event loop that serves it.
"""

from __future__ import annotations

import asyncio
import inspect
import logging
from collections import deque
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from starlette.requests import Request
from starlette.responses import Response

from core.streaming.sse import (
    _CONNECTION_LOST,
    _MAX_BATCH_BYTES,
    _MAX_BATCH_EVENTS,
    CLOSED,
    KEEPALIVE_S,
    RETRY_MS,
    SEND_TIMEOUT_S,
    SSEResponse,
    _notice,
    _parse_resume,
    _retry_line,
    encode_event,
    last_event_id,
    nothing_more,
    to_json,
)

log = logging.getLogger(__name__)

MAX_BUFFER_SIZE = 1000
SUBSCRIBER_QUEUE = 10_000


# -- the seed's payloads ------------------------------------------------------------------------


def iso_now() -> str:
    """Now in UTC as ISO 8601 with milliseconds, like JavaScript's `toISOString()`."""
    return datetime.now(UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


def progress_payload(task_id: str, message: str, progress: float | None = None) -> dict[str, Any]:
    """`{taskId, message, progress, timestamp}`; `progress` is a percentage (0-100) or None.

    Raises:
        ValueError: `progress` is not a number from 0 to 100.
    """
    if progress is not None:
        if isinstance(progress, bool) or not isinstance(progress, int | float) or not 0 <= progress <= 100:
            raise ValueError(f"progress must be a number from 0 to 100 or None, got {progress!r}")
    return {"taskId": task_id, "message": message, "progress": progress, "timestamp": iso_now()}


def state_payload(task_id: str, old: str | None, new: str) -> dict[str, Any]:
    """`{taskId, from, to, timestamp}`."""
    return {"taskId": task_id, "from": old, "to": new, "timestamp": iso_now()}


def artifact_payload(task_id: str, artifact: Any) -> dict[str, Any]:
    """`{taskId, artifact, timestamp}`."""
    return {"taskId": task_id, "artifact": artifact, "timestamp": iso_now()}


def done_payload(task_id: str, result: Any = None) -> dict[str, Any]:
    """`{taskId, result, timestamp}`: the seed-002 task's end."""
    return {"taskId": task_id, "result": result, "timestamp": iso_now()}


def error_payload(task_id: str, error: str) -> dict[str, Any]:
    """`{taskId, errorText, timestamp}`: the seed-002 task's failure."""
    return {"taskId": task_id, "errorText": error, "timestamp": iso_now()}


def _check_event_name(event: Any) -> None:
    if not isinstance(event, str) or not event:
        raise ValueError(f"an event type must be a non-empty string, got {event!r}")
    if "\n" in event or "\r" in event:
        raise ValueError(f"an event type must be one line, got {event!r}")


_resume_id_of = last_event_id  # `SSEStream.attach` has a parameter of that name


# -- SSEStream ----------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class SSEEvent:
    """One sent event: its id in the stream, its type, its data as sent (JSON or the string) and its bytes."""

    id: int
    event: str
    data: str
    frame: bytes


class _Subscriber:
    """One attached connection: replay of the history, then a bounded queue of live events."""

    __slots__ = ("after", "queue", "limit", "waiter", "overflowed", "ended", "last_id", "stream")

    def __init__(self, stream: SSEStream, after: int | None, limit: int) -> None:
        self.stream = stream
        self.after = after
        self.queue: deque[SSEEvent] = deque()
        self.limit = limit
        self.waiter: asyncio.Future[None] | None = None
        self.overflowed = False
        self.ended = False
        self.last_id = after or 0

    def push(self, event: SSEEvent) -> None:
        if len(self.queue) >= self.limit:
            self.overflowed = True
            self.stream._subscribers.discard(self)
        else:
            self.queue.append(event)
        self.wake()

    def end(self) -> None:
        self.ended = True
        self.wake()

    def wake(self) -> None:
        waiter = self.waiter
        if waiter is not None:
            self.waiter = None
            if not waiter.done():
                waiter.set_result(None)


Listener = Callable[..., Any]


class SSEStream:
    """A stream of typed SSE events (seed 002), sent before or after clients attach.

    Args:
        max_buffer_size: events kept (default 1000). Before the first client
            attaches they wait here; when full, the oldest is dropped and counted
            in `dropped`. The same window serves resumes by `Last-Event-ID`.
        keepalive_s: seconds between keep-alive comments (None or 0: none).
        retry_ms: the reconnect delay sent to clients (`retry:`), or None.
        subscriber_queue: events one connection may lag behind before it is cut
            off with an `overflow` event.
        send_timeout_s: a write to a client that takes longer ends its connection.
        close_on_disconnect: close the stream (telling the "close" listeners) when
            its last client goes away, as the seed's `req.on('close', ...)` does.
            Set it to False for a stream that clients may leave and resume.
        request: the seed's `res` option. In Node the stream writes to the
            response object it is given; a Starlette route returns its response
            instead, so the stream is attached to `request` at once (the same as
            constructing then calling `attach(request)`) and that response is
            kept in `response`. Events sent before the route returns it reach the
            client first, in order, as the seed's `initResponse` flushes its buffer.

    Listeners, as seed 002 calls them: `on("event", fn)` calls `fn({"event": event,
    "data": data})` (one object, data as given, before serialisation) for every
    event sent; `on("close", fn)` calls `fn()` once, with no argument (why it
    closed is `close_reason`: `"closed"`, `"disconnect"`, `"write-error"` or
    `"shutdown"`). A listener that raises is logged; it never breaks the
    producer. A listener may be a coroutine function; it is then scheduled on
    the running loop.
    """

    def __init__(
        self,
        *,
        max_buffer_size: int = MAX_BUFFER_SIZE,
        keepalive_s: float | None = KEEPALIVE_S,
        retry_ms: int | None = RETRY_MS,
        subscriber_queue: int = SUBSCRIBER_QUEUE,
        send_timeout_s: float | None = SEND_TIMEOUT_S,
        close_on_disconnect: bool = True,
        request: Request | None = None,
    ) -> None:
        if max_buffer_size < 1:
            raise ValueError(f"max_buffer_size must be at least 1, got {max_buffer_size!r}")
        if subscriber_queue < 1:
            raise ValueError(f"subscriber_queue must be at least 1, got {subscriber_queue!r}")
        self.max_buffer_size = max_buffer_size
        self.keepalive_s = keepalive_s
        self.retry_ms = retry_ms
        self.subscriber_queue = subscriber_queue
        self.send_timeout_s = send_timeout_s
        self.close_on_disconnect = close_on_disconnect
        #: Events dropped from the buffer before any client received them.
        self.dropped = 0
        #: Why the stream closed (None while open).
        self.close_reason: str | None = None
        self._retry = _retry_line(retry_ms)
        self._events: deque[SSEEvent] = deque()
        self._next_id = 1
        self._handed_up_to = 0  # the highest id some client has been given
        self._subscribers: set[_Subscriber] = set()
        self._closed = False
        self._listeners: dict[str, list[Listener]] = {"event": [], "close": []}
        self._listener_tasks: set[asyncio.Future[Any]] = set()
        #: The response of the client given as `request` (the seed's `res`), else None.
        self.response: Response | None = None if request is None else self.attach(request)

    # -- the seed's API ---------------------------------------------------------------------

    def send_event(self, event: str, data: Any = None) -> int | None:
        """Send one event of type `event`; `data` is sent as is when a string, else as JSON.

        Returns the event's id, or None when the stream is closed (nothing is sent).

        Raises:
            SSEDataError: `data` cannot be serialised to JSON.
            ValueError: `event` is empty or not one line.
        """
        _check_event_name(event)
        text = data if isinstance(data, str) else to_json(data, f"the data of event {event!r}")
        if self._closed:
            return None
        event_id = self._next_id
        self._next_id = event_id + 1
        item = SSEEvent(event_id, event, text, encode_event(text, event=event, id=event_id))
        events = self._events
        if len(events) >= self.max_buffer_size:
            if events.popleft().id > self._handed_up_to:
                self.dropped += 1
        events.append(item)
        if self._subscribers:
            self._handed_up_to = event_id
            for sub in tuple(self._subscribers):
                sub.push(item)
        if self._listeners["event"]:
            self._emit("event", {"event": event, "data": data})
        return event_id

    def send_progress(self, task_id: str, message: str, progress: float | None = None) -> int | None:
        """A `progress` event: `{taskId, message, progress, timestamp}` (progress 0-100 or None)."""
        return self.send_event("progress", progress_payload(task_id, message, progress))

    def send_artifact(self, task_id: str, artifact: Any) -> int | None:
        """An `artifact` event: `{taskId, artifact, timestamp}`."""
        return self.send_event("artifact", artifact_payload(task_id, artifact))

    def send_state_change(self, task_id: str, old_state: str | None, new_state: str) -> int | None:
        """A `state` event: `{taskId, from, to, timestamp}`."""
        return self.send_event("state", state_payload(task_id, old_state, new_state))

    def close(self) -> None:
        """End the stream: clients receive what is queued, then their response ends. Safe to call twice."""
        self._close(CLOSED)

    def is_closed(self) -> bool:
        """True once the stream is closed (by `close()`, or because its last client went away)."""
        return self._closed

    def get_buffer(self) -> list[SSEEvent]:
        """A copy of the events waiting for a client (sent while none was attached)."""
        if self._handed_up_to == 0:
            return list(self._events)
        return [e for e in self._events if e.id > self._handed_up_to]

    def on(self, name: str, listener: Listener) -> Listener:
        """Call `listener` on "event" (`listener({"event": …, "data": …})`) or "close" (`listener()`); returns it."""
        if name not in self._listeners:
            raise ValueError(f"unknown SSEStream event {name!r}; use 'event' or 'close'")
        self._listeners[name].append(listener)
        return listener

    def off(self, name: str, listener: Listener) -> None:
        """Remove a listener added with `on` (no error when it is not there)."""
        try:
            self._listeners[name].remove(listener)
        except (KeyError, ValueError):
            pass

    # -- attaching --------------------------------------------------------------------------

    @property
    def subscribers(self) -> int:
        """Clients attached right now."""
        return len(self._subscribers)

    @property
    def last_id(self) -> int:
        """The id of the last event sent (0 before the first)."""
        return self._next_id - 1

    def attach(self, request: Request | None = None, *, last_event_id: str | None = None) -> Response:
        """The response for one client (the seed's `initResponse`): buffered events, then live ones.

        The client resumes after `last_event_id`, else after the request's
        `Last-Event-ID` header or `?lastEventId=` parameter; without an id it
        gets every buffered event. A closed stream with nothing after that id
        is answered 204.
        """
        raw = last_event_id if last_event_id is not None or request is None else _resume_id_of(request)
        after, reset_reason = _parse_resume(raw)
        if after is not None:
            first = self._events[0].id if self._events else self._next_id
            if after + 1 < first:
                reset_reason, after = f"events after {after} are no longer buffered", None
            elif after >= self._next_id:
                reset_reason, after = f"event {after} does not belong to this stream", None
        if self._closed and reset_reason is None and (after or 0) >= self.last_id:
            return nothing_more()
        sub = _Subscriber(self, after, self.subscriber_queue)
        return SSEResponse(
            self._connection(sub, reset_reason),
            on_end=lambda reason: self._subscriber_ended(sub, reason),
            keepalive_s=self.keepalive_s,
            send_timeout_s=self.send_timeout_s,
        )

    async def _connection(self, sub: _Subscriber, reset_reason: str | None) -> AsyncIterator[bytes]:
        # Registered when the response starts (not at attach), so a HEAD request leaves nothing behind;
        # whatever was sent in between is in the history.
        prefix = self._retry
        first = self._events[0].id if self._events else self._next_id
        if sub.after is not None and sub.after + 1 < first:  # (dropped since attach: never a silent gap)
            reset_reason, sub.after = f"events after {sub.after} are no longer buffered", None
        if reset_reason is not None:
            yield prefix + _notice("reset", reason=reset_reason)
            prefix = b""
        after = sub.after or 0
        replay = deque(e for e in self._events if e.id > after)
        if replay:
            self._handed_up_to = max(self._handed_up_to, replay[-1].id)
        if self._closed:
            sub.ended = True
        else:
            self._subscribers.add(sub)
        loop = asyncio.get_running_loop()
        try:
            while True:
                source = replay or sub.queue
                if source:
                    sub.last_id, data = _take(source)
                    yield prefix + data if prefix else data
                    prefix = b""
                elif sub.overflowed:
                    yield prefix + _notice(
                        "overflow",
                        reason=f"this client fell behind by {sub.limit} events",
                        lastEventId=sub.last_id,
                    )
                    return
                elif sub.ended:
                    return
                else:
                    waiter = loop.create_future()
                    sub.waiter = waiter
                    await waiter
        finally:
            self._subscribers.discard(sub)

    def _subscriber_ended(self, sub: _Subscriber, reason: str) -> None:
        self._subscribers.discard(sub)
        sub.ended = True
        if reason in _CONNECTION_LOST and self.close_on_disconnect and not self._subscribers:
            self._close(reason)

    # -- internals --------------------------------------------------------------------------

    def _close(self, reason: str) -> None:
        if self._closed:
            return
        self._closed = True
        self.close_reason = reason
        for sub in tuple(self._subscribers):
            sub.end()
        self._subscribers.clear()
        self._emit("close")

    def _emit(self, name: str, *args: Any) -> None:
        for listener in tuple(self._listeners[name]):
            try:
                result = listener(*args)
                if inspect.isawaitable(result):
                    task = asyncio.ensure_future(result)
                    self._listener_tasks.add(task)
                    task.add_done_callback(self._listener_done)
            except Exception:
                log.exception("SSEStream %r listener %r failed", name, listener)

    def _listener_done(self, task: asyncio.Future[Any]) -> None:
        self._listener_tasks.discard(task)
        if not task.cancelled() and task.exception() is not None:
            log.error("SSEStream listener failed", exc_info=task.exception())


def _take(source: deque[SSEEvent]) -> tuple[int, bytes]:
    """Pop up to a batch of events from the left of `source`: (the last id taken, their bytes)."""
    first = source.popleft()
    if not source:
        return first.id, first.frame
    frames = [first.frame]
    size = len(first.frame)
    last = first
    while source and len(frames) < _MAX_BATCH_EVENTS and size < _MAX_BATCH_BYTES:
        last = source.popleft()
        frames.append(last.frame)
        size += len(last.frame)
    return last.id, b"".join(frames)
