"""The stream hub of a cluster: the buffers of `core.streaming.hub` on Redis Streams, shared by every replica.

Same interface as `StreamHub` (pages, SSE and the A2A server do not know which one they
have); docs/ARCHITECTURE.md, "Cluster", says how the parts fit. Per key, under
`redis.key_prefix` + `hub:`:

- `s:<key>`: a Redis stream. Event N has the entry id `N-0`, so SSE ids, `Last-Event-ID`
  and `after_event_id` stay the hub's integers on every replica. The end of a buffer is
  the entry `<last>-<generation>` (type `__end__`), after the last event and before the
  next buffer's first one, so a reader learns of the end in order.
- `h:<key>`: the state hash: `state` (open, done, error), `next` (the next id), `first`
  (the first id of the current buffer), `gen`, `meta` (JSON), `error`, `owner` (the
  replica running it), `lease` (ms since the epoch until which the owner holds it),
  `cancel` (1 once somebody asked it to stop).
- `open`: the set of open keys (the reaper's list).

Each write is one Lua script, so "open" is claimed atomically across replicas (a second
`create` anywhere raises `StreamBusy`) and an append checks the state, takes the next id
and adds the entry in one step. Readers replay with `XRANGE`. Live events reach the
subscribers of the replica that runs the stream straight from its appends; on the other
replicas, one follower task per key (`XREAD BLOCK`) hands them to their subscribers.

`get` and `subscribe` are synchronous, as in `StreamHub`: they read this replica's mirror
of the state hashes, kept fresh by a pub/sub channel and by `refresh(key)`, which callers
await before they start to read a stream another replica may have opened.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import logging
import secrets
import time
from collections import deque
from collections.abc import Awaitable, Callable
from typing import Any

from redis.asyncio import BlockingConnectionPool, Redis
from redis.exceptions import RedisError

from core.streaming.hub import (
    BufferInfo,
    BufferState,
    StreamBusy,
    StreamClosed,
    StreamEvent,
    SubscriberOverflow,
    UnknownStream,
)

log = logging.getLogger(__name__)

END_TYPE = "__end__"
REPLAY_BATCH = 512
FOLLOW_BLOCK_MS = 1_000  # under the client's socket timeout
#: Connections the hub's commands share (appends, state, cancels); a command waits for a free one.
COMMAND_CONNECTIONS = 64
#: How long a command waits for a free connection before it fails.
COMMAND_WAIT_S = 10.0
#: Streams one replica can follow at once: one connection each, for its blocking read.
MAX_FOLLOWED_STREAMS = 10_000

# KEYS: stream, hash, open set; ARGV: key, meta JSON, owner, lease until (ms), channel
_CREATE = """
if redis.call('HGET', KEYS[2], 'state') == 'open' then return -1 end
local nxt = tonumber(redis.call('HGET', KEYS[2], 'next') or '1')
local gen = redis.call('HINCRBY', KEYS[2], 'gen', 1)
redis.call('HSET', KEYS[2], 'state', 'open', 'next', nxt, 'first', nxt, 'meta', ARGV[2], 'owner', ARGV[3],
           'lease', ARGV[4], 'cancel', '0', 'error', '')
redis.call('PERSIST', KEYS[2])
if redis.call('EXISTS', KEYS[1]) == 1 then
  redis.call('PERSIST', KEYS[1])
  redis.call('XTRIM', KEYS[1], 'MINID', nxt .. '-0')
end
redis.call('SADD', KEYS[3], ARGV[1])
redis.call('PUBLISH', ARGV[5], ARGV[1])
return nxt
"""

# KEYS: stream, hash; ARGV: type, data JSON, max events
_APPEND = """
local state = redis.call('HGET', KEYS[2], 'state')
if not state then return -2 end
if state ~= 'open' then return -1 end
local id = redis.call('HINCRBY', KEYS[2], 'next', 1) - 1
redis.call('XADD', KEYS[1], 'MAXLEN', '~', ARGV[3], id .. '-0', 't', ARGV[1], 'd', ARGV[2])
return id
"""

# KEYS: stream, hash, open set; ARGV: key, error ('' = none), ttl s, channel. The last event's id (-1: not open).
_FINISH = """
local state = redis.call('HGET', KEYS[2], 'state')
if not state then return -2 end
if state ~= 'open' then return -1 end
local last = tonumber(redis.call('HGET', KEYS[2], 'next')) - 1
local gen = redis.call('HGET', KEYS[2], 'gen')
redis.call('XADD', KEYS[1], last .. '-' .. gen, 't', '__end__', 'd', ARGV[2])
redis.call('HSET', KEYS[2], 'state', ARGV[2] ~= '' and 'error' or 'done', 'error', ARGV[2], 'lease', '0')
redis.call('SREM', KEYS[3], ARGV[1])
local ttl = tonumber(ARGV[3])
if ttl > 0 then
  redis.call('EXPIRE', KEYS[1], ttl)
  redis.call('EXPIRE', KEYS[2], ttl)
