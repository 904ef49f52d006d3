"""A Redis outage on a replica of a cluster: the owner's appends held in order, and written when Redis is back.

docs/ARCHITECTURE.md, "Cluster", says the rules ("Redis out of reach"). The replica that runs a stream counts its
ids itself, so while Redis is out of reach its turn goes on: each event gets its id at once, goes to this
replica's own readers, and waits here for Redis. When Redis answers again the events are written in id order
(`append_at`, which checks the stream is still this owner's and skips what an answer lost on the way had written
already), then the end if the turn ended
meanwhile; the readers on other replicas, whose followers retry meanwhile, take them from the stream as if
nothing had happened. The buffer is bounded (`limit` events for the whole replica): past it, events still reach
this replica's readers and the turn's text is saved whole in the database, but the stream in Redis skips them
(its ids jump; a reader elsewhere misses those events and still gets the end).
"""

from __future__ import annotations

import asyncio
import bisect
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from redis.asyncio import Redis
from redis.commands.core import AsyncScript
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError

from core.streaming.redis_scripts import HubKeys, as_int

log = logging.getLogger(__name__)

#: What "Redis is out of reach" looks like to redis-py (a refused or cut connection, a timeout).
OUT_OF_REACH: tuple[type[BaseException], ...] = (RedisConnectionError, RedisTimeoutError, OSError)
#: How often a replica tries Redis again while it is out of reach (appends held, leases, followers).
RETRY_S = 0.5
#: Held events written per round trip when Redis is back.
DRAIN_BATCH = 256


class RedisReach:
    """When this replica last failed to reach Redis: logged once per outage, and read by the reaper's rule."""

    def __init__(self) -> None:
        self.failed_at: float | None = None  # time.monotonic() of the last failure
        self.down = False
        self.error: str | None = None

    def failed(self, exc: BaseException) -> None:
        """A command failed because Redis was out of reach."""
        self.failed_at = time.monotonic()
        self.error = f"{type(exc).__name__}: {exc}"[:300]
        if not self.down:
            self.down = True
            log.warning("Redis is out of reach (%s); running turns go on and their events wait for it", self.error)

    def reached(self) -> None:
        """A command went through."""
        if self.down:
            self.down = False
            log.warning("Redis answers again; the events held meanwhile are written to it")

    def quiet_for(self, seconds: float) -> bool:
        """True when no command failed for `seconds` (or ever)."""
        return self.failed_at is None or time.monotonic() - self.failed_at >= seconds


@dataclass
class _Held:
    """One stream's events waiting for Redis, in id order, and its end once the owner finished it."""

    events: list[tuple[int, str, str]] = field(default_factory=list)  # (id, type, data JSON)
    finish: str | None = None  # the error ('' = none) once finished here
    next_id: int = 0  # the owner's next id when it finished
    dropped: int = 0


