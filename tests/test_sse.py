"""SSEStream (seed 002) over real HTTP on 127.0.0.1: every behaviour asserted on the raw bytes a client gets."""

from __future__ import annotations

import asyncio
import json
import socket
import uuid
from datetime import datetime

import pytest

from core.streaming.sse import SSEDataError
from core.streaming.sse_stream import SSEStream
from tests.test_sse_harness import RawReader, SSEServer, parse_sse, read_raw


def new_stream(server: SSEServer, **options) -> tuple[str, SSEStream]:
    """A stream served at `/sse/<name>`; keep-alive off unless asked (so the bytes are exact)."""
    options.setdefault("keepalive_s", None)
    name = uuid.uuid4().hex[:12]
    stream = SSEStream(**options)
    server.streams[name] = stream
    return f"/sse/{name}", stream


def iso(timestamp: str) -> datetime:
    assert timestamp.endswith("Z") and len(timestamp) == len("2026-01-01T12:00:00.000Z"), timestamp
    return datetime.fromisoformat(timestamp.replace("Z", "+00:00"))


# -- the buffer before a client attaches -------------------------------------------------------


async def test_events_sent_before_attach_are_buffered_then_flushed_in_order(server, client) -> None:
    url, stream = new_stream(server, retry_ms=1500)
    assert await server.call(stream.send_progress, "task-123", "starting", 0) == 1
    assert await server.call(stream.send_event, "custom-event", {"key": "value"}) == 2
    assert await server.call(stream.send_event, "note", "plain text") == 3

    buffered = await server.call(stream.get_buffer)
    assert [(e.id, e.event) for e in buffered] == [(1, "progress"), (2, "custom-event"), (3, "note")]
    buffered.clear()  # a copy
    assert len(await server.call(stream.get_buffer)) == 3

    async with client.stream("GET", url) as response:
        assert response.status_code == 200
        reader = RawReader(response)
        body = await reader.until(lambda b: b.count(b"\n\n") >= 3)
        assert body.startswith(b'retry: 1500\nid: 1\nevent: progress\ndata: {"taskId":"task-123"')
        assert body.endswith(
            b'id: 2\nevent: custom-event\ndata: {"key":"value"}\n\nid: 3\nevent: note\ndata: plain text\n\n'
        )
        assert await server.call(stream.get_buffer) == []  # flushed to the client

        assert await server.call(stream.send_event, "live", {"n": 4}) == 4
        body = await reader.until(lambda b: b.count(b"\n\n") >= 4)
        assert body.endswith(b'id: 4\nevent: live\ndata: {"n":4}\n\n')
    events = parse_sse(body).events
    assert [e.id for e in events] == ["1", "2", "3", "4"] and events[0].retry == 1500


async def test_the_buffer_is_bounded_dropping_the_oldest_and_counting(server, client) -> None:
    url, stream = new_stream(server, max_buffer_size=3)
    for i in range(1, 6):
        await server.call(stream.send_event, "n", i)
    assert stream.dropped == 2
    assert [e.id for e in await server.call(stream.get_buffer)] == [3, 4, 5]
    async with client.stream("GET", url) as response:
        events = await RawReader(response).events(3)
    assert [(e.id, e.data) for e in events] == [("3", "3"), ("4", "4"), ("5", "5")]


# -- the seed's `new SSEStream({res})`: made with the request ---------------------------------


def new_producer(server: SSEServer, first_events: list[tuple[str, object]], **options) -> tuple[str, str]:
    """A route at `/new/<name>` making `SSEStream(request=request, ...)`: sends `first_events`, returns its response.

    The stream is kept in `server.streams[name]` (so `/sse/<name>` serves the same one); returns (url, name).
    """
    options.setdefault("keepalive_s", None)
    name = uuid.uuid4().hex[:12]

    def route(request):
        stream = SSEStream(request=request, **options)
        server.streams[name] = stream
        for event, data in first_events:
            stream.send_event(event, data)
        return stream.response

    server.producers[name] = route
    return f"/new/{name}", name


