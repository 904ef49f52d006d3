"""One replica of a Redis stream hub among the others: its name, its leases, and what it hears from them.

A replica holds its `INSTANCE_ID` in Redis (`replica:<owner>`, renewed with its leases), so a second
process under the same name is refused. It holds a lease on each open buffer it writes and renews
them; a replica that stops renewing loses its buffers to the reaper (`expired`, `take_over`). Cancels
(`request_cancel`) and the changes of buffers opened elsewhere reach every replica over pub/sub.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import secrets
import time
from collections import deque
from collections.abc import Awaitable, Callable
from typing import Any

from redis.asyncio import Redis
from redis.commands.core import AsyncScript
from redis.exceptions import RedisError

from core.errors import AppError
from core.streaming.hub import BufferInfo
from core.streaming.redis_mirror import parse_change
from core.streaming.redis_outage import OUT_OF_REACH, RETRY_S, RedisReach
from core.streaming.redis_readers import StreamReaders
from core.streaming.redis_scripts import HubKeys, as_int, now_ms

log = logging.getLogger(__name__)


# What a cluster's Redis must be set to (README, "Running as several replicas"), and what is lost otherwise.
#: How long a change this replica made waits for its message to come back before it is no longer counted on.
ECHO_WAIT_S = 10.0

REQUIRED_REDIS_SETTINGS = {
    "appendonly": (
        "yes",
        "without it a restart of Redis loses the running turns' and tasks' streams, the results still owed "
        "to chats and the replicas' leases",
    ),
    "maxmemory-policy": (
        "noeviction",
        "any other policy lets Redis evict the running turns' and tasks' streams, the results still owed to "
        "chats and the replicas' leases when its memory runs short",
    ),
}


def check_redis_settings(url: str) -> list[str]:
    """At a cluster's start (blocking): log a WARNING for each Redis setting that is not what a cluster needs.

    Reads `appendonly` and `maxmemory-policy` with CONFIG GET; where CONFIG is disabled or refused (managed
    Redis, ACLs) it logs that it could not check instead. Returns the warnings it logged.
    """
    import redis as redis_sync

    client = redis_sync.Redis.from_url(url, decode_responses=True, socket_connect_timeout=5, socket_timeout=5)
    warnings = []
    try:
        for name, (required, why) in REQUIRED_REDIS_SETTINGS.items():
            try:
                found = client.config_get(name).get(name)
            except RedisError as exc:  # CONFIG renamed or disabled, or refused by an ACL
                found, problem = None, str(exc)
            else:
                problem = "it did not answer CONFIG GET"
            if found is None:
                log.info(
                    "could not check Redis's %s (%s); a cluster needs %s %s: %s", name, problem, name, required, why
                )
            elif found.lower() != required:
                message = f"Redis has {name} {found}; a cluster needs {name} {required}: {why}"
                log.warning(message)
                warnings.append(message)
    finally:
        client.close()
    return warnings


class DuplicateReplicaError(AppError, RuntimeError):
    """Another live replica already runs under this INSTANCE_ID."""

    code = "duplicate_replica"


class ReplicaLeases:
    """This replica's name, its leases on the buffers it writes, and the cancels and changes other replicas send.

    Over 300 lines on purpose: the leases, what they allow (`lease_valid`), the name renewed with them and the
    cancels and changes read on the same renewals are one replica's standing in the cluster, over one set of keys.

    Args:
        redis: the client of the hub's commands.
        keys: the hub's key layout.
        scripts: the hub's scripts by name (`renew`, `take_over`, `cancel`).
        readers: this replica's readers (a buffer whose lease was lost is followed from Redis for them).
        owner: this replica's `INSTANCE_ID`.
        lease_s: how long a claim (on the name, on an open buffer) lasts without renewal.
        owned: the keys this replica writes (shared with the hub).
        refresh: reads a buffer's state from Redis into the hub's mirror.
        apply: takes the state a change message carries into the hub's mirror (None: not enough, read it).
        reach: this replica's record of Redis's failures (a failed renewal is tried again every `RETRY_S`).
        infos: the hub's mirror (shared): a change this replica made itself is read there, not from Redis.
    """

    def __init__(
        self,
        redis: Redis,
        keys: HubKeys,
        scripts: dict[str, AsyncScript],
        readers: StreamReaders,
        *,
        owner: str,
        lease_s: float,
        owned: set[str],
        refresh: Callable[[str], Awaitable[BufferInfo | None]],
        apply: Callable[[dict[str, Any]], BufferInfo | None] | None = None,
        reach: RedisReach | None = None,
        infos: dict[str, BufferInfo] | None = None,
    ) -> None:
        self.redis = redis
        self.keys = keys
        self.owner = owner
        self.lease_s = lease_s
        self.stopped = False
        self.cancel_handlers: list[Callable[[str], Awaitable[bool]]] = []
        self.change_handlers: list[Callable[[BufferInfo], Awaitable[None]]] = []
        self._scripts = scripts
        self._readers = readers
        self._owned = owned
        self._refresh = refresh
        self._apply = apply if apply is not None else lambda _change: None
        self.reach = reach if reach is not None else RedisReach()
        self._replica_key = keys.replica(owner)
        self._infos: dict[str, BufferInfo] = infos if infos is not None else {}
        #: Changes this replica made itself whose message has not come back yet: key -> when each was made.
        self._echoes: dict[str, deque[list[float]]] = {}
        self._boot = secrets.token_hex(8)  # this process, among processes that might share the name by mistake
        #: The lease each buffer this replica writes holds in Redis, as it last wrote it (ms since the epoch).
        self._leases: dict[str, int] = {}

    async def changing(self, key: str, script: Awaitable[Any]) -> int:
        """Await a hub script that changes `key` and publishes it on the changes channel when it answers >= 0.

        Its message is expected before the script is sent, so it cannot come back unexpected; the
        expectation is withdrawn when the script failed or answered < 0 (nothing changed or published).
        """
        mark = self.expect_echo(key)
        try:
            result = as_int(await script)
        except BaseException:
            self.withdraw_echo(key, mark)
            raise
        if result < 0:
            self.withdraw_echo(key, mark)
        return result

    def expect_echo(self, key: str) -> list[float]:
        """Before this replica changes `key` (a script that publishes it): its message will come back.

        Returns the expectation, for `withdraw_echo` when the script did not publish (refused, failed).
        Made before the script is sent, so the message cannot come back before it is expected.
        """
        mark = [time.monotonic()]
        self._echoes.setdefault(key, deque()).append(mark)
        return mark

    def withdraw_echo(self, key: str, mark: list[float]) -> None:
        """The change of `key` was not made (or may not have been): its message is not counted on."""
        sent = self._echoes.get(key)
        if sent is not None:
            with contextlib.suppress(ValueError):
                sent.remove(mark)
            if not sent:
                del self._echoes[key]

    def _own_echo(self, key: str) -> bool:
        """Whether a change message of `key` is taken as this replica's own (its mirror has the change).

        Messages come in the order they were published. Another replica's change that comes while
        this one's is expected is taken for it: what it carried comes with this replica's own
        message, which comes after it and carries the state both left (then taken as another's). An
        expectation older than `ECHO_WAIT_S` is not counted on (its message was lost): the message is applied.
        """
        sent = self._echoes.get(key)
        if not sent:
            return False
        [at] = sent.popleft()
        if not sent:
            del self._echoes[key]
        return time.monotonic() - at < ECHO_WAIT_S and key in self._infos

    def lease_until(self) -> int:
        """When a lease taken now runs out (ms since the epoch)."""
        return now_ms() + int(self.lease_s * 1000)

    def leased(self, key: str, until: int) -> None:
        """This replica wrote the lease `until` on `key` (opened it, or renewed it)."""
        self._leases[key] = until

    def lease_valid(self, key: str) -> bool:
        """True while this replica's lease on `key` has over a third left: no reaper can have taken `key` over.

        Its appends are then plain `XADD`s (docs/ARCHITECTURE.md, "Cluster"); the margin covers clocks that differ.
        """
        return key in self._owned and now_ms() < self._leases.get(key, 0) - int(self.lease_s * 1000 / 3)

    # -- the name ----------------------------------------------------------------------

    async def claim(self) -> None:
        """Hold this replica's name unless `claim_name` took it already.

        Raises:
            DuplicateReplicaError: another live replica runs under the same name.
        """
        await self.redis.ping()
        if await self.redis.get(self._replica_key) != self._boot:  # `claim_name` was not called before serving
            if not await self.redis.set(self._replica_key, self._boot, nx=True, px=int(self.lease_s * 1000)):
                raise DuplicateReplicaError(self._duplicate_message())

    def claim_name(self, url: str) -> None:
        """Before serving (blocking, a client of its own): take this replica's INSTANCE_ID for this process.

        Raises:
            DuplicateReplicaError: another live replica runs under the same name.
        """
        import redis as redis_sync

        client = redis_sync.Redis.from_url(url, decode_responses=True, socket_connect_timeout=5)
        try:
            if not client.set(self._replica_key, self._boot, nx=True, px=int(self.lease_s * 1000)):
                raise DuplicateReplicaError(self._duplicate_message())
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

    async def release(self) -> None:
        """Give the name back as the process stops: a restart may take it at once."""
        if await self.redis.get(self._replica_key) == self._boot:
            await self.redis.delete(self._replica_key)

    def _duplicate_message(self) -> str:
        return (
            f"another replica runs with INSTANCE_ID={self.owner!r} (or one with that name stopped less than "
            f"{self.lease_s:g} s ago): give every replica its own INSTANCE_ID"
        )

    # -- leases ------------------------------------------------------------------------

    async def renew_forever(self) -> None:
        """Renew the name and the leases, every third of a lease, until the hub stops.

        A renewal that fails because Redis is out of reach is tried again every `RETRY_S`, so the leases (and the
        name) are taken back as soon as Redis answers: a lease that ran out meanwhile is still this replica's while
        no reaper took it, and reapers wait a lease after an outage (docs/ARCHITECTURE.md, "Cluster").
        """
        interval = max(0.2, self.lease_s / 3)
        delay = interval
        # `stopped`, not only the cancel: redis-py may turn a cancelled read into its TimeoutError.
        while not self.stopped:
            await asyncio.sleep(delay)
            try:
                await self.renew()
                self.reach.reached()
                delay = interval
            except OUT_OF_REACH as exc:
                self.reach.failed(exc)
                delay = min(interval, RETRY_S)
            except RedisError as exc:
                log.warning("could not renew the leases of %d running streams: %s", len(self._owned), exc)

    async def renew(self) -> None:
        """Renew the name and the lease of every buffer this replica writes; act on lost leases and missed cancels."""
        if await self.redis.get(self._replica_key) == self._boot:
            await self.redis.pexpire(self._replica_key, int(self.lease_s * 1000))
        else:  # expired during a long pause: take the name back unless another process has it
            await self.redis.set(self._replica_key, self._boot, nx=True, px=int(self.lease_s * 1000))
        for gone in self._leases.keys() - self._owned:
            del self._leases[gone]
        keys = list(self._owned)
        if not keys:
            return
        until = self.lease_until()
        # One round trip for all: renewed one by one, 100 streams under load took seconds, and the owner's appends
        # fall back to the checked script while a lease has less than a third left (`lease_valid`).
        pipe = self.redis.pipeline(transaction=False)
        for key in keys:
            await self._scripts["renew"](keys=[self.keys.hash(key)], args=[self.owner, until], client=pipe)
        results = await pipe.execute()
        for key, flag in zip(keys, results, strict=True):
            if flag == -1:
                self._owned.discard(key)  # finished, or taken over by the reaper after a long pause
                after = self._readers.lowest_position(key)
                if after is not None:  # its live events now come from the replica that has it, from what each has
                    self._readers.follow_soon(key, after=after)
                continue
            self._leases[key] = until
            if flag == 1:
                await self.run_cancel_handlers(key)  # the nudge was missed: the durable flag covers it

    async def expired(self) -> list[str]:
        """Open buffers whose owner's lease has run out (the owner stopped or lost Redis)."""
        keys: list[str] = list(await self.redis.smembers(self.keys.open_set))  # type: ignore[arg-type]
        if not keys:
            return []
        pipe = self.redis.pipeline(transaction=False)
        for key in keys:
            pipe.hmget(self.keys.hash(key), "state", "lease")
        now = now_ms()
        found = []
        for key, (state, lease) in zip(keys, await pipe.execute(), strict=True):
            if state is None:
                await self.redis.srem(self.keys.open_set, key)  # expired or deleted under us
            elif state == "open" and int(lease or 0) < now:
                found.append(key)
        return found

    async def take_over(self, key: str) -> bool:
        """Become the owner of an open buffer whose lease expired (to end it); False when it was not expired."""
        taken = await self._scripts["take_over"](
            keys=[self.keys.hash(key)], args=[self.owner, now_ms(), self.lease_until()]
        )
        if taken == 1:
            self._owned.add(key)
            return True
        return False

    # -- cancels and changes -----------------------------------------------------------

    async def request_cancel(self, key: str, *, timeout: float) -> bool:
        """Ask the replica running `key` to stop it (a durable flag and a pub/sub nudge), then wait for its end.

        Returns False when no buffer under `key` was open.
        """
        owner = await self._scripts["cancel"](keys=[self.keys.hash(key)], args=[self.keys.cancel_channel, key])
        if not owner:
            return False
        if key in self._owned:
            await self.run_cancel_handlers(key)
        await self.wait_closed(key, timeout=timeout)
        return True

    async def wait_closed(self, key: str, *, timeout: float) -> bool:
        """Wait until the buffer `key` is no longer open (True), or `timeout` seconds (False)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if await self.redis.hget(self.keys.hash(key), "state") != "open":
                await self._refresh(key)
                return True
            await asyncio.sleep(0.05)
        return False

    async def run_cancel_handlers(self, key: str) -> None:
        """Ask each cancel handler in turn to stop `key`, until one says it ran here."""
        for handler in self.cancel_handlers:
            try:
                if await handler(key):
                    return
            except Exception:
                log.exception("cancelling %s failed", key)

    async def _changed(self, key: str, change: dict[str, Any] | None) -> BufferInfo | None:
        """The mirror's state of `key` after a change message.

        This replica's own change is in it already; another's is taken from the message (`BufferMirror.apply`),
        read from Redis only when the message does not say enough.
        """
        if self._own_echo(key):
            return self._infos.get(key)
        info = self._apply(change) if change is not None else None
        return info if info is not None else await self._refresh(key)

    async def listen(self) -> None:
        """Until the hub stops: run cancels asked of this replica; mirror and announce other replicas' changes."""
        while not self.stopped:
            pubsub = self.redis.pubsub()
            try:
                await pubsub.subscribe(self.keys.changes_channel, self.keys.cancel_channel)
                self._echoes.clear()  # what was sent while not subscribed does not come back
                async for message in pubsub.listen():
                    if message.get("type") != "message":
                        continue
                    if message["channel"] == self.keys.cancel_channel:
                        key = message["data"]
                        if key in self._owned:
                            asyncio.create_task(self.run_cancel_handlers(key), name=f"cancel {key}")
                    else:  # every replica mirrors every buffer's state (`get`, `is_running` read it)
                        key, change = parse_change(message["data"])
                        info = await self._changed(key, change)
                        if info is not None and key not in self._owned:
                            for handler in self.change_handlers:
                                try:
                                    await handler(info)
                                except Exception:
                                    log.exception("a handler of the change of %s failed", key)
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                if self.stopped:
                    return
                if isinstance(exc, OUT_OF_REACH):
                    self.reach.failed(exc)  # logged once per outage
                else:
                    log.warning("the hub's change channel was interrupted (%s); reconnecting", exc)
                await asyncio.sleep(1.0)
            finally:
                with contextlib.suppress(Exception):
                    await pubsub.aclose()  # type: ignore[no-untyped-call]
