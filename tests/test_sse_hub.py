"""`hub_sse_response`, the hub's SSE face, over real HTTP on 127.0.0.1: raw bytes, resume, reset, bounds, 404/204."""

from __future__ import annotations

import json
import uuid

import pytest

from core.streaming.hub import StreamHub
from tests.test_sse_harness import RawReader, SSEServer, parse_sse, read_raw


async def new_buffer(
    server: SSEServer, *, hub_options: dict | None = None, **sse_options
) -> tuple[str, StreamHub, str]:
    """A fresh hub with one open buffer; its URL, the hub and the key."""
    sse_options.setdefault("keepalive_s", None)
    name = uuid.uuid4().hex[:12]
    hub = StreamHub(**(hub_options or {}))
    server.hubs[name] = hub
    server.hub_options[name] = sse_options
    key = f"a2a_{name}"
    await server.run(lambda: hub.create(key))
    return f"/hub/{name}/{key}", hub, key


async def append(server: SSEServer, hub: StreamHub, key: str, *events: tuple[str, dict]) -> list[int]:
    async def go() -> list[int]:
        return [await hub.append(key, type_, data) for type_, data in events]

    return await server.run(go)


async def test_seed_types_are_named_events_the_rest_unnamed_for_onmessage(server, client) -> None:
    url, hub, key = await new_buffer(server)
    await append(
        server,
        hub,
        key,
        ("progress", {"taskId": "t", "message": "m", "progress": 5, "timestamp": "T"}),
        ("text-delta", {"id": "text-0", "delta": "Hi\nthere"}),
        ("state", {"taskId": "t", "from": "working", "to": "completed", "timestamp": "T"}),
        ("artifact", {"taskId": "t", "artifact": {"k": "ü"}, "timestamp": "T"}),
        ("error", {"errorText": "boom"}),
    )
    await server.run(lambda: hub.finish(key))
    _, body = await read_raw(client, url)
    assert (
        body
        == (
            'retry: 2000\nid: 1\nevent: progress\ndata: {"taskId":"t","message":"m","progress":5,"timestamp":"T"}\n\n'
            'id: 2\ndata: {"type":"text-delta","id":"text-0","delta":"Hi\\nthere"}\n\n'
            'id: 3\nevent: state\ndata: {"taskId":"t","from":"working","to":"completed","timestamp":"T"}\n\n'
            'id: 4\nevent: artifact\ndata: {"taskId":"t","artifact":{"k":"ü"},"timestamp":"T"}\n\n'
            'id: 5\ndata: {"type":"error","errorText":"boom"}\n\n'
        ).encode()
    )
    assert [e.type for e in parse_sse(body).events] == ["progress", "message", "state", "artifact", "message"]


async def test_named_can_be_chosen_per_endpoint(server, client) -> None:
    url, hub, key = await new_buffer(server, named=())
    await append(server, hub, key, ("progress", {"progress": 1}))
    await server.run(lambda: hub.finish(key))
    _, body = await read_raw(client, url)
    assert body == b'retry: 2000\nid: 1\ndata: {"type":"progress","progress":1}\n\n'


async def test_replay_then_live_until_the_buffer_finishes(server, client) -> None:
    url, hub, key = await new_buffer(server, retry_ms=500)
    await append(server, hub, key, ("text-delta", {"delta": "a"}), ("text-delta", {"delta": "b"}))
    async with client.stream("GET", url) as response:
        assert response.status_code == 200
        assert response.headers["cache-control"] == "no-cache" and response.headers["x-accel-buffering"] == "no"
        assert "content-encoding" not in response.headers
        reader = RawReader(response)
        assert [e.json["delta"] for e in await reader.events(2)] == ["a", "b"]
        await append(server, hub, key, ("text-delta", {"delta": "c"}))
        assert [e.json["delta"] for e in await reader.events(3)] == ["a", "b", "c"]
        await server.run(lambda: hub.finish(key))
        body = await reader.to_end()
    events = parse_sse(body).events
    assert [e.id for e in events] == ["1", "2", "3"] and events[0].retry == 500 and reader.ended


@pytest.mark.parametrize("how", ["header", "query"])
async def test_resume_after_an_id_then_live(server, client, how: str) -> None:
    url, hub, key = await new_buffer(server)
    await append(server, hub, key, *[("text-delta", {"delta": str(i)}) for i in range(1, 6)])
    headers, query = ({"Last-Event-ID": "2"}, "") if how == "header" else ({}, "?lastEventId=2")
    async with client.stream("GET", url + query, headers=headers) as response:
        reader = RawReader(response)
        assert [e.id for e in await reader.events(3)] == ["3", "4", "5"]
        await append(server, hub, key, ("text-delta", {"delta": "6"}))
        assert [e.id for e in await reader.events(4)] == ["3", "4", "5", "6"]


