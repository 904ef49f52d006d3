"""Reading a Redis stream hub on one replica: subscriptions (replay, then live) and one follower per stream.

A subscription replays what Redis holds (`XRANGE`) and then takes live events: on the replica that
writes the stream, straight from its appends (`StreamReaders.deliver`); on the others, from one
follower task per key (`XREAD BLOCK`) that hands each new entry to every local subscriber. Each
subscription skips ids it already has and fills from Redis the ids it missed, so the two paths to it
never repeat or lose an event. On the replica that writes a stream, the replay and the fills come from the
stream's newest events it keeps itself (`OwnerTail`) when those cover them: the stream route of a turn started
there reads nothing from Redis.
"""

from __future__ import annotations

import asyncio
import logging
from collections import deque
from typing import Any, cast

from redis.asyncio import Redis

from core.streaming.hub import BufferInfo, BufferState, StreamEvent, SubscriberOverflowError
from core.streaming.redis_outage import OUT_OF_REACH, RETRY_S, RedisReach
from core.streaming.redis_scripts import FOLLOW_BLOCK_MS, REPLAY_BATCH, HubKeys, decode_event, entry_id

log = logging.getLogger(__name__)

_END = object()

#: A stream entry (id, fields) as a client with `decode_responses=True` returns it (the stubs say bytes | str).
Entry = tuple[str, dict[str, str]]

#: How long a replay or a fill waits for Redis to come back before its reader fails.
OUTAGE_READ_WAIT_S = 30.0

#: What a follower or an append hands a subscriber: ("event" | "end", event number, event).
LiveItem = tuple[str, int, StreamEvent]

#: The newest events of each stream this replica writes that it keeps for its own readers' replays: a turn's stream
#: route reads from the turn's start, and a reader that resumes (Last-Event-ID) usually from a few events back.
OWNER_TAIL_EVENTS = 256


class OwnerTail:
    """The newest events of one stream this replica writes, as its appends were written (or held for Redis).

    `complete_from` is the lowest id from which every event written since is here; a range asked from below it,
    or with a hole in it (an append still on its way while a later one came back first), is read from Redis.
    """

    def __init__(self, first: int) -> None:
        self.complete_from = first
        self.events: deque[StreamEvent] = deque()

    def add(self, event: StreamEvent) -> None:
        """Keep `event` (ids in order: one that comes back after a later one goes in its place)."""
        if not self.events or event.id > self.events[-1].id:
            self.events.append(event)
        elif event.id >= self.complete_from and all(held.id != event.id for held in self.events):
            at = next(i for i, held in enumerate(self.events) if held.id > event.id)
            self.events.insert(at, event)
        if len(self.events) > OWNER_TAIL_EVENTS:
            self.complete_from = self.events.popleft().id + 1

    def range(self, start: int, up_to: int | None) -> list[StreamEvent] | None:
        """Events `start`.. (before `up_to`), or None when this tail may miss one of them (read Redis)."""
        if start < self.complete_from:
            return None
        found = [event for event in self.events if event.id >= start and (up_to is None or event.id < up_to)]
        if any(event.id != start + i for i, event in enumerate(found)):
            return None  # a hole: an earlier append not back yet (Redis has it if a later one's fill needs it)
        if up_to is not None and len(found) != up_to - start:
            return None
        return found


