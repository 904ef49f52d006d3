"""The owner's appends to a Redis stream hub, batched: plain `XADD`s at the ids it counted, in one round trip.

docs/ARCHITECTURE.md, "Cluster" ("What the shared services carry") says why: the `append_at` script cost Redis about
15 µs per token, a plain `XADD` about 3 µs; and redis-py's pipeline cost the client about 50 µs per `XADD`, so the
`XADD`s are packed here and their replies read under one timeout (`redis_wire.py`).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from redis.asyncio import Redis
from redis.commands.core import AsyncScript
from redis.exceptions import NoScriptError, RedisError, ResponseError

from core.streaming.redis_wire import bulk, call_packed

log = logging.getLogger(__name__)

#: `XADD`'s answer to an id at or below the stream's newest entry: that event was stored already.
_STORED = "equal or smaller than the target stream top item"
#: An append not sent because an earlier id of its stream is not known to be stored (it waits for Redis).
HELD = -3
#: The owner's `XADD <stream> MAXLEN ~ <max> <id>-0 t <type> d <data>`, packed: its constant parts, and the lengths and
#: values of the others to fill in (the trimming, `MAXLEN ~ <max>`, is packed once per hub).
_XADD_FORMAT = (
    b"*10\r\n"
    + bulk(b"XADD")
    + b"$%d\r\n%s\r\n%s$%d\r\n%s\r\n"
    + bulk(b"t")
    + b"$%d\r\n%s\r\n"
    + bulk(b"d")
    + b"$%d\r\n%s\r\n"
)


@dataclass(slots=True)
class Append:
    """One event of a stream this replica opened, at the id it counted."""

    key: str
    event_id: int
    keys: list[str]  # the stream, the state hash
    type: str
    payload: str


#: Told what Redis answered an append: its id (written, or stored already), `HELD`, -1/-2 (the script) or an error.
Answered = Callable[[Append, Any], None]


def _answer(answered: Answered, append: Append, answer: Any) -> None:
    """Hand `answer` on; a receiver that fails is logged, and the batch's other appends still get theirs."""
    try:
        answered(append, answer)
    except Exception:
        log.exception("settling the append of event %d of stream %r failed", append.event_id, append.key)


def _resolve(done: asyncio.Future[Any], answer: Any) -> None:
    if done.done():
        return
    if isinstance(answer, BaseException):
        done.set_exception(answer)
    else:
        done.set_result(answer)