async def test_a_stream_made_with_the_request_answers_it_as_attach_would(server, client) -> None:
    """`SSEStream(request=r).response` is byte for byte `SSEStream()` then `attach(r)`: seed 002's `res` option."""
    first = [("progress", {"taskId": "t-1", "message": "starting", "progress": 0}), ("note", "plain text")]
    url, name = new_producer(server, first, retry_ms=1500)
    async with client.stream("GET", url) as response:
        assert response.status_code == 200
        assert response.headers["content-type"].startswith("text/event-stream")
        reader = RawReader(response)
        await reader.until(lambda b: b.count(b"\n\n") >= 2)
        stream = server.streams[name]
        assert stream.subscribers == 1 and await server.call(stream.get_buffer) == []  # flushed to this client
        assert await server.call(stream.send_event, "live", {"n": 3}) == 3
        await reader.until(lambda b: b.count(b"\n\n") >= 3)
        await server.call(stream.close)
        made_with_request = await reader.to_end()
    assert reader.ended

    # The same events through a stream constructed, then attached by the route.
    attached_url, attached = new_stream(server, retry_ms=1500)
    for event, data in [*first, ("live", {"n": 3})]:
        await server.call(attached.send_event, event, data)
    await server.call(attached.close)
    _, by_attach = await read_raw(client, attached_url)
    assert made_with_request == by_attach
    assert made_with_request == (
        b'retry: 1500\nid: 1\nevent: progress\ndata: {"taskId":"t-1","message":"starting","progress":0}\n\n'
        b"id: 2\nevent: note\ndata: plain text\n\n"
        b'id: 3\nevent: live\ndata: {"n":3}\n\n'
    )


async def test_a_stream_made_with_the_request_closes_when_that_client_leaves(server, client) -> None:
    url, name = new_producer(server, [("a", 1)])
    async with client.stream("GET", url) as response:
        await RawReader(response).events(1)
        stream = server.streams[name]
        closes: list[str | None] = []
        await server.call(stream.on, "close", lambda: closes.append(stream.close_reason))
    await server.wait_for(stream.is_closed)
    assert closes == ["disconnect"] and stream.subscribers == 0


async def test_a_stream_made_with_the_request_takes_more_clients_and_none_without_one(server, client) -> None:
    url, name = new_producer(server, [("a", 1)], close_on_disconnect=False)
    async with client.stream("GET", url) as response:
        await RawReader(response).events(1)
    stream = server.streams[name]
    await server.call(stream.send_event, "b", 2)
    # Another client attaches to the same stream and resumes after what the first one saw.
    _, body = await read_raw(client, f"/sse/{name}", headers={"Last-Event-ID": "1"}, until=lambda b: b"\n\n" in b)
    assert [(e.type, e.id) for e in parse_sse(body).events] == [("b", "2")]
    assert SSEStream().response is None  # without a request nothing is attached


# -- send_event and the seed's typed events ----------------------------------------------------


async def test_send_event_json_encodes_non_strings_and_splits_lines(server, client) -> None:
    url, stream = new_stream(server, retry_ms=None)
    await server.call(stream.send_event, "obj", {"a": [1, 2], "ü": "é", "nl": "x\ny"})
    await server.call(stream.send_event, "num", 42)
    await server.call(stream.send_event, "none", None)
    await server.call(stream.send_event, "text", "line one\nline two\r\nline three\r")
    await server.call(stream.send_event, "empty", "")
    await server.call(stream.close)
    _, body = await read_raw(client, url)
    assert (
        body
        == (
            'id: 1\nevent: obj\ndata: {"a":[1,2],"ü":"é","nl":"x\\ny"}\n\n'
            "id: 2\nevent: num\ndata: 42\n\n"
            "id: 3\nevent: none\ndata: null\n\n"
            "id: 4\nevent: text\ndata: line one\ndata: line two\ndata: line three\ndata: \n\n"
            "id: 5\nevent: empty\ndata: \n\n"
        ).encode()
    )
    events = parse_sse(body).events
    assert events[0].json == {"a": [1, 2], "ü": "é", "nl": "x\ny"}
    assert events[3].data == "line one\nline two\nline three\n" and events[4].data == ""


