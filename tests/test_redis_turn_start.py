"""What a turn start asks of Redis in a cluster (issue 41): the commands each replica sends, counted.

Two hubs in one process stand for two replicas on a real Redis (TEST_REDIS_URL), a key prefix of each
test's own. A turn start at the hub: the claim (`create`), the turn's metadata (`update_meta`), the stream
route's `refresh` and replay on the replica that runs it, a few events, the end. The commands are counted
as redis-py packs them (`Connection.pack_command`), so pipelined ones count one by one, and what a script
runs inside Redis does not count (its `EVALSHA` does).
"""

from __future__ import annotations

import asyncio
import secrets
from collections import Counter
from collections.abc import AsyncIterator
from typing import Any

import pytest
from redis.asyncio import Redis
from redis.asyncio.connection import Connection

from core.streaming.hub import BufferState
from core.streaming.redis_hub import RedisStreamHub
from core.streaming.redis_mirror import parse_change
from tests.conftest import unavailable
from tests.utils.broker import redis_test_url
from tests.utils.cluster import delete_prefix, redis_reachable

pytestmark = pytest.mark.cluster


@pytest.fixture
async def hubs() -> AsyncIterator[tuple[RedisStreamHub, RedisStreamHub]]:
    """Replica A's hub and replica B's; leases of 30 s, so no renewal runs while a test counts."""
    url = redis_test_url()
    if (reason := redis_reachable(url)) is not None:
        unavailable(reason)
    prefix = f"a2a-turn-start-test-{secrets.token_hex(4)}:"
    hubs = [
        RedisStreamHub(Redis.from_url(url, decode_responses=True), prefix=prefix, owner=name, lease_s=30.0, ttl_s=60)
        for name in ("a", "b")
    ]
    for hub in hubs:
        await hub.start()
    try:
        yield hubs[0], hubs[1]
    finally:
        for hub in hubs:
            await hub.stop()
        delete_prefix(url, prefix)


async def until(check: Any, timeout: float = 5.0) -> None:
    deadline = asyncio.get_running_loop().time() + timeout
    while not check():
        assert asyncio.get_running_loop().time() < deadline, "not reached in time"
        await asyncio.sleep(0.01)


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
    pack = Connection.pack_command

    def counting(self: Connection, *args: Any) -> list[bytes]:
        client = getattr(self, "_test_client", "other")
        by_client.setdefault(client, Counter())[str(args[0]).upper()] += 1
        return pack(self, *args)

    monkeypatch.setattr(Connection, "pack_command", counting)
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


async def test_a_turn_start_sends_three_scripts_and_one_replay_and_the_other_replica_reads_nothing(
    hubs, commands
) -> None:
    a, b = hubs
    label(a, "a")
    label(b, "b")
    assert await a_turn(a, "warm-up", 1) == [1]  # the scripts are loaded (a fresh Redis: SCRIPT LOAD once)
    await until(lambda: (info := b.get("warm-up")) is not None and info.state is BufferState.DONE)
    commands.clear()

    assert await a_turn(a, "s1", 3) == [1, 2, 3]
    await until(lambda: (info := b.get("s1")) is not None and info.state is BufferState.DONE)
    # create, meta and finish (3 scripts); the replay of the stream route's reader; the tokens' XADDs. The
    # stream route's refresh on the replica that runs the turn reads nothing (its mirror is what Redis has).
    assert commands.get("a") == Counter({"EVALSHA": 3, "XRANGE": 1, "XADD": 3})
    # The other replica mirrors the three changes from their messages: no read-back.
    assert commands.get("b") is None
    info = b.get("s1")
    assert info is not None and (info.first_id, info.last_id) == (1, 3)
    assert info.meta == {"draftId": 7, "agentSlug": "helper"}


async def test_a_change_message_carries_the_state_the_other_replica_applies_without_a_read(hubs) -> None:
    a, b = hubs
    reads: list[str] = []
    read_back = b._replica._refresh

    async def refresh(key: str):
        reads.append(key)
        return await read_back(key)

    b._replica._refresh = refresh
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


async def test_a_metadata_message_of_a_buffer_not_seen_opened_is_read_back(hubs) -> None:
    a, b = hubs
    await a.create("s3", {"n": 1})
    await until(lambda: b.get("s3") is not None)
    b._mirror.infos.pop("s3")  # as if B had started after the buffer was opened
    await a.append("s3", "text-delta", {"delta": "x"})
    await a.update_meta("s3", n=2)  # its message does not carry the last id: B reads the state from Redis
    await until(lambda: b.get("s3") is not None)
    info = b.get("s3")
    assert (info.last_id, info.meta) == (1, {"n": 2})


def test_a_bare_key_on_the_changes_channel_is_read_back() -> None:
    assert parse_change("s4") == ("s4", None)
    assert parse_change("{not json") == ("{not json", None)
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
