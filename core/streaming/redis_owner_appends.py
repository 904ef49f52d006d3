"""The owner's appends on their way to Redis: the turn goes on while they are, and learns how they ended later.

A replica counts the ids of the streams it runs (`RedisStreamHub`), so an append needs nothing back from Redis
before the turn's next token: the event goes to this replica's readers at once, joins the next batch
(`AppendBatches`), and what Redis answered is settled when the batch comes back. Awaiting each append was a
second wake-up of the turn per token, and a future and a shield more, about a third of what a replica spent per
token beyond one process (py-spy at N = 100, issue 41).

What an answer can say, and what follows from it:

- written, or stored already (a repeat): nothing;
- held (an earlier id of the stream waits for Redis) or Redis out of reach: the event waits in the outage buffer
  (`redis_outage`), after the earlier ones of its stream, which were settled first (batches go in order);
- refused (the stream was ended elsewhere, or is unknown: the lease ran out and a reaper ended it) or an error:
  the next append of the stream raises it, as the refused one would have.

`finish` waits until every append of the stream sent so far is settled (`settled`), so the end goes after them and
after any of them that now wait for Redis. A stream with `window` appends on their way waits for them before the
next, so a slow Redis slows its turns instead of filling memory.
"""

from __future__ import annotations

import asyncio
from collections import Counter
from collections.abc import Callable

from core.streaming.hub import StreamClosedError, UnknownStreamError
from core.streaming.redis_batches import HELD, Append, AppendBatches
from core.streaming.redis_outage import OUT_OF_REACH, RedisReach
from core.streaming.redis_scripts import as_int

#: Appends of one stream on their way to Redis at most; the next one waits until they are settled.
WINDOW = 64


class OwnerAppends:
    """The appends of the streams this replica runs, sent without waiting (see the module docstring).

    Args:
        batches: where the appends go (in order, in batches).
        held: `OutageBuffer.add`, for an event that must wait for Redis.
        reach: told when Redis was out of reach.
        window: appends of one stream on their way at most.
    """

    def __init__(
        self,
        batches: AppendBatches,
        *,
        held: Callable[[str, int, str, str], None],
        reach: RedisReach,
        window: int = WINDOW,
    ) -> None:
        self._batches = batches
        self._held = held
        self._reach = reach
        self.window = window
        #: Appends of each stream sent and not settled yet.
        self.in_flight: Counter[str] = Counter()
        #: Who waits for a stream's appends to be settled (`settled`), told when none is left in flight.
        self._waiters: dict[str, list[asyncio.Future[None]]] = {}
        self._refused: dict[str, BaseException] = {}

    def check(self, key: str) -> None:
        """Raise what Redis answered an earlier append of `key` with, if it refused one."""
        refused = self._refused.get(key)
        if refused is not None:
            raise refused

    async def room(self, key: str) -> None:
        """Wait while `key` has `window` appends on their way (a slow Redis holds its turns back)."""
        if self.in_flight[key] >= self.window:
            await self.settled(key)

    def send(self, append: Append) -> None:
        """Queue `append` for the next batch; what Redis answers is settled when it comes back (`_settle`)."""
        self.in_flight[append.key] += 1
        self._batches.send(append, self._settle)

    async def settled(self, key: str) -> None:
        """Until every append of `key` sent so far is answered and settled."""
        while self.in_flight[key]:
            waiter: asyncio.Future[None] = asyncio.get_running_loop().create_future()
            self._waiters.setdefault(key, []).append(waiter)
            await asyncio.shield(waiter)  # a canceled waiter leaves the others' futures alone

    def forget(self, key: str) -> None:
        """`key`'s buffer ended (or a new one opens): no refusal of the old one is kept."""
        self._refused.pop(key, None)

    def _settle(self, append: Append, answer: object) -> None:
        key = append.key
        self.in_flight[key] -= 1
        if self.in_flight[key] <= 0:
            del self.in_flight[key]
            for waiter in self._waiters.pop(key, ()):
                if not waiter.done():
                    waiter.set_result(None)
        if isinstance(answer, BaseException) and not isinstance(answer, OUT_OF_REACH):
            self._refused.setdefault(key, answer)
            return
        if isinstance(answer, BaseException):
            self._reach.failed(answer)
        result = HELD if isinstance(answer, BaseException) else as_int(answer)
        if result == HELD:
            self._held(key, append.event_id, append.type, append.payload)
        elif result == -1:
            self._refused.setdefault(key, StreamClosedError(f"stream {key!r} is finished"))
        elif result == -2:
            self._refused.setdefault(key, UnknownStreamError(key))
