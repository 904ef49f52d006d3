"""What a turn start asks of Redis in a cluster (issue 41): the commands each replica sends, counted.

Two hubs in one process stand for two replicas on a real Redis (TEST_REDIS_URL), a key prefix of each
test's own. A turn start at the hub: the claim (`create`), the turn's metadata (`update_meta`), the stream
route's `refresh` and replay on the replica that runs it, a few events, the end. The commands are counted
as they are sent (`Connection.send_packed_command`, tests/utils/redis_commands.py), so pipelined ones count one by
one, a script call by its script's name (`EVALSHA create`), and what a script runs inside Redis does not count.
"""

from __future__ import annotations

import asyncio
import functools
from collections import Counter
from collections.abc import AsyncIterator

import pytest
from redis.asyncio.connection import Connection

from core.streaming.hub import BufferState
from core.streaming.redis_hub import RedisStreamHub
from core.streaming.redis_mirror import parse_change
from core.streaming.redis_readers import OWNER_TAIL_EVENTS, OwnerTail
from tests.utils.cluster import two_redis_hubs, wait_for
from tests.utils.redis_commands import command_name, on_sent

pytestmark = pytest.mark.cluster


@pytest.fixture
async def hubs() -> AsyncIterator[tuple[RedisStreamHub, RedisStreamHub]]:
    """Replica A's hub and replica B's; leases of 30 s, so no renewal runs while a test counts."""
    async with two_redis_hubs("turn-start", lease_s=30.0, ttl_s=60) as pair:
        yield pair


# This file's waits are for a message on the local Redis: a few ms, so checked often and given up on soon.
until = functools.partial(wait_for, timeout_s=5.0, interval_s=0.01)


def count_read_backs(hub: RedisStreamHub) -> list[str]:
    """The keys whose state `hub` reads back from Redis from now on (a change it could not apply as told)."""
    reads: list[str] = []
    read_back = hub._replica._refresh

    async def refresh(key: str):
        reads.append(key)
        return await read_back(key)

    hub._replica._refresh = refresh
    return reads


async def a_turn(a: RedisStreamHub, key: str, tokens: int) -> list[int]:
    """A turn started on `a` at the hub: claim, metadata, the stream route's read, the tokens, the end."""
    await a.create(key, meta={})
    await a.update_meta(key, draftId=7, agentSlug="helper")
    info = await a.refresh(key)
    assert info is not None and info.state is BufferState.OPEN
    subscription = a.subscribe(key)

    async def read() -> list[int]:
        return [event.id async for event in subscription]

    reader = asyncio.create_task(read())
    await asyncio.sleep(0)
    for n in range(tokens):
        await a.append(key, "text-delta", {"delta": f" w{n}"})
    await a.finish(key)
    return await asyncio.wait_for(reader, 5)


@pytest.fixture
def commands(monkeypatch: pytest.MonkeyPatch) -> dict[str, Counter[str]]:
    """The commands sent from now on, by the connection's client (`a`, `b`: the hubs' command pools; `other`)."""
    by_client: dict[str, Counter[str]] = {}

    def count(client: str, args: list[bytes]) -> None:
        by_client.setdefault(client, Counter())[command_name(args)] += 1

    on_sent(monkeypatch, count)
    return by_client


def label(hub: RedisStreamHub, name: str) -> None:
    """Tag every connection of `hub`'s command pool, now and later, as `name` (for `commands`)."""
    pool = hub.redis.connection_pool
    make = pool.make_connection

    def made() -> Connection:
        connection = make()
        connection._test_client = name  # type: ignore[attr-defined]
        return connection

    pool.make_connection = made  # type: ignore[method-assign]
    for connection in [*pool._available_connections, *pool._in_use_connections]:  # type: ignore[attr-defined]
        connection._test_client = name  # type: ignore[attr-defined]


async def test_a_turn_start_sends_two_scripts_its_metadata_and_appends_and_the_other_replica_reads_nothing(
    hubs, commands
) -> None:
    a, b = hubs
    label(a, "a")
    label(b, "b")
    assert await a_turn(a, "warm-up", 1) == [1]  # the scripts are loaded (a fresh Redis: SCRIPT LOAD once)
    assert await b.refresh("warm-up") is not None  # as a page on B would
    await until(lambda: (info := b.get("warm-up")) is not None and info.state is BufferState.DONE)
    commands.clear()

    assert await a_turn(a, "s1", 3) == [1, 2, 3]
    await until(lambda: (info := b.get("s1")) is not None and info.state is BufferState.DONE)
    # create and finish (2 scripts), the metadata (HSET + PUBLISH in one round trip: the owner's, under its lease)
    # and the tokens' XADDs. On the replica that runs the turn, the stream route's refresh and its reader's replay
    # read nothing (its mirror is what Redis has; it keeps the newest events).
    assert commands.get("a") == Counter({"EVALSHA create": 1, "EVALSHA finish": 1, "HSET": 1, "PUBLISH": 1, "XADD": 3})
    # The other replica mirrors the three changes from their messages: no read-back.
    assert commands.get("b") is None
    info = b.get("s1")
    assert info is not None and (info.first_id, info.last_id) == (1, 3)
    assert info.meta == {"draftId": 7, "agentSlug": "helper"}


