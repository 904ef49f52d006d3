"""The stream hub's two backends (core/streaming/backend.py): one declared interface, the same behaviour.

`StreamHub` (in process) and `RedisStreamHub` (real Redis at TEST_REDIS_URL, a key prefix of each test's
own, removed at the end) both satisfy `StreamHubBackend` under mypy, and run the same scenario alike.
"""

from __future__ import annotations

import asyncio
import secrets
import textwrap
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from mypy import api as mypy_api
from redis.asyncio import Redis

from core.streaming.backend import HubSubscription, StreamHubBackend, refresh
from core.streaming.hub import (
    BufferState,
    StreamBusyError,
    StreamClosedError,
    StreamEvent,
    StreamHub,
    UnknownStreamError,
)
from core.streaming.redis_hub import RedisStreamHub
from tests.conftest import unavailable
from tests.utils.broker import redis_test_url
from tests.utils.cluster import delete_prefix, redis_reachable

ROOT = Path(__file__).resolve().parent.parent


def test_both_backends_satisfy_the_protocol_under_mypy(tmp_path: Path) -> None:
    """Each backend type-checks as a `StreamHubBackend`; a stand-in that lacks methods does not."""
    snippet = tmp_path / "conformance.py"
    snippet.write_text(
        textwrap.dedent(
            """
            from core.streaming.backend import HubSubscription, StreamHubBackend
            from core.streaming.hub import StreamHub, Subscription
            from core.streaming.redis_hub import RedisStreamHub, RedisSubscription

            def conforms(in_process: StreamHub, cluster: RedisStreamHub) -> None:
                hub: StreamHubBackend = in_process
                hub = cluster
                subscription: HubSubscription
                subscription = in_process.subscribe("k")
                subscription = cluster.subscribe("k")

            class NoSweep:
                def keys(self) -> list[str]:
                    return []

            def refused(stand_in: NoSweep) -> None:
                hub: StreamHubBackend = stand_in  # the one error expected
            """
        )
    )
    out, err, status = mypy_api.run(
        [
            "--config-file",
            str(ROOT / "pyproject.toml"),
            "--follow-imports=silent",  # judge the snippet, not the rest of the tree
            "--cache-dir",
            str(ROOT / ".mypy_cache"),
            str(snippet),
        ]
    )
    errors = [line for line in out.splitlines() if ": error:" in line]
    assert len(errors) == 1, out + err
    expected_line = 1 + snippet.read_text().splitlines().index(
        "    hub: StreamHubBackend = stand_in  # the one error expected"
    )
    assert f"conformance.py:{expected_line}:" in errors[0] and '"NoSweep"' in errors[0], out
    assert status == 1


@pytest.fixture(params=["in-process", "redis"])
async def hub(request: pytest.FixtureRequest) -> AsyncIterator[StreamHubBackend]:
    """Each backend in turn, with a small buffer so that trimming shows."""
    if request.param == "in-process":
        yield StreamHub(max_events=10, ttl_s=60)
        return
    url = redis_test_url()
    if (reason := redis_reachable(url)) is not None:
        unavailable(reason)
    prefix = f"a2a-backend-test-{secrets.token_hex(4)}:"
    # Redis trims approximately (`MAXLEN ~`), so its buffer keeps at least max_events, maybe more.
    redis_hub = RedisStreamHub(
        Redis.from_url(url, decode_responses=True), prefix=prefix, owner="solo", lease_s=5.0, max_events=10, ttl_s=60
    )
    await redis_hub.start()
    try:
        yield redis_hub
    finally:
        await redis_hub.stop()
        delete_prefix(url, prefix)


async def test_the_same_scenario_runs_alike_on_both_backends(hub: StreamHubBackend) -> None:
    """Create, append, resume after an id (replay then live), finish, refuse, re-create with ids going on."""
    info = await hub.create("k", {"who": "test"})
    assert (info.state, info.first_id, info.last_id, info.meta) == (BufferState.OPEN, 1, 0, {"who": "test"})
    with pytest.raises(StreamBusyError):
        await hub.create("k")
    assert [await hub.append("k", "text-delta", {"delta": str(n)}) for n in range(1, 4)] == [1, 2, 3]
    await hub.update_meta("k", progress=3)

    resumed = hub.subscribe("k", after=1)  # a client that saw event 1 (Last-Event-ID: 1)
    assert resumed.key == "k" and not resumed.gap and not resumed.ahead
    reader = asyncio.create_task(_collect(resumed))
    await asyncio.sleep(0.05)
    assert await hub.append("k", "text-delta", {"delta": "4"}) == 4  # live, after the replay
    await hub.finish("k")
    events = await asyncio.wait_for(reader, 5)
    assert [(e.id, e.type, e.data) for e in events] == [(n, "text-delta", {"delta": str(n)}) for n in (2, 3, 4)]

    done = await refresh(hub, "k")
    assert done is not None and (done.state, done.last_id, done.meta) == (
        BufferState.DONE,
        4,
        {"who": "test", "progress": 3},
    )
    assert hub.get("k") == done
    assert [e.id for e in await _collect(hub.subscribe("k", after=3))] == [4]  # a finished buffer still replays
    ahead = hub.subscribe("k", after=99)
    assert ahead.ahead
    ahead.close()
    with pytest.raises(StreamClosedError):
        await hub.append("k", "text-delta", {})
    with pytest.raises(UnknownStreamError):
        hub.subscribe("never-created")
    assert await refresh(hub, "never-created") is None

    again = await hub.create("k")  # the next turn of the same key: ids go on, no client sees an id twice
    assert (again.first_id, again.last_id) == (5, 4)
    assert "k" in hub.keys() and hub.live_streams() == 1
    for n in range(300):  # Redis trims whole nodes of 100 entries (`MAXLEN ~`): enough for it to trim
        await hub.append("k", "e", {"n": n})
    await refresh(hub, "k")  # in a cluster, the first id still held is read from Redis
    trimmed = hub.subscribe("k", after=5)
    assert trimmed.gap  # the oldest events of this buffer were dropped
    trimmed.close()
    await hub.finish("k", error="boom")
    ended = await refresh(hub, "k")
    assert ended is not None and (ended.state, ended.error) == (BufferState.ERROR, "boom")
    assert hub.live_streams() == 0 and hub.sweep() == 0  # finished a moment ago: kept for its TTL


async def _collect(subscription: HubSubscription) -> list[StreamEvent]:
    return [event async for event in subscription]
