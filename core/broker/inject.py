"""The return path (seed 003): `inject_system_message` events to the chat system.

Each inject is published to the Redis channel `agent:events:<agentId>` as

    {"type": "inject_system_message", "agentId": 123, "chatId": "abc",
     "text": "[Travel] Found 6 trains...", "mode": "delay"}

`delay` is working progress (the chat inserts it into the history quietly),
`auto` is a terminal result (the chat announces it at a safe moment).

Every inject also goes over an in-process bus, so consumers in this process
(the broker page, the app's own chat) get them with or without Redis. Without
Redis configured the bus is the only transport. With Redis configured but
unreachable, injects wait in a bounded outbox and are sent when Redis is back;
when the outbox is full, progress (`delay`) is dropped before results
(`auto`), and results are sent first, so what the user must hear survives.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
from collections import deque
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any, Literal

log = logging.getLogger(__name__)

DELAY, AUTO = "delay", "auto"
RECONNECT_INTERVAL_S = 0.5
HEALTH_CHECK_INTERVAL_S = 5.0  # while idle, ping Redis this often so `health` is not stale
BUS_QUEUE = 1_000


def channel_for(agent_id: Any) -> str:
    """The Redis channel of one chat agent (seed 003)."""
    return f"agent:events:{agent_id}"


@dataclass(frozen=True, slots=True)
class Inject:
    """One `inject_system_message` (agentId keeps the type the chat system sent: 123 stays a number)."""

    agent_id: Any
    chat_id: str
    text: str
    mode: Literal["delay", "auto"]
    task_id: str | None = None  # not on the wire; for local consumers and the outbox

    def payload(self) -> dict[str, Any]:
        """The JSON object on the wire."""
        return {"type": "inject_system_message", "agentId": self.agent_id, "chatId": self.chat_id,
                "text": self.text, "mode": self.mode}


class InjectBus:
    """In-process fan-out of injects; a slow subscriber loses its oldest events, never blocks the broker."""

    def __init__(self) -> None:
        self._queues: set[asyncio.Queue[Inject]] = set()

    def publish(self, inject: Inject) -> None:
        """Deliver to every subscriber now."""
        for queue in self._queues:
            if queue.full():
                queue.get_nowait()
            queue.put_nowait(inject)

    @contextlib.asynccontextmanager
    async def subscribe(self) -> AsyncIterator[asyncio.Queue[Inject]]:
        """A queue that receives every inject while the context is open."""
        queue: asyncio.Queue[Inject] = asyncio.Queue(BUS_QUEUE)
        self._queues.add(queue)
        try:
            yield queue
        finally:
            self._queues.discard(queue)


class InjectPublisher:
    """Publishes injects to Redis (when configured) and to the in-process bus."""

    def __init__(self, redis_url: str | None, *, outbox_max: int = 10_000) -> None:
        self.redis_url = redis_url
        self.outbox_max = outbox_max
        self.bus = InjectBus()
        self._redis: Any = None
        self._up = False
        self._auto: deque[Inject] = deque()
        self._delay: deque[Inject] = deque()
        self._wake = asyncio.Event()
        self._flusher: asyncio.Task[None] | None = None
        self.sent = 0
        self.dropped = 0  # outbox overflow
        self.down_since: float | None = None
        self.last_error: str | None = None

    @property
    def configured(self) -> bool:
        """True when a Redis URL is set."""
        return self.redis_url is not None

    @property
    def state(self) -> str:
        """'disabled' (no Redis configured), 'up' or 'down'."""
        if not self.configured:
            return "disabled"
        return "up" if self._up else "down"

    @property
    def outbox_size(self) -> int:
        """Injects waiting for Redis."""
        return len(self._auto) + len(self._delay)

    async def start(self) -> None:
        """Connect to Redis (if configured); an unreachable Redis is not an error, just the outbox's cue."""
        if not self.configured:
            return
        import redis.asyncio as redis
        from redis.asyncio.retry import Retry
        from redis.backoff import NoBackoff

        # No client-side retries: a failed publish goes to the outbox at once instead of stalling the task.
        self._redis = redis.Redis.from_url(self.redis_url, socket_connect_timeout=1.0, socket_timeout=2.0,
                                           retry=Retry(NoBackoff(), 0))
        self._flusher = asyncio.get_running_loop().create_task(self._flush_forever(), name="inject outbox")
        await self._try_connect()

    async def stop(self) -> None:
        """Stop retrying and close the connection (what is still in the outbox is logged, then lost)."""
        if self._flusher is not None:
            self._flusher.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._flusher
            self._flusher = None
        if self.outbox_size:
            log.warning("stopping with %d injects still waiting for Redis at %s", self.outbox_size, self.redis_url)
        if self._redis is not None:
            with contextlib.suppress(Exception):
                await self._redis.aclose()
            self._redis = None

    async def publish(self, inject: Inject) -> None:
        """Send one inject; never raises for a Redis outage (the outbox takes it)."""
        self.bus.publish(inject)
        if not self.configured:
            self.sent += 1
            return
        if self._up and not self.outbox_size:
            try:
                await self._redis.publish(channel_for(inject.agent_id), json.dumps(inject.payload(), ensure_ascii=False))
                self.sent += 1
                return
            except Exception as exc:  # redis raises ConnectionError, TimeoutError, OSError...
                self._went_down(exc)
        self._enqueue(inject)

    def _enqueue(self, inject: Inject) -> None:
        (self._auto if inject.mode == AUTO else self._delay).append(inject)
        while self.outbox_size > self.outbox_max:
            (self._delay or self._auto).popleft()  # progress goes first, results last
            self.dropped += 1
        self._wake.set()

    def _went_down(self, exc: BaseException) -> None:
        if self._up or self.down_since is None:
            log.warning("Redis at %s is unreachable (%s); injects wait in the outbox until it is back",
                        self.redis_url, exc)
            self.down_since = time.time()
        self._up = False
        self.last_error = f"{type(exc).__name__}: {exc}"

    async def _try_connect(self) -> bool:
        try:
            await self._redis.ping()
        except Exception as exc:
            self._went_down(exc)
            return False
        if not self._up:
            if self.down_since is not None:
                log.info("Redis at %s is back; sending %d waiting injects", self.redis_url, self.outbox_size)
            self._up, self.down_since, self.last_error = True, None, None
        return True

    async def _flush_forever(self) -> None:
        while True:
            if self.outbox_size == 0 and self._up:
                self._wake.clear()
                try:
                    await asyncio.wait_for(self._wake.wait(), HEALTH_CHECK_INTERVAL_S)
                except TimeoutError:
                    await self._try_connect()
                    continue
            if not self._up and not await self._try_connect():
                await asyncio.sleep(RECONNECT_INTERVAL_S)
                continue
            await self._flush()

    async def _flush(self) -> None:
        for queue in (self._auto, self._delay):  # results first: if Redis drops again, they are out
            while queue and self._up:
                inject = queue[0]
                try:
                    await self._redis.publish(channel_for(inject.agent_id),
                                              json.dumps(inject.payload(), ensure_ascii=False))
                except Exception as exc:
                    self._went_down(exc)
                    return
                queue.popleft()
                self.sent += 1
