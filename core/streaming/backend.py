"""The stream hub's interface, declared once: what routes, pages and services may call on `services.hub`.

Two backends satisfy it structurally: `StreamHub` (core/streaming/hub.py, one process) and
`RedisStreamHub` (core/streaming/redis_hub.py, a cluster of replicas on Redis Streams). Code that
holds a hub depends on `StreamHubBackend`; what only a cluster has (leases, cancels across
replicas, the reaper's calls) stays on `RedisStreamHub`, reached through `isinstance`.

Ids are the hub's integers on every backend: `subscribe(key, after=id)` resumes right after the
event `id` (an SSE `Last-Event-ID`), and ids keep counting when a finished buffer is re-created.
"""

from __future__ import annotations

from typing import Any, Protocol

from core.streaming.hub import BufferInfo, StreamEvent


class HubSubscription(Protocol):
    """Replay of a buffer after an id, then its live events, until the buffer's end (`async for`).

    Iteration raises `SubscriberOverflowError` when the subscriber fell too far behind; it may
    subscribe again after the last id it got.
    """

    #: The key of the buffer read.
    key: str
    #: True when events between `after` and the oldest one still held were dropped or expired.
    gap: bool
    #: True when `after` is newer than anything the buffer ever had (it belongs to another stream).
    ahead: bool

    def __aiter__(self) -> HubSubscription:
        """The subscription itself."""
        ...

    async def __anext__(self) -> StreamEvent:
        """The next event; `StopAsyncIteration` after the buffer's end (or `close`)."""
        ...

    def close(self) -> None:
        """Stop receiving; safe to call more than once."""
        ...


class StreamHubBackend(Protocol):
    """Bounded, replayable buffers of events by key (a chat session id, `a2a_<taskId>`)."""

    async def create(self, key: str, meta: dict[str, Any] | None = None) -> BufferInfo:
        """Open a buffer under `key` (ids continue after a finished one); `StreamBusyError` when one is open."""
        ...

    async def append(self, key: str, type: str, data: dict[str, Any] | None = None) -> int:
        """Add one event and return its id; `UnknownStreamError` or `StreamClosedError` when it cannot."""
        ...

    async def finish(self, key: str, *, error: str | None = None) -> None:
        """Mark the buffer done (or errored with `error`); subscribers end after what they have."""
        ...

    async def update_meta(self, key: str, **meta: Any) -> None:
        """Merge `meta` into the open buffer's metadata."""
        ...

    def get(self, key: str) -> BufferInfo | None:
        """The buffer's bookkeeping as this process knows it, or None."""
        ...

    async def refresh(self, key: str) -> BufferInfo | None:
        """The buffer's bookkeeping read from where it is kept (Redis in a cluster), or None."""
        ...

    def subscribe(self, key: str, after: int | None = None) -> HubSubscription:
        """Events with id greater than `after` (all held when None), then live ones; `UnknownStreamError` if none."""
        ...

    def live_streams(self) -> int:
        """How many buffers this process writes or reads now."""
        ...

    def keys(self) -> list[str]:
        """Keys of the buffers this process knows of."""
        ...

    def sweep(self) -> int:
        """Forget finished buffers past their TTL; returns how many."""
        ...


async def refresh(hub: StreamHubBackend, key: str) -> BufferInfo | None:
    """The buffer's current state: read from Redis when `hub` is shared (a cluster), else from memory."""
    return await hub.refresh(key)
