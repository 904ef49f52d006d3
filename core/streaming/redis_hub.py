"""The stream hub of a cluster: the buffers of `core.streaming.hub` on Redis Streams, shared by every replica.

Same interface as `StreamHub` (`StreamHubBackend`, core/streaming/backend.py: pages, SSE and the A2A server do not
know which one they have); docs/ARCHITECTURE.md, "Cluster", says how the parts fit. Per key, under
`redis.key_prefix` + `hub:`:

- `s:<key>`: a Redis stream. Event N has the entry id `N-0`, so SSE ids, `Last-Event-ID` and `after_event_id` stay
  the hub's integers on every replica. The end of a buffer is the entry `<last>-<generation>` (type `__end__`),
  after the last event and before the next buffer's first one, so a reader learns of the end in order.
- `h:<key>`: the state hash: `state` (open, done, error), `next` (the next id, or past the stream's newest entry:
  the owner's appends do not write it), `first` (the first id of the current buffer), `gen`, `meta` (JSON), `error`,
  `owner` (the replica running it), `lease` (ms since the epoch until which the owner holds it), `cancel` (1 once
  somebody asked it to stop).
- `open`: the set of open keys (the reaper's list).

Each write is one Lua script, so "open" is claimed atomically across replicas (a second `create` anywhere raises
`StreamBusyError`); the owner's appends are plain `XADD`s at the ids it counted while its lease is valid
(`redis_batches`), the checked `append_at` script otherwise. Readers replay with `XRANGE` (on the replica that runs
the stream, from the newest events it keeps). Live events reach the subscribers of the replica that runs the stream
straight from its appends; on the other replicas, one follower task per key (`XREAD BLOCK`) hands them on.

`get` and `subscribe` are synchronous, as in `StreamHub`: they read this replica's mirror of the state hashes, kept
fresh by a pub/sub channel whose messages carry the state and by `refresh(key)`, which callers await before they
start to read a stream another replica may have opened.

While Redis is out of reach, the replica that writes a stream counts its ids itself: its turn goes on, its own
readers get every event, and the events wait in `redis_outage` until Redis is back, then go to Redis in order
(docs/ARCHITECTURE.md, "Cluster", "Redis out of reach").

The parts: `redis_scripts` (the keys and the Lua scripts), `redis_clients` (the connection pools), `redis_batches`
(appends sent together, packed by `redis_wire`), `redis_owner_appends` (the owner's appends on their way, not
awaited), `redis_readers` (subscriptions and followers), `redis_replica` (the replica's name, its leases, cancels and
changes), `redis_outage` (events held while Redis is out of reach); `RedisStreamHub` here writes and holds the mirror.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
from collections.abc import Awaitable, Callable
from typing import Any

from redis.asyncio import Redis

from core.streaming.backend import refresh
from core.streaming.hub import BufferInfo, StreamBusyError, StreamClosedError, StreamEvent, UnknownStreamError
from core.streaming.redis_batches import Append, AppendBatches
from core.streaming.redis_clients import hub_clients
from core.streaming.redis_mirror import BufferMirror, change_message
from core.streaming.redis_outage import OUT_OF_REACH, OutageBuffer, RedisReach
from core.streaming.redis_owner_appends import OwnerAppends
from core.streaming.redis_readers import OwnerTail, RedisSubscription, StreamReaders
from core.streaming.redis_replica import DuplicateReplicaError, ReplicaLeases
from core.streaming.redis_scripts import COMMAND_CONNECTIONS, END_TYPE, HubKeys, as_int, register_scripts

#: An event's data as JSON: `json.dumps(data, default=str)` without making an encoder per token.
_EVENT_JSON = json.JSONEncoder(default=str)

# Importers name these here: `refresh` (any hub) and `DuplicateReplicaError` came from this module first.
__all__ = ["DuplicateReplicaError", "RedisStreamHub", "RedisSubscription", "refresh"]


class RedisStreamHub:
    """`StreamHub`'s interface on Redis Streams (see the module docstring).

    Over 300 lines on purpose: it is the one front of the parts (`redis_readers`, `redis_replica`, `redis_outage`,
    ...) that `StreamHubBackend` and the cluster's callers see; each method only delegates or does the one write.

    Args:
        redis: a client with `decode_responses=True`, for the hub's commands.
        readers: the client of the followers' blocking reads (default: `redis`). Each followed stream holds one of
            its connections all the time (`XREAD BLOCK`), so it must allow one per stream it follows (`from_url`).
        prefix: `redis.key_prefix` (keys and channels of the hub go under `<prefix>hub:`).
        owner: this replica's `INSTANCE_ID`.
        lease_s: how long this replica's claim on an open buffer lasts without renewal.
        max_events, ttl_s, subscriber_queue: as for `StreamHub`.
        outage_events: events this replica holds at most while Redis is out of reach (`redis_outage`).
        append_gather_s: while appends keep coming, how long a batch of them fills before it goes (`AppendBatches`).
    """

    @classmethod
    def from_url(cls, url: str, *, command_connections: int = COMMAND_CONNECTIONS, **options: Any) -> RedisStreamHub:
        """A hub on the Redis at `url`, its commands and its followers' blocking reads on pools of their own.

        Commands share `command_connections` connections (`redis_clients.hub_clients` says why two pools).
        """
        commands, readers = hub_clients(url, command_connections=command_connections)
        return cls(commands, readers=readers, **options)

    def __init__(
        self,
        redis: Redis,
        *,
        readers: Redis | None = None,
        prefix: str,
        owner: str,
        lease_s: float = 15.0,
        max_events: int = 20_000,
        ttl_s: float = 300.0,
        subscriber_queue: int = 10_000,
        outage_events: int = 50_000,
        append_gather_s: float = 0.0,
    ) -> None:
        self.redis = redis
        self.prefix = f"{prefix}hub:"
        self.owner = owner
        self.lease_s = lease_s
        self.max_events = max_events
        self.ttl_s = ttl_s
        self.subscriber_queue = subscriber_queue
        self.events_appended = 0
        self._keys = HubKeys(self.prefix)
        self.changes_channel = self._keys.changes_channel
        self.cancel_channel = self._keys.cancel_channel
        self.open_set = self._keys.open_set
        infos: dict[str, BufferInfo] = {}
        self._owned: set[str] = set()
        self._next: dict[str, int] = {}  # the next id of each stream this replica opened (it counts them)
        self._tasks: list[asyncio.Task[None]] = []
        self._scripts = register_scripts(redis)
        self._appends = AppendBatches(
            redis,
            self._scripts["append_at"],
            owner=owner,
            max_events=max_events,
            lease_ok=lambda key: self._replica.lease_valid(key),  # the leases are made below
            gather_s=append_gather_s,
        )
        self.reach = RedisReach()
        self._outage = OutageBuffer(
            redis,
            self._keys,
            self._scripts,
            self.reach,
            owner=owner,
            max_events=max_events,
            ttl_s=ttl_s,
            limit=outage_events,
            in_flight=lambda key: self._sent.in_flight[key] > 0,
            written=self._let_go,
            released=self._written_up_to_now,
        )
        self._sent = OwnerAppends(self._appends, held=self._outage.add, reach=self.reach)
        self._readers = StreamReaders(
            redis,
            readers if readers is not None else redis,
            self._keys,
            owned=self._owned,
            mirror=infos,
            subscriber_queue=subscriber_queue,
            reach=self.reach,
        )
        self._mirror = BufferMirror(redis, self._keys, infos, ttl_s=ttl_s, count=self._readers.count)
        self._replica = ReplicaLeases(
            redis,
            self._keys,
            self._scripts,
            self._readers,
            owner=owner,
            lease_s=lease_s,
            owned=self._owned,
            refresh=self._mirror.refresh,
            apply=self._mirror.apply,
            reach=self.reach,
            infos=infos,
        )

    @property
    def readers(self) -> Redis:
        """The client of the followers' blocking reads."""
        return self._readers.client

    @readers.setter
    def readers(self, client: Redis) -> None:
        self._readers.client = client

    @property
    def _followers(self) -> dict[str, asyncio.Task[None]]:
        """The running followers by key (tests count them)."""
        return self._readers.followers

    # -- life cycle ------------------------------------------------------------------

    async def start(self) -> None:
        """Claim this replica's name, listen for other replicas' changes and cancels, renew this replica's leases.

        Raises:
            DuplicateReplicaError: another live replica runs under the same `owner` (INSTANCE_ID).
        """
        await self._replica.claim()
        self._tasks = [
            asyncio.create_task(self._replica.listen(), name="redis hub: changes and cancels"),
            asyncio.create_task(self._replica.renew_forever(), name="redis hub: leases"),
        ]

    def claim_name(self, url: str) -> None:
        """Before serving (blocking, a client of its own): take this replica's INSTANCE_ID for this process.

        Raises:
            DuplicateReplicaError: another live replica runs under the same name.
        """
        self._replica.claim_name(url)

    def release_name(self, url: str) -> None:
        """Give this replica's name back (a start refused after `claim_name`), so a corrected start may take it."""
        self._replica.release_name(url)

    async def stop(self) -> None:
        """Stop the listeners and followers (open buffers stay in Redis: their leases run out)."""
        self._replica.stopped = True
        drainer = self._outage.stop()
        tasks = [*self._tasks, *self._readers.stop(), *([drainer] if drainer is not None else [])]
        for task in tasks:
            task.cancel()
        if tasks:  # bounded: a read cut off by the cancel must not hold the stop
            await asyncio.wait(tasks, timeout=2.0)
        self._tasks.clear()
        with contextlib.suppress(Exception):
            async with asyncio.timeout(2.0):
                await self._replica.release()  # the name is free for a restart at once
                await self.redis.aclose()
                if self.readers is not self.redis:
                    await self.readers.aclose()

    def on_cancel(self, handler: Callable[[str], Awaitable[bool]]) -> None:
        """`handler(key)` stops what this replica runs under `key` (True when it ran here); asked by any replica."""
        self._replica.cancel_handlers.append(handler)

    def on_change(self, handler: Callable[[BufferInfo], Awaitable[None]]) -> None:
        """`handler(info)` for each buffer another replica opened, changed or finished (after the mirror has it)."""
        self._replica.change_handlers.append(handler)

    # -- producers -------------------------------------------------------------------

    async def create(self, key: str, meta: dict[str, Any] | None = None) -> BufferInfo:
        """Open the buffer under `key` on every replica; ids continue after a finished one.

        Raises StreamBusyError when a buffer under `key` is open (on any replica).
        """
        meta_json = json.dumps(meta or {})
        lease = self._replica.lease_until()
        first = await self._replica.changing(
            key,
            self._scripts["create"](
                keys=[self._keys.stream(key), self._keys.hash(key), self.open_set],
                args=[key, meta_json, self.owner, lease, self.changes_channel],
            ),
        )
        if first == -1:
            raise StreamBusyError(f"stream {key!r} is still open")
        self._owned.add(key)
        self._sent.forget(key)
        self._replica.leased(key, lease)
        self._next[key], self._appends.stored[key] = first, first - 1  # the next id it counts, the last stored
        self._readers.tails[key] = OwnerTail(first)  # its newest events, for its readers here
        return self._mirror.opened(key, first, meta or {})

    async def append(self, key: str, type: str, data: dict[str, Any] | None = None) -> int:
        """Add one event; returns its id.

        On a stream this replica opened, the id is counted here and the event goes to this replica's readers at
        once; it is sent to Redis with the next batch, and the turn goes on without waiting for the answer
        (`redis_owner_appends`). While Redis is out of reach the event waits for it (`redis_outage`).

        Raises:
            UnknownStreamError: no buffer under `key`.
            StreamClosedError: the buffer is finished (or, on a stream opened here, another replica ended it: known
                from Redis's answer to an earlier append).
        """
        payload = _EVENT_JSON.encode(data or {})
        keys = [self._keys.stream(key), self._keys.hash(key)]
        counted = self._next.get(key)
        if counted is None:  # a stream opened elsewhere (a reaper ending it): Redis gives the id
            event_id = as_int(await self._scripts["append"](keys=keys, args=[type, payload, self.max_events]))
            return self._appended(key, event_id, type, data)
        await self._sent.room(key)  # before the id is counted: a cancel while it waits leaves no hole
        self._sent.check(key)  # an earlier append of it was refused (ended elsewhere): this one is too
        counted = self._next.get(key)
        if counted is None:  # it ended while this append waited for room
            raise StreamClosedError(f"stream {key!r} is finished")
        self._next[key] = counted + 1
        if self._outage.holds(key):  # its earlier events wait for Redis: this one waits behind them
            self._outage.add(key, counted, type, payload)
        else:  # the turn goes on at once; what Redis answers is settled when it comes back (`redis_owner_appends`)
            self._sent.send(Append(key, counted, keys, type, payload))
        return self._appended(key, counted, type, data)

    async def written(self, key: str) -> None:
        """Until Redis has answered every append of `key` made here so far (written, or held for it)."""
        await self._sent.settled(key)

    def _appended(self, key: str, event_id: int, type: str, data: dict[str, Any] | None) -> int:
        if event_id == -2:
            raise UnknownStreamError(key)
        if event_id == -1:
            raise StreamClosedError(f"stream {key!r} is finished")
        self.events_appended += 1
        self._mirror.appended(key, event_id)
        if key in self._owned:  # this replica's readers of its own stream: no round trip through Redis
            self._readers.deliver_own(key, StreamEvent(event_id, type, data or {}))
        return event_id

    async def finish(self, key: str, *, error: str | None = None) -> None:
        """Mark the buffer done (or errored with `error`); every replica's subscribers end after what they have.

        On a stream opened here whose events wait for Redis (or when Redis fails the end), the end waits behind
        them: this replica's readers end now, the others when Redis has it (`redis_outage`).
        """
        if key in self._next:
            await self.written(key)  # the end goes after every event sent, and after those now held
        counted = self._next.get(key)
        if counted is not None and self._outage.holds(key):
            self._finish_later(key, error, counted)
            return
        try:
            last = await self._replica.changing(
                key,
                self._scripts["finish"](
                    keys=[self._keys.stream(key), self._keys.hash(key), self.open_set],
                    args=[key, error or "", max(1, int(self.ttl_s)), self.changes_channel, counted or 0],
                ),
            )
        except OUT_OF_REACH as exc:
            if counted is None:
                raise
            self.reach.failed(exc)
            self._finish_later(key, error, counted)
            return
        owned = key in self._owned
        self._let_go(key)
        if last == -2:
            raise UnknownStreamError(key)
        self._mirror.finished(key, error)
        if owned and last >= 0:
            self._readers.deliver(key, ("end", last, StreamEvent(last, END_TYPE, {"error": error})))

    def _finish_later(self, key: str, error: str | None, next_id: int) -> None:
        """End `key` for this replica's readers now; in Redis once what waits is written (its lease is kept)."""
        self._outage.finish(key, error, next_id)
        self._mirror.finished(key, error)
        self._readers.deliver(key, ("end", next_id - 1, StreamEvent(next_id - 1, END_TYPE, {"error": error})))

    def _let_go(self, key: str) -> None:
        """The end of `key` is in Redis (or another replica ended it): no more leases, no more appends here."""
        self._owned.discard(key)
        self._sent.forget(key)
        self._readers.tails.pop(key, None)
        self._next.pop(key, None)
        self._appends.stored.pop(key, None)

    def _written_up_to_now(self, key: str) -> None:
        """Every event of `key` held during an outage is in Redis (or skipped past the bound): appends go direct."""
        if key in self._next:
            self._appends.stored[key] = self._next[key] - 1

    def held_events(self) -> int:
        """Events this replica holds for Redis (it is out of reach, or was a moment ago)."""
        return self._outage.size

    async def update_meta(self, key: str, **meta: Any) -> None:
        """Merge `meta` into the buffer's metadata.

        On a stream this replica writes under a valid lease (a turn's metadata after its claim), an `HSET` and the
        change message in one round trip: nobody else can have ended it, and only its owner changes its metadata.
        """
        info = self._mirror.infos.get(key)
        if info is not None and self._replica.lease_valid(key):
            done = await self._replica.changing(
                key, self._owner_meta(dataclasses.replace(info, meta={**info.meta, **meta}))
            )
        else:
            done = await self._replica.changing(
                key,
                self._scripts["meta"](
                    keys=[self._keys.hash(key)], args=[json.dumps(meta, default=str), self.changes_channel, key]
                ),
            )
        if done == -1:
            if await self.redis.exists(self._keys.hash(key)):
                raise StreamClosedError(f"stream {key!r} is finished")
            raise UnknownStreamError(key)
        self._mirror.meta_updated(key, meta)

    async def _owner_meta(self, merged: BufferInfo) -> int:
        """Write the metadata of a stream this replica writes and publish its change; 1 (as the `meta` script)."""
        pipe = self.redis.pipeline(transaction=False)
        pipe.hset(self._keys.hash(merged.key), "meta", json.dumps(merged.meta, default=str))
        pipe.publish(self.changes_channel, change_message(merged))
        await pipe.execute()
        return 1

    # -- consumers -------------------------------------------------------------------

    async def refresh(self, key: str) -> BufferInfo | None:
        """The buffer's state as Redis has it, in this replica's mirror (None: no buffer).

        Not read for a stream written here under a valid lease (nobody else can end it) that Redis cannot have trimmed.
        """
        info = self._mirror.infos.get(key)
        if info is not None and self._replica.lease_valid(key) and info.last_id - info.first_id < self.max_events:
            return self._mirror.get(key)
        return await self._mirror.refresh(key)

    def get(self, key: str) -> BufferInfo | None:
        """The buffer's bookkeeping as this replica last saw it (`refresh` first to be sure), or None."""
        return self._mirror.get(key)

    def subscribe(self, key: str, after: int | None = None) -> RedisSubscription:
        """Events with id greater than `after` (all of the current buffer when None), then live ones.

        Raises:
            UnknownStreamError: no buffer under `key` (as far as this replica knows: `refresh` first).
        """
        info = self._mirror.infos.get(key)
        if info is None:
            raise UnknownStreamError(key)
        return RedisSubscription(self._readers, info, after)

    def live_streams(self) -> int:
        """How many streams this replica writes, or reads for its own subscribers, now."""
        return len(self._owned | self._readers.subscribers.keys())

    def keys(self) -> list[str]:
        """Keys of the buffers this replica knows of."""
        return list(self._mirror.infos)

    def sweep(self) -> int:
        """Forget finished buffers past their TTL (Redis expires them itself); returns how many."""
        return self._mirror.sweep()

    # -- cancel, leases and the reaper ---------------------------------------------------

    def owns(self, key: str) -> bool:
        """True while this replica runs the open buffer `key`."""
        return key in self._owned

    async def request_cancel(self, key: str, *, timeout: float = 10.0) -> bool:
        """Ask the replica running `key` to stop it (a durable flag and a pub/sub nudge), then wait for its end.

        Returns False when no buffer under `key` was open.
        """
        return await self._replica.request_cancel(key, timeout=timeout)

    async def wait_closed(self, key: str, *, timeout: float) -> bool:
        """Wait until the buffer `key` is no longer open (True), or `timeout` seconds (False)."""
        return await self._replica.wait_closed(key, timeout=timeout)

    async def expired(self) -> list[str]:
        """Open buffers whose owner's lease has run out (the owner stopped or lost Redis).

        None until this replica has reached Redis without a failure for a whole lease: after an outage every
        owner gets a lease's time to renew (docs/ARCHITECTURE.md, "Cluster", "Redis out of reach").
        """
        if not self.reach.quiet_for(self.lease_s):
            return []
        try:
            return await self._replica.expired()
        except OUT_OF_REACH as exc:
            self.reach.failed(exc)
            raise

    async def take_over(self, key: str) -> bool:
        """Become the owner of an open buffer whose lease expired (to end it); False when it was not expired."""
        return await self._replica.take_over(key)

    async def events(self, key: str) -> list[StreamEvent]:
        """Every event of the current buffer under `key` still in Redis (what a reaper saves of an orphan)."""
        info = await self.refresh(key)
        if info is None:
            return []
        return [event for _number, seq, event in await self._readers.range(key, info.first_id, None) if not seq]

    async def _renew(self) -> None:
        """One renewal of the name and the leases (tests wake a paused replica with it)."""
        await self._replica.renew()