async def test_unserialisable_data_raises_at_the_call_and_the_stream_goes_on(server, client) -> None:
    url, stream = new_stream(server)
    circular: list = []
    circular.append(circular)
    for bad in (object(), {1, 2}, float("nan"), circular, {"when": datetime.now()}, b"bytes"):
        with pytest.raises(SSEDataError, match="not JSON-serialisable"):
            await server.call(stream.send_event, "bad", bad)
    with pytest.raises(SSEDataError):
        await server.call(stream.send_artifact, "t", object())
    for name in ("", "two\nlines", None):
        with pytest.raises(ValueError):
            await server.call(stream.send_event, name, 1)
    assert await server.call(stream.send_event, "good", 1) == 1  # no id was used up
    await server.call(stream.close)
    _, body = await read_raw(client, url)
    assert [(e.type, e.id) for e in parse_sse(body).events] == [("good", "1")]


async def test_progress_artifact_and_state_carry_the_seed_payloads(server, client) -> None:
    url, stream = new_stream(server)
    before = datetime.now().astimezone()
    await server.call(stream.send_progress, "task-123", "working", 45)
    await server.call(stream.send_progress, "task-123", "no number")
    await server.call(stream.send_artifact, "task-123", {"type": "report", "files": ["output.txt"]})
    await server.call(stream.send_state_change, "task-123", "running", "completed")
    for bad in (150, -1, "50", True):
        with pytest.raises(ValueError, match="progress"):
            await server.call(stream.send_progress, "task-123", "x", bad)
    await server.call(stream.close)
    _, body = await read_raw(client, url)
    events = parse_sse(body).events
    assert [e.type for e in events] == ["progress", "progress", "artifact", "state"]
    p1, p2, art, state = (e.json for e in events)
    assert list(p1) == ["taskId", "message", "progress", "timestamp"]
    assert p1 | {"timestamp": None} == {"taskId": "task-123", "message": "working", "progress": 45, "timestamp": None}
    assert p2["progress"] is None
    assert art | {"timestamp": None} == {
        "taskId": "task-123",
        "artifact": {"type": "report", "files": ["output.txt"]},
        "timestamp": None,
    }
    assert state | {"timestamp": None} == {
        "taskId": "task-123",
        "from": "running",
        "to": "completed",
        "timestamp": None,
    }
    stamps = [iso(e["timestamp"]) for e in (p1, p2, art, state)]
    assert stamps == sorted(stamps) and stamps[0] >= before.replace(microsecond=0)


# -- listeners, close --------------------------------------------------------------------------


async def test_listeners_hear_every_event_and_one_close(server) -> None:
    _, stream = new_stream(server)
    seen: list = []
    closes: list = []
    heard_async = asyncio.Event()

    def broken(*_args) -> None:
        raise RuntimeError("a listener bug")

    async def async_listener(sent) -> None:
        heard_async.set()

    def setup() -> None:
        stream.on("event", broken)
        stream.on("event", lambda sent: seen.append((sent["event"], sent["data"])))  # seed 002: one {event, data}
        stream.on("event", async_listener)
        stream.on("close", lambda: closes.append(stream.close_reason))  # seed 002: no argument
        temporary = stream.on("close", lambda: closes.append("removed"))
        stream.off("close", temporary)
        stream.off("close", temporary)  # not there any more: no error
        with pytest.raises(ValueError, match="unknown"):
            stream.on("finish", print)

    await server.call(setup)
    payload = {"k": [1]}
    await server.call(stream.send_event, "a", payload)  # the broken listener does not stop it
    await server.call(stream.send_progress, "t", "m", 5)
    assert seen[0] == ("a", payload) and seen[0][1] is payload  # the data as given
    assert seen[1][0] == "progress" and seen[1][1]["progress"] == 5
    await server.call(stream.close)
    await server.call(stream.close)
    assert closes == ["closed"] and stream.is_closed() and stream.close_reason == "closed"
    assert await server.call(stream.send_event, "late", 1) is None
    assert len(seen) == 2
    await server.wait_for(heard_async.is_set)


