"""The owner's appends to the Redis stream hub, a batch per write (core/streaming/redis_batches.py, issue 41).

A batch's `XADD`s are packed by the hub (core/streaming/redis_wire.py) and sent in one write on a connection of its
redis-py pool, their replies read under one timeout. Real Redis (TEST_REDIS_URL), a key prefix of each test's own.
"""

from __future__ import annotations

import asyncio
import json
import secrets
import time
from collections.abc import AsyncIterator

import pytest
from redis.asyncio import Redis
from redis.asyncio.connection import Connection
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff

from core.streaming.redis_batches import Append
from core.streaming.redis_hub import RedisStreamHub
from core.streaming.redis_wire import bulk, pack_command
from tests.utils.broker import redis_test_url
from tests.utils.cluster import delete_prefix, two_redis_hubs
from tests.utils.redis_commands import command_name, on_sent, on_write

pytestmark = pytest.mark.cluster


def test_a_command_is_packed_as_redis_reads_it() -> None:
    args = [b"XADD", b"abc", b"1", b"k", b"", "é\r\n".encode()]
    packed = b"*6\r\n$4\r\nXADD\r\n$3\r\nabc\r\n$1\r\n1\r\n$1\r\nk\r\n$0\r\n\r\n$4\r\n\xc3\xa9\r\n\r\n"
    assert pack_command(args) == packed
    assert pack_command(args) == b"".join(Connection().pack_command(*args))  # as redis-py packs it
    assert pack_command([]) == b"*0\r\n"
    assert bulk(b"t") == b"$1\r\nt\r\n" and bulk(b"") == b"$0\r\n\r\n"


async def test_an_owners_xadd_is_packed_with_its_stream_id_type_and_data(hub) -> None:
    packed = hub._appends.xadd_command(Append("k", 12, ["p:s:k", "p:h:k"], "text-delta", '{"d": "é"}'))
    args = [b"XADD", b"p:s:k", b"MAXLEN", b"~", b"100", b"12-0", b"t", b"text-delta", b"d", '{"d": "é"}'.encode()]
    assert packed == pack_command(args)


@pytest.fixture
async def hub() -> AsyncIterator[RedisStreamHub]:
    """Replica A's hub (B's is there too, unused); a lease of 30 s, so no renewal runs meanwhile."""
    async with two_redis_hubs("batches", lease_s=30.0, max_events=100, ttl_s=60) as (a, _b):
        yield a


@pytest.fixture
async def direct() -> AsyncIterator[Redis]:
    """A client straight to the test Redis, to look."""
    client = Redis.from_url(redis_test_url(), decode_responses=True)
    yield client
    await client.aclose()


def append(hub: RedisStreamHub, key: str, event_id: int, text: str = "") -> Append:
    return Append(key, event_id, [hub._keys.stream(key), hub._keys.hash(key)], "text-delta", json.dumps({"d": text}))


async def entries(direct: Redis, hub: RedisStreamHub, key: str) -> list[tuple[str, str]]:
    """The stream's entries as (id, the delta's text)."""
    return [(entry, json.loads(fields["d"])["d"]) for entry, fields in await direct.xrange(hub._keys.stream(key))]


async def test_a_batch_of_several_streams_is_one_write_and_each_event_lands_at_its_id_in_order(
    hub, direct, monkeypatch
) -> None:
    for key in ("x", "y", "z"):
        await hub.create(key)
    writes: list[list[str]] = []
    on_write(monkeypatch, lambda _client, commands: writes.append([command_name(args) for args in commands]))
    calls = [hub._appends.submit(append(hub, key, n, f"{key}{n}")) for n in (1, 2, 3) for key in ("x", "y", "z")]
    assert await asyncio.gather(*calls) == [1, 1, 1, 2, 2, 2, 3, 3, 3]
    assert writes == [["XADD"] * 9]  # one write, one round trip
    for key in ("x", "y", "z"):
        assert await entries(direct, hub, key) == [("1-0", f"{key}1"), ("2-0", f"{key}2"), ("3-0", f"{key}3")]
    assert hub._appends.stored == {"x": 3, "y": 3, "z": 3}


async def test_an_entry_stored_already_counts_as_written_and_the_others_of_its_batch_are_written(hub, direct) -> None:
    await hub.create("x")
    await hub.create("y")
    assert await hub._appends.submit(append(hub, "x", 1, "first")) == 1
    assert await hub._appends.submit(append(hub, "x", 2, "first")) == 2
    # A retry after a lost answer (2 again) among new events of the same stream and of another one.
    calls = [
        hub._appends.submit(append(hub, "x", 2, "again")),
        hub._appends.submit(append(hub, "x", 3, "new")),
        hub._appends.submit(append(hub, "y", 1, "new")),
    ]
    assert await asyncio.gather(*calls) == [2, 3, 1]
    assert await entries(direct, hub, "x") == [("1-0", "first"), ("2-0", "first"), ("3-0", "new")]
    assert await entries(direct, hub, "y") == [("1-0", "new")]


async def test_a_batch_with_streams_whose_lease_is_in_doubt_sends_those_through_the_checked_script(
    hub, direct, monkeypatch
) -> None:
    await hub.create("sure")
    await hub.create("doubt")
    monkeypatch.setattr(hub._appends, "_lease_ok", lambda key: key != "doubt")
    await direct.script_load(hub._scripts["append_at"].script)  # whatever a test before flushed
    sent: list[str] = []
    on_sent(monkeypatch, lambda _client, args: sent.append(command_name(args)))
    calls = [hub._appends.submit(append(hub, key, n, key)) for n in (1, 2) for key in ("sure", "doubt")]
    assert await asyncio.gather(*calls) == [1, 1, 2, 2]
    assert [name for name in sent if name != "PING"] == ["XADD", "XADD", "EVALSHA append_at", "EVALSHA append_at"]
    assert await entries(direct, hub, "doubt") == [("1-0", "doubt"), ("2-0", "doubt")]
    assert await entries(direct, hub, "sure") == [("1-0", "sure"), ("2-0", "sure")]


