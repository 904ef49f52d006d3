"""A Redis outage under the cluster's stream hub (core/streaming/redis_outage.py, issue 41): no turn is lost.

Two hubs in one process stand for two replicas; both reach the real Redis (TEST_REDIS_URL) through a TCP proxy
(tests/utils/broker.py `TcpProxy`) that the test cuts and restores. docs/ARCHITECTURE.md, "Cluster", "Redis out
of reach", has the rules checked here.
"""

from __future__ import annotations

import asyncio
import secrets
from collections.abc import AsyncIterator
from urllib.parse import urlparse

import pytest
from redis.asyncio import Redis
from redis.exceptions import ConnectionError as RedisConnectionError

from core.streaming.hub import BufferState
from core.streaming.redis_hub import RedisStreamHub
from tests.conftest import unavailable
from tests.utils.broker import TcpProxy, redis_test_url
from tests.utils.cluster import delete_prefix, redis_reachable

pytestmark = pytest.mark.cluster


@pytest.fixture
async def cut_hubs() -> AsyncIterator[tuple[RedisStreamHub, RedisStreamHub, TcpProxy, Redis]]:
    """Replica A's hub and B's, both through one proxy; and a client straight to Redis (to look)."""
    url = redis_test_url()
    if (reason := redis_reachable(url)) is not None:
        unavailable(reason)
    target = urlparse(url)
    proxy = await TcpProxy(target.hostname or "127.0.0.1", target.port or 6379).start()
    proxied = f"redis://127.0.0.1:{proxy.port}{target.path or '/0'}"
    prefix = f"a2a-outage-test-{secrets.token_hex(4)}:"
    options = {"prefix": prefix, "lease_s": 3.0, "max_events": 1000, "ttl_s": 60}
    a = RedisStreamHub.from_url(proxied, owner="a", outage_events=50, **options)  # type: ignore[arg-type]
    b = RedisStreamHub.from_url(proxied, owner="b", **options)  # type: ignore[arg-type]
    direct = Redis.from_url(url, decode_responses=True)
    await a.start()
    await b.start()
    try:
        yield a, b, proxy, direct
    finally:
        if proxy._server is None:
            await proxy.restore()
        await a.stop()
        await b.stop()
        await direct.aclose()
        delete_prefix(url, prefix)


async def read_all(subscription) -> list[tuple[int, str]]:
    return [(event.id, event.data.get("delta", "")) async for event in subscription]


async def test_a_stream_goes_on_through_a_cut_and_every_reader_gets_all_of_it_then_the_end(cut_hubs) -> None:
    a, b, proxy, direct = cut_hubs
    await a.create("t")
    await a.append("t", "text-delta", {"delta": "1"})
    await b.refresh("t")
    here = asyncio.create_task(read_all(a.subscribe("t")))
    there = asyncio.create_task(read_all(b.subscribe("t")))
    await asyncio.sleep(0.2)

    await proxy.cut()
    ids = [await a.append("t", "text-delta", {"delta": str(n)}) for n in range(2, 31)]
    assert ids == list(range(2, 31))  # counted by the owner while Redis is out of reach
    await a.finish("t")
    assert await asyncio.wait_for(here, 10) == [(n, str(n)) for n in range(1, 31)]  # the owner's readers: at once
    assert not there.done()  # the other replica's reader waits for Redis
    with pytest.raises(RedisConnectionError):
        await b.create("u")  # nothing new opens meanwhile (a send answers 503)
    assert await a.expired() == [] and a.held_events() == 29

    await asyncio.sleep(1.0)
    await proxy.restore()
    assert await asyncio.wait_for(there, 30) == [(n, str(n)) for n in range(1, 31)]
    info = await b.refresh("t")
    assert info is not None and info.state is BufferState.DONE and info.last_id == 30
    assert a.held_events() == 0 and not a.owns("t")
    assert len(await direct.xrange(f"{a.prefix}s:t")) == 31  # 30 events and the end


async def test_past_the_bound_redis_skips_events_but_the_owners_readers_and_the_end_are_whole(cut_hubs) -> None:
    a, b, proxy, direct = cut_hubs
    await a.create("big")
    await b.refresh("big")
    here = asyncio.create_task(read_all(a.subscribe("big")))
    there = asyncio.create_task(read_all(b.subscribe("big")))
    await asyncio.sleep(0.2)
    await proxy.cut()
    for n in range(1, 81):  # the bound is 50 events
        await a.append("big", "text-delta", {"delta": str(n)})
    await a.finish("big", error="stopped")
    assert [n for n, _ in await asyncio.wait_for(here, 10)] == list(range(1, 81))
    await proxy.restore()
    assert [n for n, _ in await asyncio.wait_for(there, 30)] == list(range(1, 51))  # then the end
    info = await b.refresh("big")
    assert info is not None and info.state is BufferState.ERROR and info.last_id == 80  # ids go on after the gap


async def test_a_lease_that_ran_out_in_an_outage_is_kept_by_its_live_owner(cut_hubs) -> None:
    a, b, proxy, _direct = cut_hubs
    await a.create("kept")
    await proxy.cut()
    await asyncio.sleep(a.lease_s + 1.5)  # longer than the lease: it has run out in Redis
    await proxy.restore()
    # B saw the outage too: it reaps nothing for a lease, and A renews (re-takes) its lease meanwhile.
    assert await b.expired() == []
    await asyncio.sleep(a.lease_s + 0.5)
    assert await b.expired() == [] and a.owns("kept")
    await a.append("kept", "text-delta", {"delta": "after"})
    await a.finish("kept")
    assert (await b.refresh("kept")).state is BufferState.DONE


async def test_a_turn_that_goes_on_after_a_cut_appends_directly_again_with_consecutive_ids(cut_hubs) -> None:
    """Once the held events are written the owner's appends go straight to Redis; every reader has each id once."""
    a, b, proxy, direct = cut_hubs
    await a.create("on")
    await a.append("on", "text-delta", {"delta": "1"})
    await b.refresh("on")
    there = asyncio.create_task(read_all(b.subscribe("on")))
    await asyncio.sleep(0.2)
    await proxy.cut()
    for n in range(2, 11):
        await a.append("on", "text-delta", {"delta": str(n)})
    await proxy.restore()
    for _ in range(100):  # the held events are written
        if not a.held_events():
            break
        await asyncio.sleep(0.1)
    for n in range(11, 21):
        await a.append("on", "text-delta", {"delta": str(n)})
        assert a.held_events() == 0  # written at once, not held behind what was
    # An answer lost on the way: the same ids again are stored already, not twice.
    a._outage.add("on", 19, "text-delta", '{"delta": "19"}')
    a._outage.add("on", 20, "text-delta", '{"delta": "20"}')
    for _ in range(100):
        if not a.held_events():
            break
        await asyncio.sleep(0.1)
    await a.finish("on")
    assert await asyncio.wait_for(there, 30) == [(n, str(n)) for n in range(1, 21)]
    assert [entry_id for entry_id, _ in await direct.xrange(f"{a.prefix}s:on")][:-1] == [f"{n}-0" for n in range(1, 21)]