@pytest.mark.parametrize(
    ("last_id", "reason"),
    [
        ("abc", "Last-Event-ID 'abc' is not a number"),
        ("1", "events after 1 are no longer buffered"),
        ("99", "event 99 does not belong to this stream"),
    ],
)
async def test_an_unusable_id_gets_a_reset_then_everything_buffered(server, client, last_id, reason) -> None:
    url, hub, key = await new_buffer(server, hub_options={"max_events": 3})
    await append(server, hub, key, *[("text-delta", {"delta": str(i)}) for i in range(1, 7)])
    await server.run(lambda: hub.finish(key))
    _, body = await read_raw(client, url, headers={"Last-Event-ID": last_id})
    reset = json.dumps({"type": "reset", "reason": reason}, separators=(",", ":")).encode()
    assert body.startswith(b"retry: 2000\nevent: reset\ndata: " + reset + b"\n\nid: 4\ndata: ")
    assert [e.id for e in parse_sse(body).events] == ["", "4", "5", "6"]


async def test_a_finished_buffer_with_nothing_after_the_id_is_204_and_unknown_is_404(server, client) -> None:
    url, hub, key = await new_buffer(server)
    await append(server, hub, key, ("text-delta", {"delta": "a"}), ("finish", {}))
    await server.run(lambda: hub.finish(key))
    done = await client.get(url, headers={"Last-Event-ID": "2"})
    assert done.status_code == 204 and done.content == b""
    _, replay = await read_raw(client, url, headers={"Last-Event-ID": "1"})
    assert [e.json["type"] for e in parse_sse(replay).events] == ["finish"]
    missing = await client.get(url.rsplit("/", 1)[0] + "/a2a_nothing")
    assert missing.status_code == 404 and missing.json() == {"detail": "There is no such stream."}


async def test_a_slow_subscriber_gets_overflow_then_resumes(server, client) -> None:
    url, hub, key = await new_buffer(server, hub_options={"subscriber_queue": 3})
    async with client.stream("GET", url) as response:
        reader = RawReader(response)
        await server.wait_for(lambda: hub.get(key).subscribers == 1)
        await append(server, hub, key, *[("text-delta", {"delta": str(i)}) for i in range(1, 11)])
        body = await reader.to_end()
    events = parse_sse(body).events
    assert [e.id for e in events[:3]] == ["1", "2", "3"] and len(events) == 4
    assert events[3].type == "overflow" and events[3].json["lastEventId"] == 3 and events[3].id == "3"
    assert "fell behind by 3 events" in events[3].json["reason"]
    _, rest = await read_raw(client, url, headers={"Last-Event-ID": "3"}, until=lambda b: b.count(b"\n\n") >= 7)
    assert [e.id for e in parse_sse(rest).events] == [str(i) for i in range(4, 11)]


async def test_a_disconnect_releases_the_subscription(server, client) -> None:
    url, hub, key = await new_buffer(server)
    await append(server, hub, key, ("text-delta", {"delta": "a"}))
    async with client.stream("GET", url) as response:
        await RawReader(response).events(1)  # now idle, waiting for the next event
        assert hub.get(key).subscribers == 1
    await server.wait_for(lambda: hub.get(key).subscribers == 0)
    assert await append(server, hub, key, ("text-delta", {"delta": "b"})) == [2]  # the producer is unaffected


async def test_keep_alive_is_configurable(server, client) -> None:
    url, hub, key = await new_buffer(server, keepalive_s=0.05)
    async with client.stream("GET", url) as response:
        body = await RawReader(response).until(lambda b: b.count(b": keep-alive\n\n") >= 2, timeout=2)
    assert parse_sse(body).comments[:2] == ["keep-alive", "keep-alive"]


async def test_a_burst_arrives_whole_and_in_order(server, client) -> None:
    """Queued events go out together in few writes; on the wire that must not be visible."""
    url, hub, key = await new_buffer(server)
    async with client.stream("GET", url) as response:
        reader = RawReader(response)
        await server.wait_for(lambda: hub.get(key).subscribers == 1)
        await append(server, hub, key, *[("text-delta", {"delta": f"{i}\n"}) for i in range(1, 3001)])
        await server.run(lambda: hub.finish(key))
        body = await reader.to_end()
    events = parse_sse(body).events
    assert [int(e.id) for e in events] == list(range(1, 3001))
    assert [e.json["delta"] for e in events] == [f"{i}\n" for i in range(1, 3001)]


async def test_head_answers_headers_and_releases_the_subscription(server, client) -> None:
    url, hub, key = await new_buffer(server)
    response = await client.head(url)
    assert response.status_code == 200 and response.content == b""
    assert response.headers["content-type"].startswith("text/event-stream")
    await server.wait_for(lambda: hub.get(key).subscribers == 0)