class AppendBatches:
    """The owner's appends, sent in order, those that are ready together in one round trip.

    A turn awaits each append before the next, so 80 turns streaming are 80 appends in flight at any time.
    Here the appends submitted while a batch is on its way wait for it and go together in the next one (one
    write, no transaction), one batch at a time so that they keep their order.

    While this replica's lease on the stream is valid (`lease_ok`: nobody can have taken it over), each append is
    one `XADD stream MAXLEN ~ max <id>-0`: no script, no state hash (the hub's scripts read the next id off the
    stream). These are packed here and their replies read under one timeout for the batch, on a connection of the
    client's pool (`redis_wire.py`): redis-py's pipeline cost the client about 50 µs per `XADD` (packing each
    argument in Python, a timeout per reply), this a fifth to a third of it, and Redis runs the same commands. An
    id at or below the stream's newest entry is refused by Redis: it was stored already (a retry after a lost
    answer, an outage's replay), so it counts as written. Otherwise (the lease may have run out: an outage, a
    stalled loop) each goes through the `append_at` script, which also checks the stream is still open and this
    owner's, in a redis-py pipeline (rare: not worth packing here).

    Ids are kept in order per stream: `stored` has the newest id of each stream known to be in Redis, and an
    append whose previous id is neither stored nor ahead of it in the same batch is not sent (`HELD`: it waits
    behind the earlier one in the outage buffer), so a later event never lands before an earlier one that
    failed, which `XADD` would then refuse as stored. A failure of the connection fails every append of its batch
    (the outage buffer holds them). With `gather_s`, a batch that follows another waits that long for more
    appends first (measured with the `append_at` script: batches of 4-5 became about 30 and Redis's CPU per append
    fell by a third with the hub alone, not beyond the noise in the app; off unless configured, issue 41).
    """

    def __init__(
        self,
        redis: Redis,
        script: AsyncScript,
        *,
        owner: str,
        max_events: int,
        lease_ok: Callable[[str], bool],
        gather_s: float = 0.0,
    ) -> None:
        self._redis = redis
        self._script = script
        self._owner = owner
        self._max_events = max_events
        self._trim = bulk(b"MAXLEN") + bulk(b"~") + bulk(b"%d" % max_events)
        self._lease_ok = lease_ok
        #: While appends keep coming, how long the writer lets the next batch fill after one has gone (issue 41).
        self.gather_s = gather_s
        #: The newest id of each stream this replica writes that Redis is known to have.
        self.stored: dict[str, int] = {}
        self._pending: list[tuple[Append, Answered]] = []
        self._writer: asyncio.Task[None] | None = None

    def submit(self, append: Append) -> asyncio.Future[Any]:
        """Queue one append; its future: the id (written, or stored already), `HELD`, -1/-2 (the script), an error."""
        done: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        self.send(append, lambda _append, answer: _resolve(done, answer))
        return done

    def send(self, append: Append, answered: Answered) -> None:
        """Queue one append; `answered(append, answer)` gets what `submit`'s future would hold (its error as a value).

        It is called as soon as the batch's replies are read: no future and no extra pass of the event loop per
        append (issue 41: these were about a tenth of the hub's client CPU per token).
        """
        self._pending.append((append, answered))
        if self._writer is None or self._writer.done():
            self._writer = asyncio.get_running_loop().create_task(self._write(), name="redis hub: appends")

    def _script_args(self, append: Append) -> list[Any]:
        return [append.type, append.payload, self._max_events, append.event_id, self._owner, "1"]

    async def _send(self, batch: list[Append]) -> list[Any]:
        """The batch: each an `XADD` (or the checked script), or `HELD` when an earlier id is missing.

        Raises what the connection raised (refused, cut, timed out): every append of the batch failed.
        """
        expect = dict(self.stored)
        results: list[Any] = [HELD] * len(batch)
        plain: list[int] = []
        checked: list[int] = []
        lease_ok: dict[str, bool] = {}  # asked once per stream: its appends of one batch go the same way
        for i, append in enumerate(batch):
            before = expect.get(append.key)
            if before is not None and append.event_id > before + 1:
                continue  # an earlier id of this stream failed or waits: this one waits behind it
            expect[append.key] = max(append.event_id, before or 0)
            ok = lease_ok.get(append.key)
            if ok is None:
                ok = lease_ok[append.key] = self._lease_ok(append.key)
            (plain if ok else checked).append(i)
        if plain:
            self._settle(batch, plain, await self._send_plain([batch[i] for i in plain]), results)
        if checked:
            self._settle(batch, checked, await self._send_checked([batch[i] for i in checked]), results)
        return results

    def _settle(self, batch: list[Append], sent: list[int], answers: list[Any], results: list[Any]) -> None:
        """Put the answers to the appends `sent` (their places in `batch`) in `results`; note the ids stored."""
        for i, answer in zip(sent, answers, strict=True):
            append = batch[i]
            if isinstance(answer, int) and answer >= 0:
                self.stored[append.key] = max(answer, self.stored.get(append.key, 0))
            results[i] = answer

    async def _send_plain(self, appends: list[Append]) -> list[Any]:
        """The `XADD`s of appends under a valid lease, in one write: per append its id (written, stored) or error."""
        packed = b"".join([self.xadd_command(append) for append in appends])
        answers = await call_packed(self._redis, packed, len(appends))
        return [
            append.event_id
            if not isinstance(answer, ResponseError) or _STORED in str(answer)  # an entry id: written; or stored
            else answer
            for append, answer in zip(appends, answers, strict=True)
        ]

    def xadd_command(self, append: Append) -> bytes:
        """`XADD <stream> MAXLEN ~ <max> <id>-0 t <type> d <data>`, packed as `redis_wire.pack_command` packs it.

        In one formatting: a call of `bulk` per argument cost nearly twice as much (cProfile).
        """
        stream, entry, type, data = (
            append.keys[0].encode(),
            b"%d-0" % append.event_id,
            append.type.encode(),
            append.payload.encode(),
        )
        return _XADD_FORMAT % (len(stream), stream, self._trim, len(entry), entry, len(type), type, len(data), data)

    async def _send_checked(self, appends: list[Append]) -> list[Any]:
        """The appends whose lease may have run out, each by `append_at`, in one pipeline: its id, -1/-2, an error.

        The script goes by its SHA, not through the script object: a pipeline that holds one asks `SCRIPT EXISTS`
        first, a round trip more. A script Redis does not know (restarted, flushed) fails with NOSCRIPT without
        running; those run again one by one, in order, through the script object, which loads it.
        """
        pipe = self._redis.pipeline(transaction=False)
        for append in appends:
            pipe.evalsha(self._script.sha, len(append.keys), *append.keys, *self._script_args(append))
        answers: list[Any] = await pipe.execute(raise_on_error=False)
        results: list[Any] = []
        for append, answer in zip(appends, answers, strict=True):
            if isinstance(answer, NoScriptError):
                try:
                    answer = await self._script(keys=append.keys, args=self._script_args(append))
                except Exception as exc:
                    answer = exc
            results.append(answer)
        return results

    async def _write(self) -> None:
        batch: list[tuple[Append, Answered]] = []
        try:
            await asyncio.sleep(0)  # what else is appended in this pass of the loop goes along
            while self._pending:
                batch, self._pending = self._pending, []
                try:
                    results = await self._send([append for append, _ in batch])
                except Exception as exc:  # the connection failed: every append of the batch fails with it
                    results = [exc] * len(batch)
                for (append, answered), result in zip(batch, results, strict=True):
                    _answer(answered, append, result)
                batch = []
                if self.gather_s:  # busy: the next batch fills a little before it goes
                    await asyncio.sleep(self.gather_s)
        finally:  # canceled (the hub stops): no append waits for an answer that will not come
            stopped = RedisError("the Redis hub stopped before this append was sent")
            for append, answered in [*batch, *self._pending]:
                _answer(answered, append, stopped)
            self._pending = []
