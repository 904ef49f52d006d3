"""The Redis stream hub (core/streaming/redis_hub.py): two hubs in one process stand for two replicas.

Real Redis (TEST_REDIS_URL), a key prefix of each test's own, removed at the end.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator

import pytest
from redis.asyncio import Redis

from core.streaming.hub import BufferState, StreamBusyError, StreamClosedError, UnknownStreamError
from core.streaming.redis_hub import RedisStreamHub
from tests.utils.broker import redis_test_url
from tests.utils.cluster import two_redis_hubs
from tests.utils.redis_commands import on_sent

pytestmark = pytest.mark.cluster


@pytest.fixture
async def hubs() -> AsyncIterator[tuple[RedisStreamHub, RedisStreamHub]]:
    """Replica A's hub and replica B's, sharing one Redis key prefix."""
    async with two_redis_hubs("hub", lease_s=1.0, max_events=100, ttl_s=60) as pair:
        yield pair


async def collect(subscription) -> list[int]:
    return [event.id async for event in subscription]


async def test_a_buffer_opened_on_one_replica_is_busy_on_the_other(hubs) -> None:
    a, b = hubs
    await a.create("s1", {"who": "a"})
    with pytest.raises(StreamBusyError):
        await b.create("s1")
    await a.finish("s1")
    info = await b.create("s1")  # finished: any replica may open the next one, ids go on
    assert info.first_id == 1 and (await a.refresh("s1")).meta == {}


async def test_a_reader_on_b_gets_every_event_of_a_in_order_then_the_end(hubs) -> None:
    a, b = hubs
    await a.create("s2")
    await a.append("s2", "text-delta", {"delta": "x"})
    await b.refresh("s2")
    reader = asyncio.create_task(collect(b.subscribe("s2")))
    await asyncio.sleep(0.05)
    for n in range(2, 201):
        await a.append("s2", "text-delta", {"delta": str(n)})
    await a.finish("s2", error="boom")
    assert await asyncio.wait_for(reader, 10) == list(range(1, 201))
    info = await b.refresh("s2")
    assert info.state is BufferState.ERROR and info.error == "boom" and info.last_id == 200
    with pytest.raises(StreamClosedError):
        await b.append("s2", "text-delta", {})
    with pytest.raises(UnknownStreamError):
        await b.append("nope", "text-delta", {})


async def test_resume_after_an_id_and_the_next_buffer_keeps_counting(hubs) -> None:
    a, b = hubs
    await a.create("s3")
    for _ in range(10):
        await a.append("s3", "e", {})
    await a.finish("s3")
    await b.refresh("s3")
    assert await collect(b.subscribe("s3", after=7)) == [8, 9, 10]
    assert await collect(b.subscribe("s3", after=10)) == []
    ahead = b.subscribe("s3", after=11)
    assert ahead.ahead
    ahead.close()
    info = await b.create("s3")
    assert info.first_id == 11
    await b.append("s3", "e", {})
    await b.finish("s3")
    await a.refresh("s3")
    assert await collect(a.subscribe("s3")) == [11]  # the earlier buffer's events are gone with it


async def test_trimmed_events_are_a_gap_judged_from_the_real_first_entry(hubs) -> None:
    a, b = hubs
    await a.create("s4")
    for _ in range(1_000):
        await a.append("s4", "e", {})
    info = await b.refresh("s4")
    assert 1 < info.first_id <= 1_000 - 100 + 1  # MAXLEN ~ 100 keeps at least the last 100
    behind, caught_up = b.subscribe("s4", after=0), b.subscribe("s4", after=info.first_id - 1)
    assert behind.gap and not caught_up.gap
    behind.close()
    caught_up.close()
    await a.finish("s4")


async def test_a_cancel_asked_on_b_runs_on_the_owner_and_waits_for_the_end(hubs) -> None:
    a, b = hubs
    asked: list[str] = []

    async def stop_here(key: str) -> bool:
        asked.append(key)
        asyncio.get_running_loop().call_later(0.2, lambda: asyncio.ensure_future(a.finish(key)))
        return True

    a.on_cancel(stop_here)
    await a.create("s5")
    started = time.monotonic()
    assert await b.request_cancel("s5", timeout=5) is True
    assert asked == ["s5"] and 0.15 < time.monotonic() - started < 5
    assert (await b.refresh("s5")).state is BufferState.DONE
    assert await b.request_cancel("s5") is False  # nothing open


async def test_an_owner_that_stops_renewing_loses_its_buffer_to_the_reaper(hubs) -> None:
    a, b = hubs
    await a.create("s6")
    await asyncio.sleep(1.5)  # a renews every third of its 1 s lease
    assert await b.expired() == []
    for task in a._tasks:  # a "dies": no more renewals
        task.cancel()
    await asyncio.sleep(1.3)
    assert await b.expired() == ["s6"]
    assert await b.take_over("s6") is True
    assert await a.take_over("s6") is False  # b holds a fresh lease now
    await b.append("s6", "error", {"errorText": "stopped"})
    await b.finish("s6")
    assert [e.type for e in await a.events("s6")] == ["error"]


async def test_other_replicas_hear_of_a_buffer_opened_elsewhere(hubs) -> None:
    a, b = hubs
    seen = []

    async def on_change(info) -> None:
        seen.append((info.key, info.state, dict(info.meta)))

    b.on_change(on_change)
    await a.create("s7", {"n": 1})
    await a.update_meta("s7", draftId=5)
    await a.finish("s7")
    deadline = time.monotonic() + 5
    while len(seen) < 3 and time.monotonic() < deadline:
        await asyncio.sleep(0.02)
    assert [s[0] for s in seen] == ["s7"] * 3
    assert seen[-1][1] is BufferState.DONE and any(s[2] == {"n": 1, "draftId": 5} for s in seen)
    assert b.get("s7").state is BufferState.DONE


async def test_live_streams_counts_what_a_replica_writes_or_reads_for_its_subscribers(hubs) -> None:
    a, b = hubs
    await a.create("s9")
    assert (a.live_streams(), b.live_streams()) == (1, 0)  # A writes it; B knows of it, follows nothing
    await b.refresh("s9")
    reader = asyncio.create_task(collect(b.subscribe("s9")))
    await asyncio.sleep(0.05)
    assert b.live_streams() == 1  # B reads it for its subscriber
    await a.append("s9", "text-delta", {"delta": "x"})
    await a.finish("s9")
    await asyncio.wait_for(reader, 10)
    assert a.live_streams() == 0
    assert b.live_streams() == 0  # its subscriber had the end


async def test_a_replica_following_many_streams_keeps_connections_for_its_appends(hubs) -> None:
    """The followers' blocking reads have a pool of their own: the commands' small one stays free for appends."""
    writer, _ = hubs
    url = redis_test_url()
    hub = RedisStreamHub.from_url(
        url,
        command_connections=4,
        prefix=writer.prefix.removesuffix("hub:"),
        owner="c",
        lease_s=5.0,
        max_events=100,
        ttl_s=60,
    )
    await hub.start()
    followed = [f"k{i}" for i in range(30)]
    own = [f"own{i}" for i in range(30)]
    try:
        for key in followed:
            await writer.create(key)
            await hub.refresh(key)
        readers = [asyncio.create_task(collect(hub.subscribe(key))) for key in followed]
        async with asyncio.timeout(5):
            while len(hub._followers) < len(followed):  # every stream followed: 30 blocking reads at once
                await asyncio.sleep(0.01)
        await asyncio.sleep(0.1)

        async def write(on: RedisStreamHub, key: str) -> None:
            for _ in range(10):
                await on.append(key, "text-delta", {"delta": "x"})
            await on.finish(key)

        for key in own:
            await hub.create(key)
        # On one pool of 4, the appends would wait behind the 1 s blocking reads (or fail, unbounded).
        async with asyncio.timeout(5):
            await asyncio.gather(*(write(hub, key) for key in own))
            await asyncio.gather(*(write(writer, key) for key in followed))
            received = await asyncio.gather(*readers)
        assert received == [list(range(1, 11))] * len(followed)
    finally:
        await hub.stop()


async def test_readers_on_the_replica_that_runs_a_stream_get_it_from_its_appends(hubs) -> None:
    """No blocking read for a stream this replica writes: a reader that joins mid-stream misses and repeats nothing."""
    a, b = hubs
    await a.create("local")
    for n in range(5):
        await a.append("local", "e", {"n": n})
    a.readers = Redis.from_url("redis://127.0.0.1:9/0")  # a follower here would fail: nothing listens there
    early = asyncio.create_task(collect(a.subscribe("local", after=2)))
    late: asyncio.Task | None = None
    for n in range(5, 90):  # under the fixture's max_events: nothing trimmed
        await a.append("local", "e", {"n": n})
        if n == 40:
            late = asyncio.create_task(collect(a.subscribe("local")))
        if n % 10 == 0:
            await asyncio.sleep(0)  # the readers take what is there, while appends go on
    await a.finish("local")
    async with asyncio.timeout(5):
        assert await early == list(range(3, 91))
        assert await late == list(range(1, 91))
    assert "local" not in a._followers
    await b.refresh("local")
    assert await collect(b.subscribe("local", after=88)) == [89, 90]


async def test_a_reader_of_a_stream_whose_lease_this_replica_lost_follows_the_new_owner(hubs) -> None:
    """A replica that finds its stream taken over reads the rest from Redis, from what its reader has."""
    a, b = hubs
    await a.create("lost")
    await a.append("lost", "e", {})
    reader = asyncio.create_task(collect(a.subscribe("lost")))
    await asyncio.sleep(0.05)
    for task in a._tasks:  # a pauses: its lease runs out and b takes the stream over
        task.cancel()
    await asyncio.sleep(1.3)
    assert await b.take_over("lost") is True
    await b.append("lost", "error", {"errorText": "stopped"})
    await b.finish("lost")
    await a._renew()  # a wakes up: the stream is not its own any more, and has ended
    assert not a.owns("lost")
    assert await asyncio.wait_for(reader, 5) == [1, 2]


async def test_appends_sent_together_keep_their_order_and_fail_one_by_one(hubs) -> None:
    """Appends that are ready together go in one round trip; each gets its own id or its own error."""
    a, b = hubs
    await a.create("batch-1")
    await a.create("batch-2")
    await a.create("closed")
    await a.finish("closed")

    async def writer(key: str, count: int) -> list[int]:
        return [await a.append(key, "e", {"n": n}) for n in range(count)]

    results = await asyncio.gather(
        writer("batch-1", 50), writer("batch-2", 50), a.append("closed", "e", {}), return_exceptions=True
    )
    assert results[0] == list(range(1, 51)) and results[1] == list(range(1, 51))
    assert isinstance(results[2], StreamClosedError)  # the other appends of its batch went through
    await a.finish("batch-1")
    await b.refresh("batch-1")
    received = [event async for event in b.subscribe("batch-1")]
    assert [event.data["n"] for event in received] == list(range(50))


async def test_an_owners_append_under_its_lease_is_one_xadd_and_others_still_read_its_last_id(
    hubs, monkeypatch
) -> None:
    """Per token, Redis runs one plain `XADD` at the owner's id, no script (docs/ARCHITECTURE.md, "Cluster")."""
    a, b = hubs
    await a.create("plain")
    stream = a._keys.stream("plain").encode()
    sent: list[list[bytes]] = []
    on_sent(monkeypatch, lambda _client, args: sent.append(args) if stream in args else None)
    assert [await a.append("plain", "e", {"n": n}) for n in range(5)] == [1, 2, 3, 4, 5]
    await a.written("plain")  # the turn does not wait for Redis's answers: this test does
    assert [args[:9] for args in sent] == [
        [b"XADD", stream, b"MAXLEN", b"~", b"100", f"{n}-0".encode(), b"t", b"e", b"d"] for n in range(1, 6)
    ]
    info = await b.refresh("plain")  # the state hash does not count them: the stream's newest entry does
    assert info is not None and info.last_id == 5
    assert [event.id for event in await b.events("plain")] == [1, 2, 3, 4, 5]
    await a.finish("plain")
    await a.create("plain")  # the next buffer goes on after them
    assert await a.append("plain", "e", {}) == 6