async def test_close_ends_every_response_after_what_was_queued(server, client) -> None:
    url, stream = new_stream(server)
    await server.call(stream.send_event, "a", 1)
    async with client.stream("GET", url) as response:
        reader = RawReader(response)
        await reader.events(1)

        def burst_then_close() -> None:
            stream.send_event("b", 2)
            stream.send_event("c", 3)
            stream.close()

        await server.call(burst_then_close)
        body = await reader.to_end()
    assert reader.ended and [e.type for e in parse_sse(body).events] == ["a", "b", "c"]

    # A closed stream still replays for a client that missed its end; nothing more after the last id: 204.
    _, replay = await read_raw(client, url, headers={"Last-Event-ID": "1"})
    assert [e.id for e in parse_sse(replay).events] == ["2", "3"]
    done, body = await read_raw(client, url, headers={"Last-Event-ID": "3"})
    assert done.status_code == 204 and body == b""


# -- connection care ---------------------------------------------------------------------------


async def test_keep_alive_comments_on_the_interval(server, client) -> None:
    url, stream = new_stream(server, keepalive_s=0.05)
    async with client.stream("GET", url) as response:
        body = await RawReader(response).until(lambda b: b.count(b": keep-alive\n\n") >= 3, timeout=2)
    parsed = parse_sse(body)
    assert parsed.events == [] and parsed.comments[:3] == ["keep-alive"] * 3
    assert body.startswith(b": keep-alive\n\n")


async def test_a_client_disconnect_closes_the_stream_and_tells_the_listeners(server, client) -> None:
    url, stream = new_stream(server)
    closes: list[str] = []
    stream.on("close", lambda: closes.append(stream.close_reason))
    await server.call(stream.send_event, "a", 1)
    async with client.stream("GET", url) as response:
        await RawReader(response).events(1)
        assert stream.subscribers == 1
    # leaving the block closed the connection
    await server.wait_for(stream.is_closed)
    assert closes == ["disconnect"] and stream.close_reason == "disconnect" and stream.subscribers == 0
    assert await server.call(stream.send_event, "after", 2) is None  # the producer just learns it is closed


async def test_a_stream_kept_open_on_disconnect_buffers_and_resumes(server, client) -> None:
    url, stream = new_stream(server, close_on_disconnect=False)
    await server.call(stream.send_event, "a", 1)
    async with client.stream("GET", url) as response:
        first = await RawReader(response).events(1)
    await server.wait_for(lambda: stream.subscribers == 0)
    assert not stream.is_closed()
    await server.call(stream.send_event, "b", 2)
    assert [e.id for e in await server.call(stream.get_buffer)] == [2]  # waiting for a client again
    async with client.stream("GET", url, headers={"Last-Event-ID": first[-1].id}) as response:
        resumed = await RawReader(response).events(1)
    assert [(e.type, e.id) for e in resumed] == [("b", "2")]


async def test_a_stalled_client_is_a_write_error_that_closes_without_raising(server) -> None:
    url, stream = new_stream(server, send_timeout_s=0.3, max_buffer_size=8)
    closes: list[str] = []
    stream.on("close", lambda: closes.append(stream.close_reason))
    host, port = server.url.removeprefix("http://").split(":")
    sock = socket.create_connection((host, int(port)))
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 64 * 1024)
    try:
        sock.sendall(f"GET {url} HTTP/1.1\r\nHost: {host}\r\n\r\n".encode())
        head = b""
        while b"\r\n\r\n" not in head:
            head += sock.recv(4096)
        assert head.startswith(b"HTTP/1.1 200")
        await server.wait_for(lambda: stream.subscribers == 1)
        big = "x" * (1 << 20)
        # The client reads nothing more: the writes back up, one waits past 0.3 s, the connection is dropped.
        ids = await server.call(lambda: [stream.send_event("big", big) for _ in range(24)])
        assert ids == list(range(1, 25))
        await server.wait_for(stream.is_closed, timeout=10)
        assert closes == ["write-error"]
        assert await server.call(stream.send_event, "more", 1) is None
    finally:
        sock.close()