class RedisSubscription:
    """Replay of a shared buffer after an id (`XRANGE`), then its live events from this replica's follower.

    Registered with the follower at construction, so nothing appended afterwards is missed; a
    live event that arrives ahead of what was replayed triggers a fill of the ids in between.
    """

    def __init__(self, readers: StreamReaders, info: BufferInfo, after: int | None) -> None:
        self.key = info.key
        self._readers = readers
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
            readers.register(self)

    @property
    def position(self) -> int:
        """The last id this subscriber was handed (or skipped)."""
        return self._last

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
                raise SubscriberOverflowError(
                    f"subscriber of {self.key!r} fell behind by {self._readers.subscriber_queue} events"
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
        for number, seq, event in await self._readers.replay(self.key, self._last + 1, up_to):
            if seq:  # the end entry of this buffer (those of earlier buffers were trimmed when it was opened)
                self._ended = True
                return
            if number > self._last:
                self._last = number
                self._pending.append(event)

    def push(self, item: LiveItem) -> None:
        """Take one live item; a subscriber that lags `subscriber_queue` items behind is cut off."""
        if self._queue.qsize() >= self._readers.subscriber_queue:
            self._overflowed = True
            self._unregister()
            return
        self._queue.put_nowait(item)

    def cut_off(self) -> None:
        """End this subscriber with `SubscriberOverflowError` after what it has (its follower failed): it may resume."""
        self._overflowed = True
        if self._queue.qsize() >= self._readers.subscriber_queue:
            self._unregister()  # full: it ends with `SubscriberOverflowError` once it has taken what is queued
            return
        self._queue.put_nowait(_END)

    def _unregister(self) -> None:
        self._readers.unregister(self)

    def close(self) -> None:
        """Stop receiving; safe to call more than once."""
        self._unregister()
        self._pending.clear()
        if not self._closed:
            self._closed = True
            self._queue.put_nowait(_END)


class StreamReaders:
    """This replica's subscribers of shared buffers, and the followers that read Redis for them.

    Args:
        redis: the client of the replays (`XRANGE`).
        client: the client of the followers' blocking reads (one connection per followed stream).
        keys: the hub's key layout.
        owned: the keys this replica writes (shared with the hub): their appends deliver to their subscribers.
        mirror: this replica's view of each buffer's state (shared with the hub); a follower moves `last_id`.
        subscriber_queue: live items one subscriber may lag behind before it is cut off.
        reach: this replica's record of Redis's failures (a follower waits out an outage and goes on).
    """

    def __init__(
        self,
        redis: Redis,
        client: Redis,
        keys: HubKeys,
        *,
        owned: set[str],
        mirror: dict[str, BufferInfo],
        subscriber_queue: int,
        reach: RedisReach | None = None,
    ) -> None:
        self.redis = redis
        self.client = client
        self.keys = keys
        self.subscriber_queue = subscriber_queue
        self.stopped = False
        self.subscribers: dict[str, set[RedisSubscription]] = {}
        self.followers: dict[str, asyncio.Task[None]] = {}
        self._owned = owned
        self._mirror = mirror
        self.reach = reach if reach is not None else RedisReach()
        #: The newest events of the streams this replica opened and writes (`OwnerTail`).
        self.tails: dict[str, OwnerTail] = {}

    def count(self, key: str) -> int:
        """How many subscribers of `key` this replica has."""
        return len(self.subscribers.get(key, ()))

    def lowest_position(self, key: str) -> int | None:
        """The oldest id any local subscriber of `key` has had (None: no subscriber)."""
        subs = self.subscribers.get(key)
        return min(sub.position for sub in subs) if subs else None

    async def replay(self, key: str, start: int, up_to: int | None) -> list[tuple[int, int, StreamEvent]]:
        """What a subscriber replays or fills: `range`, from this replica's own tail of the stream when it can.

        On an open stream this replica writes, the events it keeps (`OwnerTail`) when they cover the range: what
        was written but is not back yet is missing from it, and comes to the subscriber live.
        """
        tail, info = self.tails.get(key), self._mirror.get(key)
        # Not for a finished buffer: its replay ends at the end entry, which only Redis has.
        if tail is not None and key in self._owned and info is not None and info.state is BufferState.OPEN:
            held = tail.range(start, up_to)
            if held is not None:
                return [(event.id, 0, event) for event in held]
        return await self.range(key, start, up_to)

    async def range(self, key: str, start: int, up_to: int | None) -> list[tuple[int, int, StreamEvent]]:
        """Entries from event `start` on (before event `up_to` when given): (number, seq, event); seq > 0: an end.

        While Redis is out of reach it tries again for up to `OUTAGE_READ_WAIT_S` (a reader waits out a short
        outage), then raises.
        """
        out: list[tuple[int, int, StreamEvent]] = []
        low = f"{start - 1}-1"  # event `start` and an end entry right after event `start - 1`
        high = f"({up_to}-0" if up_to is not None else "+"
        give_up = asyncio.get_running_loop().time() + OUTAGE_READ_WAIT_S
        while True:
            try:
                entries = cast(
                    "list[Entry]", await self.redis.xrange(self.keys.stream(key), low, high, count=REPLAY_BATCH)
                )
            except OUT_OF_REACH as exc:
                self.reach.failed(exc)
                if asyncio.get_running_loop().time() > give_up:
                    raise
                await asyncio.sleep(RETRY_S)
                continue
            for raw_id, fields in entries:
                number, seq = entry_id(raw_id)
                out.append((number, seq, decode_event(number, fields)))
            if len(entries) < REPLAY_BATCH:
                return out
            low = f"({entries[-1][0]}"

    def register(self, sub: RedisSubscription) -> None:
        """Hand `sub` the live items of its key from now on (following the stream unless this replica writes it)."""
        self.subscribers.setdefault(sub.key, set()).add(sub)
        if sub.key not in self._owned:  # an owned stream's appends deliver to its subscribers themselves
            self.follow_soon(sub.key)

    def unregister(self, sub: RedisSubscription) -> None:
        """Hand `sub` nothing more; safe to call more than once."""
        subs = self.subscribers.get(sub.key)
        if subs is not None:
            subs.discard(sub)
            if not subs:
                del self.subscribers[sub.key]

    def follow_soon(self, key: str, after: int | None = None) -> None:
        """Start the follower of `key` unless one runs (from the newest entry, or after event `after`)."""
        if key not in self.followers:
            self.followers[key] = asyncio.get_running_loop().create_task(
                self._follow(key, after), name=f"redis hub: follow {key}"
            )

    def deliver(self, key: str, item: LiveItem) -> None:
        """Hand one live event (or the end) to this replica's subscribers of `key`.

        A subscriber skips ids it already has (its replay, or the follower when both run), and fills
        from Redis the ids it missed, so two paths to it never repeat or lose an event.
        """
        for sub in tuple(self.subscribers.get(key, ())):
            sub.push(item)

    def deliver_own(self, key: str, event: StreamEvent) -> None:
        """An event this replica wrote (or holds for Redis) on a stream it writes: kept in its tail, delivered."""
        if (tail := self.tails.get(key)) is not None:
            tail.add(event)
        self.deliver(key, ("event", event.id, event))

    def stop(self) -> list[asyncio.Task[None]]:
        """Cancel every follower; returns their tasks (to await)."""
        self.stopped = True
        tasks = list(self.followers.values())
        for task in tasks:
            task.cancel()
        self.followers.clear()
        return tasks

    async def _follow(self, key: str, after: int | None = None) -> None:
        """This replica's one reader of a stream: hands each new entry to the local subscribers of `key`.

        From the newest entry on (its subscribers replay what came before), or from the entries
        after event `after` (the end entry after it included). While Redis is out of reach it tries again
        every `RETRY_S` from where it was: its subscribers wait, and get what the owner held meanwhile.
        """
        stream = self.keys.stream(key)
        cursor = None if after is None else f"{after}-0"
        try:
            while self.subscribers.get(key) and not self.stopped:
                try:
                    if cursor is None:
                        top = cast("list[Entry]", await self.client.xrevrange(stream, "+", "-", count=1))
                        cursor = top[0][0] if top else "0-0"
                    reply = cast(
                        "list[tuple[str, list[Entry]]] | None",
                        await self.client.xread({stream: cursor}, block=FOLLOW_BLOCK_MS, count=REPLAY_BATCH),
                    )
                except OUT_OF_REACH as exc:
                    if self.stopped:
                        return
                    self.reach.failed(exc)
                    await asyncio.sleep(RETRY_S)
                    continue
                for _name, entries in reply or ():
                    for raw_id, fields in entries:
                        cursor = raw_id
                        number, seq = entry_id(raw_id)
                        event = decode_event(number, fields)
                        kind = "end" if seq else "event"
                        info = self._mirror.get(key)
                        if info is not None and kind == "event" and number > info.last_id:
                            info.last_id = number
                        self.deliver(key, (kind, number, event))
        except asyncio.CancelledError:
            raise
        except Exception:
            if not self.stopped:
                log.exception("following stream %s failed; its readers end here and may resume", key)
            for sub in tuple(self.subscribers.get(key, ())):
                sub.cut_off()
        finally:
            if self.followers.get(key) is asyncio.current_task():
                del self.followers[key]
            if self.subscribers.get(key) and not self.stopped and key not in self._owned:
                self.follow_soon(key)  # a subscriber came while this one was leaving
