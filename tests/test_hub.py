"""The stream hub: replay then live, resume after an id, bounds, eviction, concurrent subscribers."""

from __future__ import annotations

import asyncio

import pytest

from core.streaming.hub import (
    BufferState,
    StreamBusyError,
    StreamClosedError,
    StreamHub,
    SubscriberOverflowError,
    UnknownStreamError,
)


class FakeClock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


async def collect(sub, limit: int | None = None) -> list:
    out = []
    async for event in sub:
        out.append(event)
        if limit is not None and len(out) >= limit:
            break
    return out


async def test_replay_then_live_in_order() -> None:
    hub = StreamHub()
    await hub.create("k")
    for i in range(3):
        await hub.append("k", "text-delta", {"delta": str(i)})
    sub = hub.subscribe("k")
    reader = asyncio.create_task(collect(sub))
    await asyncio.sleep(0)
    for i in range(3, 6):
        await hub.append("k", "text-delta", {"delta": str(i)})
    await hub.finish("k")
    events = await asyncio.wait_for(reader, 1)
    assert [e.data["delta"] for e in events] == [str(i) for i in range(6)]
    assert [e.id for e in events] == [1, 2, 3, 4, 5, 6]


async def test_subscribe_after_id_gets_exactly_the_rest() -> None:
    hub = StreamHub()
    await hub.create("k")
    for i in range(10):
        await hub.append("k", "e", {"i": i})
    await hub.finish("k")
    events = await collect(hub.subscribe("k", after=7))
    assert [e.id for e in events] == [8, 9, 10]
    assert await collect(hub.subscribe("k", after=10)) == []


async def test_ids_continue_when_a_finished_buffer_is_recreated() -> None:
    hub = StreamHub()
    await hub.create("k")
    await hub.append("k", "a")
    await hub.finish("k")
    info = await hub.create("k")
    assert info.last_id == 1
    assert await hub.append("k", "b") == 2
    events = await collect(hub.subscribe("k", after=None), limit=1)
    assert [e.type for e in events] == ["b"]


async def test_create_refuses_an_open_buffer_and_append_refuses_a_finished_one() -> None:
    hub = StreamHub()
    await hub.create("k")
    with pytest.raises(StreamBusyError):
        await hub.create("k")
    await hub.finish("k")
    with pytest.raises(StreamClosedError):
        await hub.append("k", "late")
    with pytest.raises(UnknownStreamError):
        await hub.append("nope", "x")
    with pytest.raises(UnknownStreamError):
        hub.subscribe("nope")


async def test_bounded_buffer_drops_oldest_and_reports_the_gap() -> None:
    hub = StreamHub(max_events=5)
    await hub.create("k")
    for i in range(12):
        await hub.append("k", "e", {"i": i})
    info = hub.get("k")
    assert (info.first_id, info.last_id, info.dropped) == (8, 12, 7)
    sub = hub.subscribe("k", after=2)
    assert sub.gap is True
    fresh = hub.subscribe("k", after=9)
    assert fresh.gap is False
    await hub.finish("k")
    assert [e.id for e in await collect(fresh)] == [10, 11, 12]


async def test_an_id_from_another_stream_is_flagged_ahead() -> None:
    hub = StreamHub()
    await hub.create("k")
    await hub.append("k", "e")
    assert hub.subscribe("k", after=50).ahead is True
    assert hub.subscribe("k", after=1).ahead is False


async def test_error_state_is_kept() -> None:
    hub = StreamHub()
    await hub.create("k")
    await hub.finish("k", error="model failed")
    info = hub.get("k")
    assert info.state is BufferState.ERROR and info.error == "model failed"


async def test_finished_buffers_are_evicted_after_the_ttl() -> None:
    clock = FakeClock()
    hub = StreamHub(ttl_s=60, clock=clock)
    await hub.create("old")
    await hub.finish("old")
    await hub.create("running")
    clock.now += 59
    assert hub.sweep() == 0 and hub.get("old") is not None
    clock.now += 2
    assert hub.sweep() == 1
    assert hub.get("old") is None
    assert hub.get("running") is not None  # open buffers are never evicted


async def test_ten_thousand_finished_buffers_leave_nothing_behind() -> None:
    clock = FakeClock()
    hub = StreamHub(ttl_s=1, clock=clock)
    for i in range(10_000):
        await hub.create(f"a2a_{i}")
        await hub.append(f"a2a_{i}", "text-delta", {"delta": "x"})
        await hub.finish(f"a2a_{i}")
    clock.now += 5
    hub.sweep()
    assert hub.keys() == []


async def test_max_buffers_evicts_oldest_finished_first() -> None:
    hub = StreamHub(ttl_s=3600, max_buffers=3)
    for i in range(5):
        await hub.create(f"k{i}")
        await hub.finish(f"k{i}")
    assert sorted(hub.keys()) == ["k2", "k3", "k4"]


async def test_concurrent_subscribers_each_get_everything() -> None:
    hub = StreamHub()
    await hub.create("k")
    readers = [asyncio.create_task(collect(hub.subscribe("k"))) for _ in range(50)]
    for i in range(200):
        await hub.append("k", "e", {"i": i})
        if i % 50 == 0:
            await asyncio.sleep(0)
    await hub.finish("k")
    results = await asyncio.wait_for(asyncio.gather(*readers), 2)
    for events in results:
        assert [e.data["i"] for e in events] == list(range(200))


async def test_a_slow_subscriber_is_cut_off_without_slowing_others() -> None:
    hub = StreamHub(subscriber_queue=10)
    await hub.create("k")
    slow = hub.subscribe("k")
    fast = hub.subscribe("k")
    fast_reader = asyncio.create_task(collect(fast))
    for i in range(30):
        await hub.append("k", "e", {"i": i})
        await asyncio.sleep(0)
    await hub.finish("k")
    assert len(await asyncio.wait_for(fast_reader, 1)) == 30
    received = []
    with pytest.raises(SubscriberOverflowError):
        async for event in slow:
            received.append(event.data["i"])
    assert received == list(range(10))  # what was queued before the cut is still delivered


async def test_closing_a_subscription_stops_it_and_unregisters() -> None:
    hub = StreamHub()
    await hub.create("k")
    sub = hub.subscribe("k")
    assert hub.get("k").subscribers == 1
    sub.close()
    sub.close()
    assert hub.get("k").subscribers == 0
    assert await collect(sub) == []


def test_constructor_rejects_nonsense() -> None:
    with pytest.raises(ValueError, match="max_events"):
        StreamHub(max_events=0)
    with pytest.raises(ValueError, match="subscriber_queue"):
        StreamHub(subscriber_queue=0)