async def test_a_failing_write_closes_the_stream_and_the_response_returns(server) -> None:
    """The ASGI `send` raising (a broken socket on a server that reports it)."""
    stream = SSEStream(keepalive_s=None)
    closes: list[str] = []
    stream.on("close", lambda: closes.append(stream.close_reason))
    stream.send_event("a", 1)
    sent: list[dict] = []
    disconnect = asyncio.Event()

    async def send(message: dict) -> None:
        if message["type"] == "http.response.body" and message["body"]:
            if sent:
                raise OSError("broken pipe")
            sent.append(message)

    async def receive() -> dict:
        await disconnect.wait()
        return {"type": "http.disconnect"}

    response = stream.attach()
    task = asyncio.create_task(response({"type": "http", "method": "GET", "headers": []}, receive, send))
    await asyncio.sleep(0.05)
    stream.send_event("b", 2)  # this write fails
    await asyncio.wait_for(task, 2)  # no exception out of the response
    assert closes == ["write-error"] and stream.is_closed()
    assert sent[0]["body"].endswith(b"id: 1\nevent: a\ndata: 1\n\n")
    assert stream.send_event("c", 3) is None


async def test_head_answers_headers_and_leaves_no_subscriber(server, client) -> None:
    url, stream = new_stream(server)
    response = await client.head(url)
    assert response.status_code == 200 and response.content == b""
    assert response.headers["content-type"].startswith("text/event-stream")
    assert stream.subscribers == 0 and not stream.is_closed()


async def test_headers_and_no_gzip_buffering(server, client) -> None:
    url, stream = new_stream(server)
    async with client.stream("GET", url, headers={"Accept-Encoding": "gzip"}) as response:
        assert response.headers["content-type"].startswith("text/event-stream")
        assert response.headers["cache-control"] == "no-cache"
        assert response.headers["x-accel-buffering"] == "no"
        assert "content-encoding" not in response.headers  # GZipMiddleware (as NiceGUI adds it) stays out
        reader = RawReader(response)
        await server.call(stream.send_event, "one", 1)
        body = await reader.until(lambda b: b"\n\n" in b, timeout=2)  # arrives while the stream is open
    assert body.endswith(b"id: 1\nevent: one\ndata: 1\n\n")


# -- resume --------------------------------------------------------------------------------


async def test_resume_after_last_event_id_header_or_query_then_live(server, client) -> None:
    url, stream = new_stream(server, close_on_disconnect=False)
    for i in range(1, 6):
        await server.call(stream.send_event, "n", i)
    for headers, query in (({"Last-Event-ID": "3"}, ""), ({}, "?lastEventId=3")):
        after_three = [str(i) for i in range(4, stream.last_id + 1)]
        async with client.stream("GET", url + query, headers=headers) as response:
            reader = RawReader(response)
            assert [e.id for e in await reader.events(len(after_three))] == after_three
            sent = await server.call(stream.send_event, "n", "live")
            events = await reader.events(len(after_three) + 1)
        assert [e.id for e in events] == [*after_three, str(sent)] and events[-1].data == "live"