async def test_a_change_message_carries_the_state_the_other_replica_applies_without_a_read(hubs) -> None:
    a, b = hubs
    reads = count_read_backs(b)
    await a.create("s2", {"who": "a"})
    await until(lambda: b.get("s2") is not None)
    info = b.get("s2")
    assert (info.state, info.first_id, info.last_id, info.meta) == (BufferState.OPEN, 1, 0, {"who": "a"})

    await a.append("s2", "text-delta", {"delta": "x"})
    await a.append("s2", "text-delta", {"delta": "y"})
    await a.update_meta("s2", progress=0.5)
    await until(lambda: b.get("s2").meta.get("progress") == 0.5)
    assert b.get("s2").meta == {"who": "a", "progress": 0.5}

    await a.finish("s2", error="boom")
    await until(lambda: b.get("s2").state is BufferState.ERROR)
    info = b.get("s2")
    assert (info.error, info.first_id, info.last_id) == ("boom", 1, 2)
    assert reads == []

    # The next buffer under the key: ids go on, the mirror starts it afresh from the message.
    await a.create("s2")
    await until(lambda: b.get("s2").state is BufferState.OPEN)
    info = b.get("s2")
    assert (info.first_id, info.last_id, info.meta, info.error) == (3, 2, {}, None)
    assert reads == []


async def test_a_metadata_message_without_the_last_id_is_applied_to_a_known_buffer_and_read_back_otherwise(
    hubs,
) -> None:
    a, b = hubs
    await a.create("s3", {"n": 1})
    await a.append("s3", "text-delta", {"delta": "x"})
    await until(lambda: b.get("s3") is not None)
    # From a replica that does not write the stream: the `meta` script, whose message has no last id.
    await b.update_meta("s3", n=2)
    await until(lambda: a.get("s3").meta == {"n": 2})
    assert a.get("s3").last_id == 1  # what A knows of its own stream is kept

    reads = count_read_backs(b)
    b._mirror.infos.pop("s3")  # as if B had started after the buffer was opened: its last id is unknown to B
    info = await b._replica._changed("s3", {"k": "s3", "s": "open", "f": 1, "m": '{"n": 3}', "e": ""})
    assert reads == ["s3"] and info is not None and (info.last_id, info.meta) == (1, {"n": 2})  # Redis's state


def test_a_bare_key_on_the_changes_channel_is_read_back() -> None:
    assert parse_change("s4") == ("s4", None)
    assert parse_change("{not json") == ("{not json", None)
    assert parse_change('{"k": "s4", "s": "paused", "f": 1}') == ("s4", None)  # a state this replica does not know
    assert parse_change('{"k": "s4", "s": "open", "f": false}') == ("s4", None)
    key, change = parse_change('{"k": "s4", "s": "open", "f": 1, "l": 0, "m": "{}", "e": ""}')
    assert key == "s4" and change is not None and change["s"] == "open"


async def test_the_owner_reads_its_own_open_stream_from_its_mirror_and_a_finished_one_from_redis(
    hubs, commands
) -> None:
    a, _b = hubs
    label(a, "a")
    await a.create("s5")
    await a.append("s5", "text-delta", {"delta": "x"})
    commands.clear()
    info = await a.refresh("s5")
    assert info is not None and (info.state, info.last_id) == (BufferState.OPEN, 1)
    assert commands.get("a") is None
    await a.finish("s5")
    commands.clear()
    info = await a.refresh("s5")
    assert info is not None and info.state is BufferState.DONE
    assert commands["a"] == Counter({"HGETALL": 1, "XRANGE": 1, "XREVRANGE": 1})


async def test_a_reader_on_the_owner_replays_its_newest_events_from_memory_and_older_ones_from_redis(
    hubs, commands
) -> None:
    a, _b = hubs
    label(a, "a")
    await a.create("s6")
    for n in range(OWNER_TAIL_EVENTS + 10):
        await a.append("s6", "text-delta", {"delta": str(n)})
    last = OWNER_TAIL_EVENTS + 10
    commands.clear()

    recent = a.subscribe("s6", after=last - 5)  # a resume a few events back: from memory
    assert [(await anext(recent)).id for _ in range(5)] == list(range(last - 4, last + 1))
    assert commands.get("a") is None
    recent.close()

    everything = a.subscribe("s6")  # from the first event: older than what the owner keeps, from Redis
    reader = asyncio.create_task(collect(everything))
    await asyncio.sleep(0.05)
    await a.append("s6", "text-delta", {"delta": "live"})
    await a.finish("s6")
    assert await asyncio.wait_for(reader, 5) == list(range(1, last + 2))
    assert commands["a"]["XRANGE"] >= 1


async def collect(subscription) -> list[int]:
    return [event.id async for event in subscription]


def event(n: int):
    from core.streaming.hub import StreamEvent

    return StreamEvent(n, "text-delta", {"delta": str(n)})


def test_the_owners_tail_answers_only_what_it_holds_without_a_hole() -> None:
    tail = OwnerTail(first=1)
    for n in (1, 2, 4):  # 3 is on its way: 4 came back first
        tail.add(event(n))
    assert [e.id for e in tail.range(1, 3)] == [1, 2]
    assert tail.range(1, None) is None and tail.range(3, 5) is None  # the hole: read from Redis
    tail.add(event(3))
    assert [e.id for e in tail.range(2, None)] == [2, 3, 4]
    assert tail.range(5, None) == []  # nothing written past 4 yet: what comes, comes live
    for n in range(5, OWNER_TAIL_EVENTS + 10):
        tail.add(event(n))
    assert tail.range(1, None) is None  # the oldest are no longer kept
    assert tail.range(OWNER_TAIL_EVENTS + 9, None)[0].id == OWNER_TAIL_EVENTS + 9
