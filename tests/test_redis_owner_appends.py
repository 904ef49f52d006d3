"""The owner's appends are not awaited (`core/streaming/redis_owner_appends.py`, issue 41), on a real Redis.

While Redis holds its writes back (`CLIENT PAUSE ... WRITE`, as a busy or slow Redis would), a turn's appends
return at once and its readers on the same replica get the events; the events reach Redis when it answers, an
end waits for them so that it lands after them, and a stream with a full window of appends on their way waits.
Refusals (a stream ended elsewhere) and outages: tests/test_redis_hub.py, tests/test_redis_outage.py.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator

import pytest
from redis.asyncio import Redis

from core.streaming.redis_hub import RedisStreamHub
from tests.utils.broker import redis_test_url
from tests.utils.cluster import two_redis_hubs

PAUSE_MS = 600


@pytest.fixture
async def hubs() -> AsyncIterator[tuple[RedisStreamHub, RedisStreamHub]]:
    async with two_redis_hubs("owner-appends", lease_s=5.0, max_events=100, ttl_s=60) as pair:
        yield pair


async def _pause_writes() -> float:
    """Redis holds every client's writes for PAUSE_MS from now; returns when that ends (monotonic)."""
    admin = Redis.from_url(redis_test_url())
    try:
        await admin.execute_command("CLIENT", "PAUSE", PAUSE_MS, "WRITE")
    finally:
        await admin.aclose()
    return time.monotonic() + PAUSE_MS / 1000


async def _stored_ids(hub: RedisStreamHub, key: str) -> list[str]:
    return [entry_id for entry_id, _fields in await hub.redis.xrange(hub._keys.stream(key))]


async def test_appends_return_while_redis_holds_them_and_the_owners_readers_get_them_at_once(hubs) -> None:
    a, _b = hubs
    await a.create("held")
    reader = a.subscribe("held")
    paused_until = await _pause_writes()

    started = time.monotonic()
    ids = [await a.append("held", "token", {"n": n}) for n in range(5)]
    took = time.monotonic() - started
    assert ids == [1, 2, 3, 4, 5]
    assert took < PAUSE_MS / 1000 / 2, f"the appends waited {took:.3f} s for Redis"
    got = [await asyncio.wait_for(reader.__anext__(), 1.0) for _ in range(5)]
    assert [event.id for event in got] == [1, 2, 3, 4, 5]  # at once, from this replica
    assert time.monotonic() < paused_until  # all of it while Redis still held the writes
    assert await _stored_ids(a, "held") == []  # reads go on during the pause: nothing written yet

    await a.written("held")
    assert await _stored_ids(a, "held") == ["1-0", "2-0", "3-0", "4-0", "5-0"]


async def test_an_end_waits_for_the_appends_on_their_way_and_lands_after_them(hubs) -> None:
    a, b = hubs
    await a.create("ending")
    await _pause_writes()
    for n in range(3):
        await a.append("ending", "token", {"n": n})
    await a.finish("ending")  # waits for Redis's answers to the three first
    await b.refresh("ending")
    events = [event async for event in b.subscribe("ending", 0)]
    assert [(event.id, event.type) for event in events] == [(1, "token"), (2, "token"), (3, "token")]
    info = b.get("ending")
    assert info is not None and info.state.value == "done"


async def test_a_stream_with_a_full_window_waits_for_its_appends_before_the_next(hubs) -> None:
    a, _b = hubs
    a._sent.window = 2
    await a.create("windowed")
    paused_until = await _pause_writes()
    await a.append("windowed", "token", {})
    await a.append("windowed", "token", {})
    third = asyncio.create_task(a.append("windowed", "token", {}))
    await asyncio.sleep(PAUSE_MS / 1000 / 3)
    assert not third.done()  # two on their way: the third waits for them
    assert await third == 3
    assert time.monotonic() >= paused_until - 0.05  # it went on once Redis answered
    await a.written("windowed")
    assert await _stored_ids(a, "windowed") == ["1-0", "2-0", "3-0"]
