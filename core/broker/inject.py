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
Results are also saved in the database (`core.broker.store`) before they are
queued here, and the task's published position is moved to the result once
Redis has it: what a stop or a full queue loses here is sent again at the next
start.

Each inject has a position in its task's log (`log_position`: the relay's event
count for progress, `RESULT_POSITION` for the result). The seed's wire does not
carry it; the app's chat inbox keeps it with each note, so an inject it reads
twice is saved once.

In cluster mode too the app's chat reads them off the bus of the replica that
relays the task (its notes go to the shared database): they never wait for Redis.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
from collections import deque
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from typing import Any, Final, Literal

from core.aio import cancel_and_wait
from core.web.logtext import without_password

log = logging.getLogger(__name__)

DELAY: Final = "delay"
AUTO: Final = "auto"
RECONNECT_INTERVAL_S = 0.5
HEALTH_CHECK_INTERVAL_S = 5.0  # while idle, ping Redis this often so `health` is not stale
BUS_QUEUE = 1_000
# A task's result comes after everything else in its log (progress positions count the task's events).
RESULT_POSITION: Final = 2_147_483_647


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
    # Not on the wire: for local consumers and the database.
    task_id: str | None = None
    session_id: str | None = None  # the app's own chat session that dispatched the task (core/broker/inbox.py)
    position: int | None = None  # progress: the task's events counted so far (None: not from a task's relay)

    @property
    def log_position(self) -> int | None:
        """Its position in the task's log: a result's is `RESULT_POSITION` (it comes last), progress's its own."""
        return RESULT_POSITION if self.mode == AUTO else self.position

    def payload(self) -> dict[str, Any]:
        """The JSON object on the wire."""
        return {
            "type": "inject_system_message",
            "agentId": self.agent_id,
            "chatId": self.chat_id,
            "text": self.text,
            "mode": self.mode,
        }


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
    """Publishes injects to Redis (when configured) and to the in-process bus.

    `publish` never waits for Redis: it queues the inject, and one sender task
    writes the queue to Redis in pipelined batches over a single connection
    (order kept, no pool to exhaust under hundreds of concurrent tasks). The
    same queue is the outbox while Redis is down: bounded, progress dropped
    first when full, and, once Redis is back, the waiting results are sent
    before the waiting progress. Delivery is at least once: a batch that fails
    half-way is sent again whole.
    """

    def __init__(
        self,
        redis_url: str | None,
        *,
        outbox_max: int = 10_000,
        batch: int = 500,
        on_sent: Callable[[list[str]], Awaitable[None]] | None = None,
    ) -> None:
        self.redis_url = redis_url
        self.on_sent = on_sent  # told the task ids whose results Redis now has (their published position)
        self.outbox_max = outbox_max
        self.batch = batch
        self.bus = InjectBus()
        self._redis: Any = None
        self._up = False
        self._recovering = False  # Redis was down: send the waiting results first
        self._seq = 0
        self._auto: deque[tuple[int, Inject]] = deque()
        self._delay: deque[tuple[int, Inject]] = deque()
        self._wake = asyncio.Event()
        self._idle = asyncio.Event()
        self._idle.set()
        self._sender: asyncio.Task[None] | None = None
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
        """Injects not yet written to Redis."""
        return len(self._auto) + len(self._delay)

    async def start(self) -> None:
        """Connect to Redis (if configured); an unreachable Redis is not an error, just the outbox's cue."""
        if not self.configured or self.redis_url is None:
            return
        import redis.asyncio as redis
        from redis.asyncio.retry import Retry
        from redis.backoff import NoBackoff

        # No client-side retries: a failed write leaves the batch in the outbox at once.
        self._redis = redis.Redis.from_url(
            self.redis_url,
            socket_connect_timeout=5.0,
            socket_timeout=5.0,
            retry=Retry(NoBackoff(), 0),
            single_connection_client=True,
        )
        await self._try_connect()
        self._sender = asyncio.get_running_loop().create_task(self._send_forever(), name="inject sender")

    async def stop(self, drain_timeout_s: float = 2.0) -> None:
        """Send what is queued (for a moment, if Redis is up), then close the connection."""
        if self._sender is not None:
            if self._up and self.outbox_size:
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._idle.wait(), drain_timeout_s)
            await cancel_and_wait(self._sender)
            self._sender = None
        if self.outbox_size:
            log.warning(
                "stopping with %d injects not sent to Redis at %s", self.outbox_size, without_password(self.redis_url)
            )
        if self._redis is not None:
            with contextlib.suppress(Exception):
                await self._redis.aclose()
            self._redis = None

    async def flushed(self, timeout_s: float = 5.0) -> None:
        """Wait until everything queued so far is written (or raise TimeoutError)."""
        await asyncio.wait_for(self._idle.wait(), timeout_s)

    async def publish(self, inject: Inject, *, to_redis: bool = True) -> None:
        """Queue one inject for Redis and deliver it in-process; never waits for Redis, never raises for it.

        `to_redis=False` delivers in-process only (a result Redis already has, sent again to the app's chat).
        """
        self.bus.publish(inject)
        if not self.configured:
            self.sent += 1
            return
        if not to_redis:
            return
        self._seq += 1
        (self._auto if inject.mode == AUTO else self._delay).append((self._seq, inject))
        while self.outbox_size > self.outbox_max:
            (self._delay or self._auto).popleft()  # progress first, results last
            self.dropped += 1
        self._idle.clear()
        self._wake.set()

    def _went_down(self, exc: BaseException) -> None:
        if self._up or self.down_since is None:
            log.warning(
                "Redis at %s is unreachable (%s); injects wait in the outbox until it is back",
                without_password(self.redis_url),
                exc,
            )
            self.down_since = time.time()
        self._up = False
        self._recovering = True
        self.last_error = f"{type(exc).__name__}: {exc}"

    async def _try_connect(self) -> bool:
        try:
            await self._redis.ping()
        except Exception as exc:  # redis raises ConnectionError, TimeoutError, OSError...
            self._went_down(exc)
            return False
        if not self._up:
            if self.down_since is not None:
                log.info(
                    "Redis at %s is back; sending %d waiting injects",
                    without_password(self.redis_url),
                    self.outbox_size,
                )
            self._up, self.down_since, self.last_error = True, None, None
        return True

    async def _send_forever(self) -> None:
        while True:
            if self.outbox_size == 0:
                self._recovering = False
                self._idle.set()
                self._wake.clear()
                try:
                    await asyncio.wait_for(self._wake.wait(), HEALTH_CHECK_INTERVAL_S)
                except TimeoutError:
                    await self._try_connect()  # keep `state` true while nothing is sent
                continue
            if not self._up and not await self._try_connect():
                await asyncio.sleep(RECONNECT_INTERVAL_S)
                continue
            await self._send_batch()

    def _take(self) -> list[tuple[int, Inject]]:
        batch: list[tuple[int, Inject]] = []
        auto, delay = self._auto, self._delay
        while len(batch) < self.batch and (auto or delay):
            if self._recovering:
                source = auto or delay  # results first after an outage
            elif auto and delay:
                source = auto if auto[0][0] < delay[0][0] else delay  # otherwise in order
            else:
                source = auto or delay
            batch.append(source.popleft())
        return batch

    async def _send_batch(self) -> None:
        batch = self._take()
        try:
            pipe = self._redis.pipeline(transaction=False)
            for _, inject in batch:
                pipe.publish(channel_for(inject.agent_id), json.dumps(inject.payload(), ensure_ascii=False))
            await pipe.execute()
        except asyncio.CancelledError:
            self._put_back(batch)
            raise
        except Exception as exc:
            self._put_back(batch)
            self._went_down(exc)
            return
        self.sent += len(batch)
        saved = [inject.task_id for _, inject in batch if inject.mode == AUTO and inject.task_id is not None]
        if saved and self.on_sent is not None:
            try:
                await self.on_sent(saved)
            except asyncio.CancelledError:
                raise
            except (
                Exception
            ):  # their position stays behind in the database: sent again (at least once) at the next start
                log.warning("could not save the published position of %d results", len(saved), exc_info=True)

    def _put_back(self, batch: list[tuple[int, Inject]]) -> None:
        for item in reversed(batch):
            (self._auto if item[1].mode == AUTO else self._delay).appendleft(item)