class OutageBuffer:
    """The events this replica's streams could not write to Redis, written in order when it is back.

    Args:
        redis: the client of the hub's commands.
        keys: the hub's key layout.
        scripts: the hub's scripts (`append_at`, `finish`).
        reach: this replica's record of Redis's failures.
        owner: this replica's `INSTANCE_ID`.
        max_events: the streams' length (`MAXLEN ~`).
        ttl_s: how long a finished stream stays in Redis.
        limit: events held at most (the whole replica); past it they are skipped in Redis.
        in_flight: whether a direct append of a key is still on its way (those go first).
        written: called with a key whose end was written (the hub lets go of it).
        released: called with a key whose held events are all written while its turn runs on (its next appends go
            to Redis directly again).
    """

    def __init__(
        self,
        redis: Redis,
        keys: HubKeys,
        scripts: dict[str, AsyncScript],
        reach: RedisReach,
        *,
        owner: str,
        max_events: int,
        ttl_s: float,
        limit: int,
        in_flight: Callable[[str], bool],
        written: Callable[[str], None],
        released: Callable[[str], None],
    ) -> None:
        self.redis = redis
        self.keys = keys
        self.reach = reach
        self.owner = owner
        self.max_events = max_events
        self.ttl_s = ttl_s
        self.limit = limit
        self.size = 0
        self.dropped = 0
        self._scripts = scripts
        self._in_flight = in_flight
        self._written = written
        self._released = released
        self._held: dict[str, _Held] = {}
        self._drainer: asyncio.Task[None] | None = None

    def holds(self, key: str) -> bool:
        """True while events (or the end) of `key` wait for Redis: its next events wait behind them."""
        return key in self._held

    def keys_held(self) -> list[str]:
        """The keys with events waiting."""
        return list(self._held)

    def add(self, key: str, event_id: int, type: str, data: str) -> None:
        """Hold one event (in id order) until Redis is back; past the bound it is skipped in Redis."""
        held = self._held.setdefault(key, _Held())
        if self.size >= self.limit:
            if not held.dropped:
                log.warning(
                    "%d events wait for Redis (the bound, CLUSTER_OUTAGE_BUFFER_EVENTS): the stream %s skips event %d "
                    "and those after it in Redis (its readers here get them, its answer is saved whole)",
                    self.size,
                    key,
                    event_id,
                )
            held.dropped += 1
            self.dropped += 1
        else:
            bisect.insort(held.events, (event_id, type, data))
            self.size += 1
        self._drain_soon()

    def finish(self, key: str, error: str | None, next_id: int) -> None:
        """The owner ended `key` while events wait (or Redis failed the end): its end is written after them."""
        held = self._held.setdefault(key, _Held())
        held.finish, held.next_id = error or "", next_id
        self._drain_soon()

    def stop(self) -> asyncio.Task[None] | None:
        """Stop writing (the hub stops: what is held is lost with the process, as its turns are)."""
        task, self._drainer = self._drainer, None
        if task is not None:
            task.cancel()
        return task

    def _drain_soon(self) -> None:
        if self._drainer is None or self._drainer.done():
            self._drainer = asyncio.get_running_loop().create_task(self._drain_all(), name="redis hub: held events")

    async def _drain_all(self) -> None:
        """Until nothing is held: write each key's events, retrying while Redis is out of reach."""
        await asyncio.sleep(RETRY_S)  # the append that failed is answered first; Redis is not back this instant
        while self._held:
            try:
                for key in list(self._held):
                    await self._drain(key)
            except OUT_OF_REACH as exc:
                self.reach.failed(exc)
                await asyncio.sleep(RETRY_S)
            except Exception:
                log.exception("writing the events held during a Redis outage failed; trying again")
                await asyncio.sleep(RETRY_S * 4)

    async def _drain(self, key: str) -> None:
        held = self._held[key]
        while self._in_flight(key):  # an append sent before the outage is answered first (it may be held too)
            await asyncio.sleep(0.01)
        stream, state = self.keys.stream(key), self.keys.hash(key)
        while held.events:
            chunk = held.events[:DRAIN_BATCH]
            pipe = self.redis.pipeline(transaction=False)
            for event_id, type, data in chunk:
                args: list[str | int] = [type, data, self.max_events, event_id, self.owner, "0"]
                await self._scripts["append_at"](keys=[stream, state], args=args, client=pipe)
            results = await pipe.execute()
            self.reach.reached()
            sent = set(chunk)
            held.events = [event for event in held.events if event not in sent]
            self.size -= len(chunk)
            if any(as_int(result) < 0 for result in results):  # finished or taken over elsewhere meanwhile
                log.warning("stream %s was ended elsewhere during the Redis outage; its held events are dropped", key)
                self.size -= len(held.events)
                del self._held[key]
                self._written(key)
                return
        if held.finish is None:  # the turn still runs: its next appends go to Redis again, after these
            del self._held[key]
            self._released(key)
            return
        await self._scripts["finish"](
            keys=[stream, state, self.keys.open_set],
            args=[key, held.finish, max(1, int(self.ttl_s)), self.keys.changes_channel, held.next_id],
        )
        self.reach.reached()
        del self._held[key]
        self._written(key)
