"""The stream hub: one bounded, replayable buffer of events per key.

Keys are a chat session id (the events of its running turn) or `a2a_<taskId>`
(a delegated task). A buffer is created, appended to, subscribed to (replay of
what it holds, then live) and finished; a finished buffer stays replayable for
`ttl_s` seconds and is then evicted.

Event ids increase by one within a key, also across turns: re-creating a
finished buffer keeps counting, so a client that resumes with the last id it
saw never receives an event twice. A subscriber that asks for events older
than the buffer still holds learns so through `Subscription.gap`.

Each subscriber has its own queue (a slow one never blocks the producer or the
others). A queue that grows past `subscriber_queue` events is cut off: the
subscriber receives what was queued, then `SubscriberOverflowError`, and may
resubscribe from its last id.
"""

from __future__ import annotations

import asyncio
import itertools
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

from core.errors import AppError


@dataclass(frozen=True, slots=True)
class StreamEvent:
    """One event: its id within the buffer, its type (`text-delta`, ...) and its payload."""

    id: int
    type: str
    data: dict[str, Any]

    def as_dict(self) -> dict[str, Any]:
        """The event as the UI stream protocol sends it: `{"type": ..., **data}`."""
        return {"type": self.type, **self.data}


class BufferState(StrEnum):
    """Where a buffer stands."""

    OPEN = "open"
    DONE = "done"
    ERROR = "error"


class UnknownStreamError(AppError, KeyError):
    """No buffer exists under that key (never created, or evicted)."""

    code = "unknown_stream"


class StreamClosedError(AppError, RuntimeError):
    """The buffer is finished; nothing more may be appended."""

    code = "stream_closed"


class StreamBusyError(AppError, RuntimeError):
    """A buffer under that key is still open."""

    code = "stream_busy"


class SubscriberOverflowError(AppError, RuntimeError):
    """This subscriber fell too far behind and was cut off; resubscribe from its last id."""

    code = "subscriber_overflow"


@dataclass(slots=True)
class BufferInfo:
    """A snapshot of a buffer's bookkeeping, safe to hand out."""

    key: str
    state: BufferState
    first_id: int
    last_id: int
    dropped: int
    error: str | None
    meta: dict[str, Any]
    subscribers: int


@dataclass(slots=True, eq=False)
class _Buffer:
    key: str
    meta: dict[str, Any]
    events: deque[StreamEvent]
    next_id: int
    state: BufferState = BufferState.OPEN
    error: str | None = None
    dropped: int = 0
    finished_at: float | None = None
    subscribers: set[Subscription] = field(default_factory=set)

    @property
    def first_id(self) -> int:
        return self.events[0].id if self.events else self.next_id

    def info(self) -> BufferInfo:
        return BufferInfo(
            key=self.key,
            state=self.state,
            first_id=self.first_id,
            last_id=self.next_id - 1,
            dropped=self.dropped,
            error=self.error,
            meta=dict(self.meta),
            subscribers=len(self.subscribers),
        )


_END = object()


class Subscription:
    """Replay of a buffer after an id, then its live events; iterate with `async for`.

    Registered at construction, so nothing appended afterwards can be missed.
    """

    def __init__(self, buffer: _Buffer, after: int | None, queue_limit: int) -> None:
        self.key = buffer.key
        self._buffer = buffer
        self._queue_limit = queue_limit
        self._queue: asyncio.Queue[Any] = asyncio.Queue()
        self._overflowed = False
        self._closed = False
        first = buffer.first_id
        start = first if after is None else after + 1
        #: True when events between `after` and the oldest buffered one were already dropped or evicted.
        self.gap = after is not None and start < first
        #: True when `after` is newer than anything this buffer ever had (it belongs to another stream).
        self.ahead = after is not None and after >= buffer.next_id
        skip = max(0, start - first)
        self._replay: deque[StreamEvent] = deque(itertools.islice(buffer.events, skip, None))
        if buffer.state is BufferState.OPEN:
            buffer.subscribers.add(self)
        else:
            self._closed = True

    def __aiter__(self) -> Subscription:
        return self

    async def __anext__(self) -> StreamEvent:
        if self._replay:
            return self._replay.popleft()
        if not self._queue.empty():
            item = self._queue.get_nowait()
        elif self._overflowed:
            raise SubscriberOverflowError(f"subscriber of {self.key!r} fell behind by {self._queue_limit} events")
        elif self._closed:
            raise StopAsyncIteration
        else:
            item = await self._queue.get()
        if item is _END:
            self._closed = True
            raise StopAsyncIteration
        event: StreamEvent = item
        return event

    def _push(self, event: StreamEvent) -> None:
        if self._queue.qsize() >= self._queue_limit:
            self._overflowed = True
            self._buffer.subscribers.discard(self)
            return
        self._queue.put_nowait(event)

    def _end(self) -> None:
        self._queue.put_nowait(_END)

    def close(self) -> None:
        """Stop receiving; safe to call more than once."""
        self._buffer.subscribers.discard(self)
        self._replay.clear()
        if not self._closed:
            self._closed = True
            self._queue.put_nowait(_END)


