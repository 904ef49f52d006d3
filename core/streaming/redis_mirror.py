"""This replica's mirror of a Redis stream hub's state hashes: what `get` and `subscribe` read, synchronously.

Kept fresh by this replica's own writes, by the hub's pub/sub channel of changes (each message carries the
buffer's state: applied as it comes, no read of Redis per replica per change), and by `refresh(key)`, which callers
await before they read a stream another replica may have opened.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import time
from collections.abc import Callable
from typing import Any

from redis.asyncio import Redis

from core.streaming.hub import BufferInfo, BufferState
from core.streaming.redis_scripts import HubKeys, entry_id

_STATES = {state.value for state in BufferState}


def parse_change(data: str) -> tuple[str, dict[str, Any] | None]:
    """A message of the changes channel: the key, and the state the script published (None: a bare key).

    The hub's scripts publish `{"k": key, "s": state, "f": first id, "l": last id (absent: unknown), "m": meta JSON,
    "e": error}` (`redis_scripts.py`, `_ANNOUNCE`); a bare key (a replica of an earlier version) is read back.
    """
    if data.startswith("{"):
        with contextlib.suppress(ValueError):
            change = json.loads(data)
            if isinstance(change, dict) and isinstance(change.get("k"), str):
                if change.get("s") in _STATES and type(change.get("f")) is int:  # (a bool is an int too)
                    return change["k"], change
                return change["k"], None  # not the state as this replica knows it: read back
    return data, None


def change_message(info: BufferInfo) -> str:
    """The message of the changes channel that carries `info`, as the hub's scripts publish it (`parse_change`)."""
    meta = json.dumps(info.meta, default=str)
    return json.dumps(
        {"k": info.key, "s": info.state.value, "f": info.first_id, "l": info.last_id, "m": meta, "e": info.error or ""}
    )


class BufferMirror:
    """The state of each shared buffer this replica knows of, and when the finished ones finished.

    Args:
        redis: the client of the hub's commands.
        keys: the hub's key layout.
        infos: the mirror itself (shared with the followers, which move `last_id`).
        ttl_s: how long a finished buffer is remembered (Redis expires it itself).
        count: how many local subscribers a key has.
    """

    def __init__(
        self, redis: Redis, keys: HubKeys, infos: dict[str, BufferInfo], *, ttl_s: float, count: Callable[[str], int]
    ) -> None:
        self.redis = redis
        self.keys = keys
        self.infos = infos
        self.ttl_s = ttl_s
        self._count = count
        self._finished_at: dict[str, float] = {}

    async def refresh(self, key: str) -> BufferInfo | None:
        """Read the buffer's state from Redis into the mirror; returns it (None: no buffer)."""
        pipe = self.redis.pipeline(transaction=False)
        pipe.hgetall(self.keys.hash(key))
        pipe.xrange(self.keys.stream(key), "-", "+", count=1)
        pipe.xrevrange(self.keys.stream(key), "+", "-", count=1)
        state, head, top = await pipe.execute()
        if not state or "state" not in state:
            self.infos.pop(key, None)
            self._finished_at.pop(key, None)
            return None
        first = int(state.get("first", 1))
        if head:  # approximate trimming keeps more than asked, exact trimming less: the real first entry counts
            number, seq = entry_id(head[0][0])
            if not seq:
                first = max(first, number)
        info = BufferInfo(
            key=key,
            state=BufferState(state["state"]),
            first_id=first,
            # The owner's appends do not touch the hash: its newest entry (an event, or the end after the last) counts.
            last_id=max(int(state.get("next", 1)) - 1, entry_id(top[0][0])[0] if top else 0),
            dropped=0,
            error=state.get("error") or None,
            meta=json.loads(state.get("meta") or "{}"),
            subscribers=self._count(key),
        )
        self._keep(info)
        return info

    def apply(self, change: dict[str, Any]) -> BufferInfo | None:
        """Take the state a change message carries (`parse_change`) into the mirror; returns it.

        None when the message does not say enough (a metadata change of a buffer this replica has not seen
        opened, so its last id is unknown): the caller reads it from Redis. Messages come in the order the
        scripts ran, so each one's state is the newest; the last id is the higher of the message's and what
        this replica saw of the same buffer (its followers move it with the appends, which publish nothing).
        """
        key, first = change["k"], int(change["f"])
        known = self.infos.get(key)
        same = known is not None and known.first_id == first  # the buffer this replica knows (not an earlier one)
        last = change.get("l")
        if last is None and not same:
            return None
        last_id = int(last) if last is not None else -1
        if same:
            assert known is not None
            last_id = max(last_id, known.last_id)
        info = BufferInfo(
            key=key,
            state=BufferState(change["s"]),
            first_id=first,
            last_id=last_id,
            dropped=0,
            error=change.get("e") or None,
            meta=json.loads(change.get("m") or "{}"),
            subscribers=self._count(key),
        )
        self._keep(info)
        return info

    def _keep(self, info: BufferInfo) -> None:
        self.infos[info.key] = info
        if info.state is not BufferState.OPEN:
            self._finished_at.setdefault(info.key, time.monotonic())
        else:
            self._finished_at.pop(info.key, None)

    def get(self, key: str) -> BufferInfo | None:
        """A copy of the buffer's state as this replica last saw it, or None."""
        info = self.infos.get(key)
        if info is None:
            return None
        info.subscribers = self._count(key)
        return dataclasses.replace(info, meta=dict(info.meta))

    def opened(self, key: str, first: int, meta: dict[str, Any]) -> BufferInfo:
        """This replica opened `key`, its first event to be `first`."""
        info = BufferInfo(
            key=key,
            state=BufferState.OPEN,
            first_id=first,
            last_id=first - 1,
            dropped=0,
            error=None,
            meta=dict(meta),
            subscribers=self._count(key),
        )
        self.infos[key] = info
        self._finished_at.pop(key, None)
        return info

    def appended(self, key: str, event_id: int) -> None:
        """Event `event_id` of `key` was written."""
        info = self.infos.get(key)
        if info is not None and event_id > info.last_id:
            info.last_id = event_id

    def finished(self, key: str, error: str | None) -> None:
        """This replica finished `key` (with `error`, or done)."""
        info = self.infos.get(key)
        if info is not None and info.state is BufferState.OPEN:
            info.state, info.error = (BufferState.ERROR if error else BufferState.DONE), error
            self._finished_at[key] = time.monotonic()

    def meta_updated(self, key: str, meta: dict[str, Any]) -> None:
        """This replica merged `meta` into the metadata of `key`."""
        info = self.infos.get(key)
        if info is not None:
            info.meta.update(meta)

    def sweep(self) -> int:
        """Forget finished buffers past their TTL that nobody here reads; returns how many."""
        now = time.monotonic()
        old = [k for k, at in self._finished_at.items() if now - at >= self.ttl_s and not self._count(k)]
        for key in old:
            self._finished_at.pop(key, None)
            self.infos.pop(key, None)
        return len(old)