@pytest.mark.parametrize(
    ("last_id", "reason"),
    [
        ("abc", "Last-Event-ID 'abc' is not a number"),
        ("1", "events after 1 are no longer buffered"),
        ("99", "event 99 does not belong to this stream"),
    ],
)
async def test_an_unusable_last_event_id_gets_a_reset_then_the_whole_buffer(server, client, last_id, reason) -> None:
    url, stream = new_stream(server, max_buffer_size=3)
    for i in range(1, 7):
        await server.call(stream.send_event, "n", i)
    await server.call(stream.close)
    _, body = await read_raw(client, url, headers={"Last-Event-ID": last_id})
    reset = json.dumps({"type": "reset", "reason": reason}, separators=(",", ":")).encode()
    assert body.startswith(b"retry: 2000\nevent: reset\ndata: " + reset + b"\n\nid: 4\n")  # the reset has no id
    events = parse_sse(body).events
    assert [(e.type, e.id) for e in events] == [("reset", ""), ("n", "4"), ("n", "5"), ("n", "6")]


async def test_several_subscribers_each_get_every_event(server, client) -> None:
    url, stream = new_stream(server)
    async with client.stream("GET", url) as r1, client.stream("GET", url) as r2, client.stream("GET", url) as r3:
        readers = [RawReader(r) for r in (r1, r2, r3)]
        await server.wait_for(lambda: stream.subscribers == 3)
        for i in range(10):
            await server.call(stream.send_event, "n", i)
        results = await asyncio.gather(*(reader.events(10) for reader in readers))
    for events in results:
        assert [e.data for e in events] == [str(i) for i in range(10)]


async def test_a_slow_subscriber_gets_an_overflow_event_and_is_cut_off(server, client) -> None:
    url, stream = new_stream(server, subscriber_queue=3)
    async with client.stream("GET", url) as response:
        reader = RawReader(response)
        await server.wait_for(lambda: stream.subscribers == 1)
        # Ten events at once: the connection's queue holds three, then it is cut off.
        await server.call(lambda: [stream.send_event("n", i) for i in range(1, 11)])
        body = await reader.to_end()
    events = parse_sse(body).events
    assert [e.id for e in events[:3]] == ["1", "2", "3"]
    assert events[3].type == "overflow" and events[3].id == "3"  # no id of its own
    assert events[3].json == {"type": "overflow", "reason": "this client fell behind by 3 events", "lastEventId": 3}
    assert len(events) == 4 and stream.close_reason is None and stream.subscribers == 0
    _, rest = await read_raw(client, url, headers={"Last-Event-ID": "3"}, until=lambda b: b.count(b"\n\n") >= 7)
    assert [e.id for e in parse_sse(rest).events] == [str(i) for i in range(4, 11)]


async def test_an_unknown_stream_is_a_404_with_json(client) -> None:
    response = await client.get("/sse/no-such-stream")
    assert response.status_code == 404 and response.json() == {"detail": "There is no such stream."}


async def test_seed_style_listeners_get_one_event_object_and_a_bare_close(server, client) -> None:
    """Seed 002's listeners, translated as they are written there (issue 16 item 9).

    sse.on('event', ({ event, data }) => console.log(`发送事件: ${event}`, data));
    sse.on('close', () => console.log('SSE 流已关闭'));
    """
    url, stream = new_stream(server)
    log: list[str] = []

    def on_event(sent: dict) -> None:
        event, data = sent["event"], sent["data"]  # the seed's destructuring of one object
        log.append(f"发送事件: {event} {data}")

    def on_close() -> None:  # called with no argument
        log.append("SSE 流已关闭")

    await server.call(lambda: (stream.on("event", on_event), stream.on("close", on_close)))
    async with client.stream("GET", url) as response:
        reader = RawReader(response)
        await server.call(stream.send_state_change, "task-123", "running", "completed")
        body = await reader.until(lambda b: b.count(b"\n\n") >= 1)
        await server.call(stream.close)
    frame = parse_sse(body).events[0]
    assert frame.type == "state"
    state = frame.json
    assert list(state) == ["taskId", "from", "to", "timestamp"]
    assert (state["taskId"], state["from"], state["to"]) == ("task-123", "running", "completed")
    iso(state["timestamp"])
    assert log == [f"发送事件: state {state}", "SSE 流已关闭"]