else
  redis.call('DEL', KEYS[1], KEYS[2])
end
redis.call('PUBLISH', ARGV[4], ARGV[1])
return last
"""

# KEYS: hash; ARGV: meta JSON to merge, channel, key
_UPDATE_META = """
if redis.call('HGET', KEYS[1], 'state') ~= 'open' then return -1 end
local meta = cjson.decode(redis.call('HGET', KEYS[1], 'meta'))
for k, v in pairs(cjson.decode(ARGV[1])) do meta[k] = v end
redis.call('HSET', KEYS[1], 'meta', cjson.encode(meta))
redis.call('PUBLISH', ARGV[2], ARGV[3])
return 1
"""

# KEYS: hash; ARGV: owner, lease until (ms). Returns the cancel flag (1/0), or -1 when not this owner's any more.
_RENEW = """
if redis.call('HGET', KEYS[1], 'state') ~= 'open' or redis.call('HGET', KEYS[1], 'owner') ~= ARGV[1] then
  return -1
end
redis.call('HSET', KEYS[1], 'lease', ARGV[2])
return tonumber(redis.call('HGET', KEYS[1], 'cancel'))
"""

# KEYS: hash; ARGV: new owner, now (ms), lease until (ms). 1 when the expired lease was taken over.
_TAKE_OVER = """
if redis.call('HGET', KEYS[1], 'state') ~= 'open' then return 0 end
if tonumber(redis.call('HGET', KEYS[1], 'lease') or '0') >= tonumber(ARGV[2]) then return 0 end
redis.call('HSET', KEYS[1], 'owner', ARGV[1], 'lease', ARGV[3])
return 1
"""

# KEYS: hash; ARGV: cancel channel, key. The owner, or '' when the buffer is not open.
_REQUEST_CANCEL = """
if redis.call('HGET', KEYS[1], 'state') ~= 'open' then return '' end
redis.call('HSET', KEYS[1], 'cancel', '1')
redis.call('PUBLISH', ARGV[1], ARGV[2])
return redis.call('HGET', KEYS[1], 'owner')
"""


def _now_ms() -> int:
    return int(time.time() * 1000)


def _entry_id(raw: str) -> tuple[int, int]:
    number, _, seq = raw.partition("-")
    return int(number), int(seq or 0)


_END = object()


class DuplicateReplica(RuntimeError):
    """Another live replica already runs under this INSTANCE_ID."""


class RedisSubscription:
    """Replay of a shared buffer after an id (`XRANGE`), then its live events from this replica's follower.

    Registered with the follower at construction, so nothing appended afterwards is missed; a
    live event that arrives ahead of what was replayed triggers a fill of the ids in between.
    """

    def __init__(self, hub: RedisStreamHub, info: BufferInfo, after: int | None) -> None:
        self.key = info.key
        self._hub = hub
        start = info.first_id if after is None else after + 1
        #: True when events between `after` and the oldest buffered one were already trimmed or expired.
        self.gap = after is not None and start < info.first_id
        #: True when `after` is newer than anything this buffer ever had (it belongs to another stream).
        self.ahead = after is not None and after > info.last_id
        self._last = max(start, info.first_id) - 1  # the last id handed out (or skipped)
        self._queue: asyncio.Queue[Any] = asyncio.Queue()
        self._pending: deque[StreamEvent] = deque()
        self._replayed = False
        self._ended = False
        self._overflowed = False
        self._closed = False
        if info.state is BufferState.OPEN:  # a finished buffer's replay ends at its end entry
            hub._register(self)

    def __aiter__(self) -> RedisSubscription:
        return self

    async def __anext__(self) -> StreamEvent:
        while True:
            if self._pending:
                return self._pending.popleft()
            if self._closed or self._ended:
                self._unregister()
                raise StopAsyncIteration
            if not self._replayed:
                self._replayed = True
                await self._fill(None)
                continue
            if self._queue.empty() and self._overflowed:
                self._unregister()
                raise SubscriberOverflow(
                    f"subscriber of {self.key!r} fell behind by {self._hub.subscriber_queue} events"
                )
            item = await self._queue.get()
            if item is _END:
                self._closed = True
                continue
            kind, number, event = item
            if kind == "end":  # the end, after event `number`
                if number > self._last:
                    await self._fill(number + 1)
                self._ended = True
                continue
            if number <= self._last:
                continue
            if number > self._last + 1:
                await self._fill(number)  # ids between what was handed out and this one (raced the follower)
            if number > self._last:
                self._last = number
                self._pending.append(event)

    async def _fill(self, up_to: int | None) -> None:
        """Queue the entries after `_last` (up to event `up_to`, exclusive; all when None); notes an end entry."""
        for number, seq, event in await self._hub._range(self.key, self._last + 1, up_to):
            if seq:  # the end entry of this buffer (those of earlier buffers were trimmed when it was opened)
                self._ended = True
                return
            if number > self._last:
                self._last = number
                self._pending.append(event)

    def _push(self, item: Any) -> None:
        if self._queue.qsize() >= self._hub.subscriber_queue:
            self._overflowed = True
            self._unregister()
            return
        self._queue.put_nowait(item)

    def _unregister(self) -> None:
        self._hub._unregister(self)

    def close(self) -> None:
        """Stop receiving; safe to call more than once."""
        self._unregister()
        self._pending.clear()
        if not self._closed:
            self._closed = True
            self._queue.put_nowait(_END)


class _AppendBatches:
    """The appends of a replica, sent in order, those that are ready together in one round trip.

    A turn awaits each append before the next, so 80 turns streaming are 80 appends in flight at
    any time: one `EVALSHA` each, with its own connection checkout, write and read. Here the
    appends submitted while a batch is on its way wait for it and go together in the next one
    (a pipeline without a transaction: each script still runs on its own, in order). One batch at
    a time keeps the order in which they were submitted.
    """

    def __init__(self, redis: Redis, script: Any) -> None:
        self._redis = redis
        self._script = script
        self._pending: list[tuple[list[Any], list[Any], asyncio.Future[Any]]] = []
        self._writer: asyncio.Task[None] | None = None

    def submit(self, keys: list[Any], args: list[Any]) -> asyncio.Future[Any]:
        """Queue one append; the future has what the script returned (or its error)."""
        loop = asyncio.get_running_loop()
        done: asyncio.Future[Any] = loop.create_future()
        self._pending.append((keys, args, done))
        if self._writer is None or self._writer.done():
            self._writer = loop.create_task(self._write(), name="redis hub: appends")
        return done

    async def _write(self) -> None:
        batch: list[tuple[list[Any], list[Any], asyncio.Future[Any]]] = []
        try:
            await asyncio.sleep(0)  # what else is appended in this pass of the loop goes along
            while self._pending:
                batch, self._pending = self._pending, []
                try:
                    if len(batch) == 1:  # alone: a pipeline would first ask SCRIPT EXISTS, one more round trip
                        keys, args, _ = batch[0]
                        results: list[Any] = [await self._script(keys=keys, args=args)]
                    else:
                        pipe = self._redis.pipeline(transaction=False)
                        for keys, args, _ in batch:
                            await self._script(keys=keys, args=args, client=pipe)
                        results = await pipe.execute(raise_on_error=False)
                except Exception as exc:  # the connection failed: every append of the batch fails with it
                    results = [exc] * len(batch)
                for (_, _, done), result in zip(batch, results, strict=True):
                    if done.done():
                        continue
                    if isinstance(result, BaseException):
                        done.set_exception(result)
                    else:
                        done.set_result(result)
        finally:  # canceled (the hub stops): no append waits for an answer that will not come
            for _, _, done in [*batch, *self._pending]:
                if not done.done():
                    done.set_exception(RedisError("the Redis hub stopped before this append was sent"))
            self._pending = []


class RedisStreamHub:
    """`StreamHub`'s interface on Redis Streams (see the module docstring).

    Args:
        redis: a client with `decode_responses=True`, for the hub's commands.
        readers: the client of the followers' blocking reads (default: `redis`). Each followed
            stream holds one of its connections all the time (`XREAD BLOCK`), so it must allow
            one per stream this replica follows; `from_url` builds both clients.
        prefix: `redis.key_prefix` (keys and channels of the hub go under `<prefix>hub:`).
        owner: this replica's `INSTANCE_ID`.
        lease_s: how long this replica's claim on an open buffer lasts without renewal.
        max_events, ttl_s, subscriber_queue: as for `StreamHub`.
    """

    @classmethod
    def from_url(cls, url: str, *, command_connections: int = COMMAND_CONNECTIONS, **options: Any) -> RedisStreamHub:
        """A hub on the Redis at `url`, its commands and its followers' blocking reads on pools of their own.

        Commands share `command_connections` connections; one waits for a free connection, up to
        `COMMAND_WAIT_S`. On one pool, a replica following many streams (one blocking read each) ran
        out of connections for its appends: redis-py's limit is 100, and with 80 turns streaming on
        one replica an append failed with "Too many connections" and ended its turn.
        """
        commands = Redis(
            connection_pool=BlockingConnectionPool.from_url(
                url, decode_responses=True, max_connections=command_connections, timeout=COMMAND_WAIT_S
            )
        )
        readers = Redis.from_url(url, decode_responses=True, max_connections=MAX_FOLLOWED_STREAMS)
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
    ) -> None:
        self.redis = redis
        self.readers = readers if readers is not None else redis
        self.prefix = f"{prefix}hub:"
        self.owner = owner
        self.lease_s = lease_s
        self.max_events = max_events
        self.ttl_s = ttl_s
        self.subscriber_queue = subscriber_queue
        self.changes_channel = f"{self.prefix}changes"
        self.cancel_channel = f"{self.prefix}cancel"
        self.open_set = f"{self.prefix}open"
        self.events_appended = 0
        self._mirror: dict[str, BufferInfo] = {}
        self._finished_at: dict[str, float] = {}
        self._subscribers: dict[str, set[RedisSubscription]] = {}
        self._followers: dict[str, asyncio.Task[None]] = {}
        self._owned: set[str] = set()
        self._cancel_handlers: list[Callable[[str], Awaitable[bool]]] = []
        self._change_handlers: list[Callable[[BufferInfo], Awaitable[None]]] = []
        self._tasks: list[asyncio.Task[None]] = []
        self._stopped = False
        self._replica_key = f"{self.prefix}replica:{owner}"
        self._boot = secrets.token_hex(8)  # this process, among processes that might share the name by mistake
        self._scripts = {
            name: redis.register_script(body)
            for name, body in {
                "create": _CREATE,
                "append": _APPEND,
                "finish": _FINISH,
                "meta": _UPDATE_META,
                "renew": _RENEW,
                "take_over": _TAKE_OVER,
                "cancel": _REQUEST_CANCEL,
            }.items()
        }
        self._appends = _AppendBatches(redis, self._scripts["append"])

    def _stream(self, key: str) -> str:
        return f"{self.prefix}s:{key}"

    def _hash(self, key: str) -> str:
        return f"{self.prefix}h:{key}"

    def _lease_until(self) -> int:
        return _now_ms() + int(self.lease_s * 1000)

    # -- life cycle ------------------------------------------------------------------

    async def start(self) -> None:
        """Claim this replica's name, listen for other replicas' changes and cancels, renew this replica's leases.

        Raises:
            DuplicateReplica: another live replica runs under the same `owner` (INSTANCE_ID).
        """
        await self.redis.ping()
        if await self.redis.get(self._replica_key) != self._boot:  # `claim_name` was not called before serving
            if not await self.redis.set(self._replica_key, self._boot, nx=True, px=int(self.lease_s * 1000)):
                raise DuplicateReplica(self._duplicate_message())
        self._tasks = [
            asyncio.create_task(self._listen(), name="redis hub: changes and cancels"),
            asyncio.create_task(self._renew_forever(), name="redis hub: leases"),
        ]

    def claim_name(self, url: str) -> None:
        """Before serving (blocking, a client of its own): take this replica's INSTANCE_ID for this process.

        Raises:
            DuplicateReplica: another live replica runs under the same name.
        """
        import redis as redis_sync

        client = redis_sync.Redis.from_url(url, decode_responses=True, socket_connect_timeout=5)
        try:
            if not client.set(self._replica_key, self._boot, nx=True, px=int(self.lease_s * 1000)):
                raise DuplicateReplica(self._duplicate_message())
        finally:
            client.close()

    def release_name(self, url: str) -> None:
        """Give this replica's name back (a start refused after `claim_name`), so a corrected start may take it."""
        import redis as redis_sync

        client = redis_sync.Redis.from_url(url, decode_responses=True, socket_connect_timeout=5)
        try:
            if client.get(self._replica_key) == self._boot:
                client.delete(self._replica_key)
        finally:
            client.close()

    def _duplicate_message(self) -> str:
        return (
            f"another replica runs with INSTANCE_ID={self.owner!r} (or one with that name stopped less than "
            f"{self.lease_s:g} s ago): give every replica its own INSTANCE_ID"
        )

    async def stop(self) -> None:
        """Stop the listeners and followers (open buffers stay in Redis: their leases run out)."""
        self._stopped = True
        tasks = [*self._tasks, *self._followers.values()]
        for task in tasks:
            task.cancel()
        if tasks:  # bounded: a read cut off by the cancel must not hold the stop
            await asyncio.wait(tasks, timeout=2.0)
        self._tasks.clear()
        self._followers.clear()
        with contextlib.suppress(Exception):
            async with asyncio.timeout(2.0):
                if await self.redis.get(self._replica_key) == self._boot:
                    await self.redis.delete(self._replica_key)  # the name is free for a restart at once
                await self.redis.aclose()
                if self.readers is not self.redis:
                    await self.readers.aclose()

    def on_cancel(self, handler: Callable[[str], Awaitable[bool]]) -> None:
        """`handler(key)` stops what this replica runs under `key` (True when it ran here); asked by any replica."""
        self._cancel_handlers.append(handler)

    def on_change(self, handler: Callable[[BufferInfo], Awaitable[None]]) -> None:
        """`handler(info)` for each buffer another replica opened, changed or finished (after the mirror has it)."""
        self._change_handlers.append(handler)

    # -- producers -------------------------------------------------------------------

    async def create(self, key: str, meta: dict[str, Any] | None = None) -> BufferInfo:
        """Open the buffer under `key` on every replica; ids continue after a finished one.

        Raises:
            StreamBusy: a buffer under `key` is open (on any replica).
        """
        meta_json = json.dumps(meta or {})
        first = await self._scripts["create"](
            keys=[self._stream(key), self._hash(key), self.open_set],
            args=[key, meta_json, self.owner, self._lease_until(), self.changes_channel],
        )
        if first == -1:
            raise StreamBusy(f"stream {key!r} is still open")
        self._owned.add(key)
        info = BufferInfo(
            key=key,
            state=BufferState.OPEN,
            first_id=first,
            last_id=first - 1,
            dropped=0,
            error=None,
            meta=dict(meta or {}),
            subscribers=len(self._subscribers.get(key, ())),
        )
        self._mirror[key] = info
        self._finished_at.pop(key, None)
        return info

    async def append(self, key: str, type: str, data: dict[str, Any] | None = None) -> int:
        """Add one event (one Lua call); returns its id.

        Raises:
            UnknownStream: no buffer under `key`.
            StreamClosed: the buffer is finished.
        """
        # A cancel (Stop) during the call must not leave it half known: the caller has counted the event (a turn
        # saves the text it appended), so the append completes, then the cancel goes on.
        call = self._appends.submit(
            [self._stream(key), self._hash(key)], [type, json.dumps(data or {}, default=str), self.max_events]
        )
        try:
            event_id = await asyncio.shield(call)
        except asyncio.CancelledError:
            with contextlib.suppress(Exception):
                await call
            raise
        if event_id == -2:
            raise UnknownStream(key)
        if event_id == -1:
            raise StreamClosed(f"stream {key!r} is finished")
        self.events_appended += 1
        info = self._mirror.get(key)
        if info is not None and event_id > info.last_id:
            info.last_id = event_id
        if key in self._owned:  # this replica's readers of its own stream: no round trip through Redis
            self._deliver(key, ("event", event_id, StreamEvent(event_id, type, data or {})))
        return event_id

    async def finish(self, key: str, *, error: str | None = None) -> None:
        """Mark the buffer done (or errored with `error`); every replica's subscribers end after what they have."""
        last = await self._scripts["finish"](
            keys=[self._stream(key), self._hash(key), self.open_set],
            args=[key, error or "", max(1, int(self.ttl_s)), self.changes_channel],
        )
        owned = key in self._owned
        self._owned.discard(key)
        if last == -2:
            raise UnknownStream(key)
        info = self._mirror.get(key)
        if info is not None and info.state is BufferState.OPEN:
            info.state, info.error = (BufferState.ERROR if error else BufferState.DONE), error
            self._finished_at[key] = time.monotonic()
        if owned and last >= 0:
            self._deliver(key, ("end", last, StreamEvent(last, END_TYPE, {"error": error})))

    async def update_meta(self, key: str, **meta: Any) -> None:
        """Merge `meta` into the buffer's metadata."""
        done = await self._scripts["meta"](
            keys=[self._hash(key)], args=[json.dumps(meta, default=str), self.changes_channel, key]
        )
        if done == -1:
            if await self.redis.exists(self._hash(key)):
                raise StreamClosed(f"stream {key!r} is finished")
            raise UnknownStream(key)
        info = self._mirror.get(key)
        if info is not None:
            info.meta.update(meta)

    # -- consumers -------------------------------------------------------------------

    async def refresh(self, key: str) -> BufferInfo | None:
        """Read the buffer's state from Redis into this replica's mirror; returns it (None: no buffer)."""
        pipe = self.redis.pipeline(transaction=False)
        pipe.hgetall(self._hash(key))
        pipe.xrange(self._stream(key), "-", "+", count=1)
        state, head = await pipe.execute()
        if not state or "state" not in state:
            self._mirror.pop(key, None)
            self._finished_at.pop(key, None)
            return None
        first = int(state.get("first", 1))
        if head:  # approximate trimming keeps more than asked, exact trimming less: the real first entry counts
            number, seq = _entry_id(head[0][0])
            if not seq:
                first = max(first, number)
        info = BufferInfo(
            key=key,
            state=BufferState(state["state"]),
            first_id=first,
            last_id=int(state.get("next", 1)) - 1,
            dropped=0,
            error=state.get("error") or None,
            meta=json.loads(state.get("meta") or "{}"),
            subscribers=len(self._subscribers.get(key, ())),
        )
        self._mirror[key] = info
        if info.state is not BufferState.OPEN:
            self._finished_at.setdefault(key, time.monotonic())
        else:
            self._finished_at.pop(key, None)
        return info

    def get(self, key: str) -> BufferInfo | None:
        """The buffer's bookkeeping as this replica last saw it (`refresh` first to be sure), or None."""
        info = self._mirror.get(key)
        if info is None:
            return None
        info.subscribers = len(self._subscribers.get(key, ()))
        return dataclasses.replace(info, meta=dict(info.meta))

    def subscribe(self, key: str, after: int | None = None) -> RedisSubscription:
        """Events with id greater than `after` (all of the current buffer when None), then live ones.

        Raises:
            UnknownStream: no buffer under `key` (as far as this replica knows: `refresh` first).
        """
        info = self._mirror.get(key)
        if info is None:
            raise UnknownStream(key)
        return RedisSubscription(self, info, after)

    def live_streams(self) -> int:
        """How many streams this replica writes, or reads for its own subscribers, now."""
        return len(self._owned | self._subscribers.keys())

    def keys(self) -> list[str]:
        """Keys of the buffers this replica knows of."""
        return list(self._mirror)

    def sweep(self) -> int:
        """Forget finished buffers past their TTL (Redis expires them itself); returns how many."""
        now = time.monotonic()
        old = [k for k, at in self._finished_at.items() if now - at >= self.ttl_s and not self._subscribers.get(k)]
        for key in old:
            self._finished_at.pop(key, None)
            self._mirror.pop(key, None)
        return len(old)

    # -- cancel and leases -------------------------------------------------------------

    def owns(self, key: str) -> bool:
        """True while this replica runs the open buffer `key`."""
        return key in self._owned

    async def request_cancel(self, key: str, *, timeout: float = 10.0) -> bool:
        """Ask the replica running `key` to stop it (a durable flag and a pub/sub nudge), then wait for its end.

        Returns False when no buffer under `key` was open.
        """
        owner = await self._scripts["cancel"](keys=[self._hash(key)], args=[self.cancel_channel, key])
        if not owner:
            return False
        if key in self._owned:
            await self._run_cancel_handlers(key)
        await self.wait_closed(key, timeout=timeout)
        return True

    async def wait_closed(self, key: str, *, timeout: float) -> bool:
        """Wait until the buffer `key` is no longer open (True), or `timeout` seconds (False)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if await self.redis.hget(self._hash(key), "state") != "open":
                await self.refresh(key)
                return True
            await asyncio.sleep(0.05)
        return False

    async def expired(self) -> list[str]:
        """Open buffers whose owner's lease has run out (the owner stopped or lost Redis)."""
        keys = list(await self.redis.smembers(self.open_set))
        if not keys:
            return []
        pipe = self.redis.pipeline(transaction=False)
        for key in keys:
            pipe.hmget(self._hash(key), "state", "lease")
        now = _now_ms()
        found = []
        for key, (state, lease) in zip(keys, await pipe.execute(), strict=True):
            if state is None:
                await self.redis.srem(self.open_set, key)  # expired or deleted under us
            elif state == "open" and int(lease or 0) < now:
                found.append(key)
        return found

    async def take_over(self, key: str) -> bool:
        """Become the owner of an open buffer whose lease expired (to end it); False when it was not expired."""
        taken = await self._scripts["take_over"](
            keys=[self._hash(key)], args=[self.owner, _now_ms(), self._lease_until()]
        )
        if taken == 1:
            self._owned.add(key)
            return True
        return False

    async def events(self, key: str) -> list[StreamEvent]:
        """Every event of the current buffer under `key` still in Redis (what a reaper saves of an orphan)."""
        info = await self.refresh(key)
        if info is None:
            return []
        return [event for _number, seq, event in await self._range(key, info.first_id, None) if not seq]

    async def _renew_forever(self) -> None:
        interval = max(0.2, self.lease_s / 3)
        # `_stopped`, not only the cancel: redis-py may turn a cancelled read into its TimeoutError.
        while not self._stopped:
            await asyncio.sleep(interval)
            try:
                await self._renew()
            except RedisError as exc:
                log.warning("could not renew the leases of %d running streams: %s", len(self._owned), exc)

    async def _renew(self) -> None:
        if await self.redis.get(self._replica_key) == self._boot:
            await self.redis.pexpire(self._replica_key, int(self.lease_s * 1000))
        else:  # expired during a long pause: take the name back unless another process has it
            await self.redis.set(self._replica_key, self._boot, nx=True, px=int(self.lease_s * 1000))
        keys = list(self._owned)
        if not keys:
            return
        until = self._lease_until()
        results = []
        for key in keys:  # one short script each; tens of keys per replica at most
            results.append(await self._scripts["renew"](keys=[self._hash(key)], args=[self.owner, until]))
        for key, flag in zip(keys, results, strict=True):
            if flag == -1:
                self._owned.discard(key)  # finished, or taken over by the reaper after a long pause
                subs = self._subscribers.get(key)
                if subs:  # its live events now come from the replica that has it, from what each reader has
                    self._follow_soon(key, after=min(sub._last for sub in subs))
            elif flag == 1:
                await self._run_cancel_handlers(key)  # the nudge was missed: the durable flag covers it

    async def _run_cancel_handlers(self, key: str) -> None:
        for handler in self._cancel_handlers:
            try:
                if await handler(key):
                    return
            except Exception:
                log.exception("cancelling %s failed", key)

    async def _listen(self) -> None:
        while not self._stopped:
            pubsub = self.redis.pubsub()
            try:
                await pubsub.subscribe(self.changes_channel, self.cancel_channel)
                async for message in pubsub.listen():
                    if message.get("type") != "message":
                        continue
                    key = message["data"]
                    if message["channel"] == self.cancel_channel:
                        if key in self._owned:
                            asyncio.create_task(self._run_cancel_handlers(key), name=f"cancel {key}")
                    else:  # every replica mirrors every buffer's state (`get`, `is_running` read it)
                        info = await self.refresh(key)
                        if info is not None and key not in self._owned:
                            for handler in self._change_handlers:
                                try:
                                    await handler(info)
                                except Exception:
                                    log.exception("a handler of the change of %s failed", key)
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                if self._stopped:
                    return
                log.warning("the hub's change channel was interrupted (%s); reconnecting", exc)
                await asyncio.sleep(1.0)
            finally:
                with contextlib.suppress(Exception):
                    await pubsub.aclose()

    # -- reading ---------------------------------------------------------------------

    async def _range(self, key: str, start: int, up_to: int | None) -> list[tuple[int, int, StreamEvent]]:
        """Entries from event `start` on (before event `up_to` when given): (number, seq, event); seq > 0: an end."""
        out: list[tuple[int, int, StreamEvent]] = []
        low = f"{start - 1}-1"  # event `start` and an end entry right after event `start - 1`
        high = f"({up_to}-0" if up_to is not None else "+"
        while True:
            entries = await self.redis.xrange(self._stream(key), low, high, count=REPLAY_BATCH)
            for raw_id, fields in entries:
                number, seq = _entry_id(raw_id)
                out.append((number, seq, self._event(number, fields)))
            if len(entries) < REPLAY_BATCH:
                return out
            low = f"({entries[-1][0]}"

    @staticmethod
    def _event(number: int, fields: dict[str, str]) -> StreamEvent:
        return StreamEvent(
            number,
            fields.get("t", ""),
            json.loads(fields.get("d") or "{}") if fields.get("t") != END_TYPE else {"error": fields.get("d") or None},
        )

    def _register(self, sub: RedisSubscription) -> None:
        self._subscribers.setdefault(sub.key, set()).add(sub)
        if sub.key not in self._owned:  # an owned stream's appends deliver to its subscribers themselves
            self._follow_soon(sub.key)

    def _follow_soon(self, key: str, after: int | None = None) -> None:
        if key not in self._followers:
            self._followers[key] = asyncio.get_running_loop().create_task(
                self._follow(key, after), name=f"redis hub: follow {key}"
            )

    def _deliver(self, key: str, item: tuple[str, int, StreamEvent]) -> None:
        """Hand one live event (or the end) to this replica's subscribers of `key`.

        A subscriber skips ids it already has (its replay, or the follower when both run), and fills
        from Redis the ids it missed, so two paths to it never repeat or lose an event.
        """
        for sub in tuple(self._subscribers.get(key, ())):
            sub._push(item)

    def _unregister(self, sub: RedisSubscription) -> None:
        subs = self._subscribers.get(sub.key)
        if subs is not None:
            subs.discard(sub)
            if not subs:
                del self._subscribers[sub.key]

    async def _follow(self, key: str, after: int | None = None) -> None:
        """This replica's one reader of a stream: hands each new entry to the local subscribers of `key`.

        From the newest entry on (its subscribers replay what came before), or from the entries
        after event `after` (the end entry after it included).
        """
        stream = self._stream(key)
        try:
            if after is None:
                top = await self.readers.xrevrange(stream, "+", "-", count=1)
                cursor = top[0][0] if top else "0-0"
            else:
                cursor = f"{after}-0"
            while self._subscribers.get(key) and not self._stopped:
                reply = await self.readers.xread({stream: cursor}, block=FOLLOW_BLOCK_MS, count=REPLAY_BATCH)
                for _name, entries in reply or ():
                    for raw_id, fields in entries:
                        cursor = raw_id
                        number, seq = _entry_id(raw_id)
                        event = self._event(number, fields)
                        kind = "end" if seq else "event"
                        info = self._mirror.get(key)
                        if info is not None and kind == "event" and number > info.last_id:
                            info.last_id = number
                        self._deliver(key, (kind, number, event))
        except asyncio.CancelledError:
            raise
        except Exception:
            if not self._stopped:
                log.exception("following stream %s failed; its readers end here and may resume", key)
            for sub in tuple(self._subscribers.get(key, ())):
                sub._overflowed = True
                sub._push(_END)
        finally:
            if self._followers.get(key) is asyncio.current_task():
                del self._followers[key]
            if self._subscribers.get(key) and not self._stopped and key not in self._owned:
                self._follow_soon(key)  # a subscriber came while this one was leaving


async def refresh(hub: Any, key: str) -> BufferInfo | None:
    """The buffer's current state, read from Redis when `hub` is shared (a cluster), else from memory."""
    if isinstance(hub, RedisStreamHub):
        return await hub.refresh(key)
    return hub.get(key)
