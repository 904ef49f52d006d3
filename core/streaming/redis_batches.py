"""The appends of a Redis stream hub, batched: those ready together go to Redis in one round trip."""

from __future__ import annotations

import asyncio
from typing import Any

from redis.asyncio import Redis
from redis.commands.core import AsyncScript
from redis.exceptions import NoScriptError, RedisError


class AppendBatches:
    """The appends of a replica, sent in order, those that are ready together in one round trip.

    A turn awaits each append before the next, so 80 turns streaming are 80 appends in flight at
    any time: one `EVALSHA` each, with its own connection checkout, write and read. Here the
    appends submitted while a batch is on its way wait for it and go together in the next one
    (a pipeline without a transaction: each script still runs on its own, in order). One batch at
    a time keeps the order in which they were submitted. With `gather_s`, a batch that follows
    another waits that long for more appends first: fewer, larger batches, each append at most
    `gather_s` later (the first append after a quiet spell goes at once). Redis's CPU for the append
    script, measured alone: about 55 µs in batches of one, 15 µs in batches of ten or more. With the
    hub alone (100 streams at 50 appends/s), 2 ms took batches from 4-5 to about 30 appends and cut
    Redis's CPU per append by a third; in the app the difference stayed within the noise
    (`bench_cluster.py --cost`, bench/README.md), so it is off (0) unless configured (issue 41).
    """

    def __init__(self, redis: Redis, script: AsyncScript, *, gather_s: float = 0.0) -> None:
        self._redis = redis
        self._script = script
        #: While appends keep coming, how long the writer lets the next batch fill after one has gone (issue 41).
        self.gather_s = gather_s
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

    async def _pipelined(self, batch: list[tuple[list[Any], list[Any], asyncio.Future[Any]]]) -> list[Any]:
        """The batch's scripts in one pipeline, by their SHA.

        Not through the script object: a pipeline that holds one asks `SCRIPT EXISTS` first, a round
        trip (and a command on Redis) more for every batch. A script Redis does not know (restarted,
        flushed) fails with NOSCRIPT without running; those run again one by one, in order, through
        the script object, which loads it.
        """
        pipe = self._redis.pipeline(transaction=False)
        sha = self._script.sha
        for keys, args, _ in batch:
            pipe.evalsha(sha, len(keys), *keys, *args)
        results: list[Any] = await pipe.execute(raise_on_error=False)
        for i, result in enumerate(results):
            if isinstance(result, NoScriptError):
                keys, args, _ = batch[i]
                try:
                    results[i] = await self._script(keys=keys, args=args)
                except Exception as exc:
                    results[i] = exc
        return results

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
                        results = await self._pipelined(batch)
                except Exception as exc:  # the connection failed: every append of the batch fails with it
                    results = [exc] * len(batch)
                for (_, _, done), result in zip(batch, results, strict=True):
                    if done.done():
                        continue
                    if isinstance(result, BaseException):
                        done.set_exception(result)
                    else:
                        done.set_result(result)
                batch = []
                if self.gather_s:  # busy: the next batch fills a little before it goes
                    await asyncio.sleep(self.gather_s)
        finally:  # canceled (the hub stops): no append waits for an answer that will not come
            for _, _, done in [*batch, *self._pending]:
                if not done.done():
                    done.set_exception(RedisError("the Redis hub stopped before this append was sent"))
            self._pending = []