async def test_an_append_is_held_behind_a_missing_id_and_a_stored_one_is_not_written_twice(hubs) -> None:
    from core.streaming.redis_batches import HELD, Append

    a, _b = hubs
    await a.create("order")
    keys = [a._keys.stream("order"), a._keys.hash("order")]
    assert await a._appends.submit(Append("order", 2, keys, "e", "{}")) == HELD  # 1 is not stored: 2 waits
    first, second = (
        a._appends.submit(Append("order", 1, keys, "e", "{}")),
        a._appends.submit(Append("order", 2, keys, "e", "{}")),
    )
    assert (await first, await second) == (1, 2)  # in one batch, in order
    assert await a._appends.submit(Append("order", 1, keys, "e", "{}")) == 1  # a replay: stored already
    assert [event.id for event in await a.events("order")] == [1, 2]


async def test_an_owner_whose_lease_ran_out_appends_through_the_checked_script(hubs) -> None:
    """A stalled owner does not write plain entries into a stream the reaper ended: its appends are refused.

    The turn learns it from Redis's answer to its first append after the end: its next append raises.
    """
    a, b = hubs
    await a.create("stalled")
    await a.append("stalled", "e", {})
    for task in a._tasks:  # a stalls: no more renewals
        task.cancel()
    await asyncio.sleep(1.3)
    assert await b.take_over("stalled") is True
    await b.finish("stalled", error="interrupted")
    await a.append("stalled", "e", {})  # counted and sent: Redis refuses it
    await a.written("stalled")
    with pytest.raises(StreamClosedError):
        await a.append("stalled", "e", {})
    assert [event.id for event in await b.events("stalled")] == [1]