async def test_a_batch_that_meets_noscript_loads_the_script_and_is_written(hub, direct, monkeypatch) -> None:
    """Redis restarted or flushed its scripts: the checked appends go again once the script is loaded."""
    await hub.create("sure")
    await hub.create("doubt")
    monkeypatch.setattr(hub._appends, "_lease_ok", lambda key: key != "doubt")
    assert await hub.append("doubt", "text-delta", {"d": "warm"}) == 1  # the script is loaded
    await direct.script_flush()
    calls = [hub._appends.submit(append(hub, "doubt", 2, "d2")), hub._appends.submit(append(hub, "sure", 1, "s1"))]
    assert await asyncio.gather(*calls) == [2, 1]
    assert await entries(direct, hub, "doubt") == [("1-0", "warm"), ("2-0", "d2")]
    assert await entries(direct, hub, "sure") == [("1-0", "s1")]


async def test_a_connection_killed_mid_batch_fails_the_batch_for_the_outage_buffer_and_the_next_batch_works(
    direct,
) -> None:
    """The batch waits in Redis (`CLIENT PAUSE WRITE`) while its connection is killed, and its retry's too."""
    url = redis_test_url()
    prefix = f"a2a-batch-kill-test-{secrets.token_hex(4)}:"
    hub = RedisStreamHub.from_url(url, prefix=prefix, owner="k", lease_s=30.0, max_events=100, ttl_s=60)
    await hub.start()
    try:
        await hub.create("x")
        await hub.create("y")
        assert await hub.append("x", "text-delta", {"d": "x1"}) == 1
        pool = hub.redis.connection_pool
        await direct.execute_command("CLIENT", "PAUSE", 3000, "WRITE")  # lifted below, or after 3 s at worst
        try:
            # The owner counts both ids and goes on at once (`OwnerAppends`); the batch waits for Redis's answers.
            assert [
                await hub.append("x", "text-delta", {"d": "x2"}),
                await hub.append("y", "text-delta", {"d": "y1"}),
            ] == [2, 1]
            answered = asyncio.ensure_future(asyncio.gather(hub.written("x"), hub.written("y")))
            killed = 0
            deadline = time.monotonic() + 2.5
            while not answered.done() and time.monotonic() < deadline:
                ours = {
                    "{}:{}".format(*connection._writer.get_extra_info("sockname")[:2])
                    for connection in pool._in_use_connections  # type: ignore[attr-defined]
                    if connection.is_connected
                }
                for client in await direct.client_list():
                    if client["cmd"] == "xadd" and client["addr"] in ours:
                        await direct.client_kill_filter(_id=client["id"])
                        killed += 1
                await asyncio.sleep(0.01)
        finally:
            await direct.execute_command("CLIENT", "UNPAUSE")
        # The batch failed (the connection and its one retry killed): both are held.
        await answered
        assert killed >= 2 and hub.reach.down and hub.held_events() == 2
        async with asyncio.timeout(10):  # the outage buffer writes them once Redis answers
            while hub.held_events():
                await asyncio.sleep(0.05)
        assert await hub.append("x", "text-delta", {"d": "x3"}) == 3
        await hub.written("x")
        assert hub.held_events() == 0  # the next batch went straight to Redis
        assert await entries(direct, hub, "x") == [("1-0", "x1"), ("2-0", "x2"), ("3-0", "x3")]
        assert await entries(direct, hub, "y") == [("1-0", "y1")]
    finally:
        await hub.stop()
        delete_prefix(url, prefix)


async def test_a_batch_whose_replies_do_not_come_in_time_fails_for_the_outage_buffer(direct) -> None:
    """The replies of a batch are read under one timeout, the connection's: past it (and its retry's) it fails."""
    url = redis_test_url()
    prefix = f"a2a-batch-timeout-test-{secrets.token_hex(4)}:"
    client = Redis.from_url(url, decode_responses=True, socket_timeout=0.2, retry=Retry(NoBackoff(), 1))
    hub = RedisStreamHub(client, prefix=prefix, owner="t", lease_s=30.0, max_events=100, ttl_s=60)
    await hub.start()
    try:
        await hub.create("x")
        assert await hub.append("x", "text-delta", {"d": "x1"}) == 1
        await direct.execute_command("CLIENT", "PAUSE", 2000, "WRITE")  # the XADD waits in Redis
        try:
            started = time.monotonic()
            assert await hub.append("x", "text-delta", {"d": "x2"}) == 2  # counted: the turn goes on
            await hub.written("x")  # Redis's answer: none in time, so the event is held
            assert time.monotonic() - started < 1.5  # two reads of 0.2 s (the first try and its retry), not 2 s
        finally:
            await direct.execute_command("CLIENT", "UNPAUSE")
        assert hub.held_events() == 1 and hub.reach.error is not None and "Timeout" in hub.reach.error
        async with asyncio.timeout(10):
            while hub.held_events():
                await asyncio.sleep(0.05)
        assert await hub.append("x", "text-delta", {"d": "x3"}) == 3
        await hub.written("x")
        assert await entries(direct, hub, "x") == [("1-0", "x1"), ("2-0", "x2"), ("3-0", "x3")]
    finally:
        await hub.stop()
        delete_prefix(url, prefix)