class StreamHub:
    """In-process buffers keyed by session id or `a2a_<taskId>`.

    Args:
        max_events: events kept per buffer; the oldest are dropped (and counted) beyond it.
        ttl_s: how long a finished buffer stays replayable before eviction.
        subscriber_queue: events one subscriber may lag behind before it is cut off.
        max_buffers: finished buffers beyond this count are evicted oldest first, TTL or not.
        clock: monotonic seconds (tests pass their own).
    """

    def __init__(
        self,
        *,
        max_events: int = 20_000,
        ttl_s: float = 300.0,
        subscriber_queue: int = 10_000,
        max_buffers: int = 10_000,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if max_events < 1:
            raise ValueError(f"max_events must be at least 1, got {max_events!r}")
        if subscriber_queue < 1:
            raise ValueError(f"subscriber_queue must be at least 1, got {subscriber_queue!r}")
        self.max_events = max_events
        self.ttl_s = ttl_s
        self.subscriber_queue = subscriber_queue
        self.max_buffers = max_buffers
        self._clock = clock
        self._buffers: dict[str, _Buffer] = {}
        self._finished: deque[tuple[float, _Buffer]] = deque()
        self.events_appended = 0

    # -- producers -------------------------------------------------------------------

    async def create(self, key: str, meta: dict[str, Any] | None = None) -> BufferInfo:
        """Open a buffer under `key`; a finished one under the same key is replaced, ids continue.

        Raises:
            StreamBusyError: a buffer under `key` is still open.
        """
        self.sweep()
        old = self._buffers.get(key)
        if old is not None and old.state is BufferState.OPEN:
            raise StreamBusyError(f"stream {key!r} is still open")
        next_id = old.next_id if old is not None else 1
        buf = _Buffer(key=key, meta=dict(meta or {}), events=deque(maxlen=self.max_events), next_id=next_id)
        self._buffers[key] = buf
        return buf.info()

    async def append(self, key: str, type: str, data: dict[str, Any] | None = None) -> int:
        """Add one event and hand it to every subscriber; returns its id.

        Raises:
            UnknownStreamError: no buffer under `key`.
            StreamClosedError: the buffer is finished.
        """
        buf = self._open_buffer(key)
        event = StreamEvent(buf.next_id, type, data or {})
        buf.next_id += 1
        if len(buf.events) == self.max_events:
            buf.dropped += 1
        buf.events.append(event)
        self.events_appended += 1
        for sub in tuple(buf.subscribers):
            sub._push(event)
        return event.id

    async def finish(self, key: str, *, error: str | None = None) -> None:
        """Mark the buffer done (or errored with `error`); subscribers end after what they have."""
        buf = self._buffers.get(key)
        if buf is None:
            raise UnknownStreamError(key)
        if buf.state is not BufferState.OPEN:
            return
        buf.state = BufferState.ERROR if error else BufferState.DONE
        buf.error = error
        buf.finished_at = self._clock()
        self._finished.append((buf.finished_at, buf))
        for sub in tuple(buf.subscribers):
            sub._end()
        buf.subscribers.clear()
        self.sweep()

    async def update_meta(self, key: str, **meta: Any) -> None:
        """Merge `meta` into the buffer's metadata."""
        self._open_buffer(key).meta.update(meta)

    # -- consumers -------------------------------------------------------------------

    def get(self, key: str) -> BufferInfo | None:
        """The buffer's bookkeeping, or None when there is none under `key`."""
        buf = self._buffers.get(key)
        return buf.info() if buf is not None else None

    async def refresh(self, key: str) -> BufferInfo | None:
        """As `get`: one process holds every buffer (`StreamHubBackend.refresh` reads Redis in a cluster)."""
        return self.get(key)

    def subscribe(self, key: str, after: int | None = None) -> Subscription:
        """Events with id greater than `after` (all buffered ones when None), then live ones.

        Raises:
            UnknownStreamError: no buffer under `key`.
        """
        buf = self._buffers.get(key)
        if buf is None:
            raise UnknownStreamError(key)
        return Subscription(buf, after, self.subscriber_queue)

    def live_streams(self) -> int:
        """How many buffers are being written now (a turn, a delegation or a task streaming)."""
        return sum(1 for buf in self._buffers.values() if buf.state is BufferState.OPEN)

    def keys(self) -> list[str]:
        """Keys of every buffer currently held."""
        return list(self._buffers)

    # -- housekeeping ----------------------------------------------------------------

    def sweep(self) -> int:
        """Evict finished buffers past their TTL (or beyond `max_buffers`); returns how many."""
        now = self._clock()
        evicted = 0
        while self._finished:
            finished_at, buf = self._finished[0]
            expired = now - finished_at >= self.ttl_s
            if not expired and len(self._finished) <= self.max_buffers:
                break
            self._finished.popleft()
            if self._buffers.get(buf.key) is buf:
                del self._buffers[buf.key]
                evicted += 1
        return evicted

    def _open_buffer(self, key: str) -> _Buffer:
        buf = self._buffers.get(key)
        if buf is None:
            raise UnknownStreamError(key)
        if buf.state is not BufferState.OPEN:
            raise StreamClosedError(f"stream {key!r} is finished")
        return buf
