"""TaskEvents: a task's progress, state changes and artifacts reach every open SSE stream of it (real HTTP)."""

from __future__ import annotations

import uuid

import pytest

from core.streaming.hub import StreamBusyError, StreamClosedError, StreamHub, UnknownStreamError
from core.streaming.sse import SSEDataError
from core.streaming.task_manager import TaskEvents
from tests.test_sse_harness import RawReader, SSEServer, parse_sse, read_raw


def new_manager(server: SSEServer, **sse_options) -> tuple[str, TaskEvents]:
    """A TaskEvents on its own hub; tasks are served at `<prefix>/<taskId>`."""
    sse_options.setdefault("keepalive_s", None)
    name = uuid.uuid4().hex[:12]
    server.tasks[name] = TaskEvents(StreamHub())
    server.task_options[name] = sse_options
    return f"/tasks/{name}", server.tasks[name]


def strip_time(payload: dict) -> dict:
    assert payload["timestamp"].endswith("Z")
    return {k: v for k, v in payload.items() if k != "timestamp"}


async def test_progress_state_and_artifacts_reach_every_open_stream(server, client) -> None:
    prefix, events = new_manager(server)
    await server.run(lambda: events.open("t1", {"callee": "coding-assistant"}))
    assert events.hub.get("a2a_t1") is not None  # the delegated-task key of docs/ARCHITECTURE.md

    async with client.stream("GET", f"{prefix}/t1") as r1, client.stream("GET", f"{prefix}/t1") as r2:
        readers = [RawReader(r1), RawReader(r2)]
        await server.wait_for(lambda: events.hub.get("a2a_t1").subscribers == 2)

        async def run_task() -> None:
            await events.state("t1", "submitted", "working")
            await events.progress("t1", "reading", 10)
            await events.emit("t1", "text-delta", {"id": "text-0", "delta": "Hel"})
            await events.progress("t1", "writing")
            await events.artifact("t1", {"type": "report", "content": "done", "files": ["out.txt"]})
            await events.state("t1", "working", "completed")
            await events.done("t1", result={"ok": True})

        await server.run(run_task)
        bodies = [await reader.to_end() for reader in readers]
    assert bodies[0] == bodies[1]
    got = parse_sse(bodies[0]).events
    assert [e.type for e in got] == ["state", "progress", "message", "progress", "artifact", "state", "message"]
    assert [e.id for e in got] == [str(i) for i in range(1, 8)]
    payloads = [strip_time(e.json) if e.type != "message" or "timestamp" in e.json else e.json for e in got]
    assert payloads == [
        {"taskId": "t1", "from": "submitted", "to": "working"},
        {"taskId": "t1", "message": "reading", "progress": 10},
        {"type": "text-delta", "id": "text-0", "delta": "Hel"},
        {"taskId": "t1", "message": "writing", "progress": None},
        {"taskId": "t1", "artifact": {"type": "report", "content": "done", "files": ["out.txt"]}},
        {"taskId": "t1", "from": "working", "to": "completed"},
        {"type": "done", "taskId": "t1", "result": {"ok": True}},
    ]
    assert bodies[0].startswith(b'retry: 2000\nid: 1\nevent: state\ndata: {"taskId":"t1","from":"submitted"')

    snapshot = events.get("t1")
    assert (snapshot.state, snapshot.message, snapshot.progress, snapshot.open) == ("completed", "writing", None, False)
    assert snapshot.last_event_id == 7 and snapshot.meta["callee"] == "coding-assistant"

    # A client that comes late gets the whole story; one that saw it all is told there is nothing more.
    _, late = await read_raw(client, f"{prefix}/t1")
    assert late == bodies[0]
    done = await client.get(f"{prefix}/t1", headers={"Last-Event-ID": "7"})
    assert done.status_code == 204


async def test_a_failed_task_ends_its_streams_with_an_error_event(server, client) -> None:
    prefix, events = new_manager(server)
    await server.run(lambda: events.open("t2"))
    async with client.stream("GET", f"{prefix}/t2") as response:
        reader = RawReader(response)
        await server.wait_for(lambda: events.hub.get("a2a_t2").subscribers == 1)
        await server.run(lambda: events.progress("t2", "half way", 50))
        await server.run(lambda: events.fail("t2", "the callee crashed"))
        body = await reader.to_end()
    got = parse_sse(body).events
    assert [e.type for e in got] == ["progress", "message"]
    assert strip_time(got[1].json) == {"type": "error", "taskId": "t2", "errorText": "the callee crashed"}
    snapshot = events.get("t2")
    assert not snapshot.open and snapshot.error == "the callee crashed" and snapshot.progress == 50


async def test_resume_a_task_stream_with_last_event_id(server, client) -> None:
    prefix, events = new_manager(server)
    await server.run(lambda: events.open("t3"))
    for i in range(5):
        await server.run(lambda i=i: events.progress("t3", f"step {i}", i * 20))
    async with client.stream("GET", f"{prefix}/t3?lastEventId=3") as response:
        reader = RawReader(response)
        assert [e.id for e in await reader.events(2)] == ["4", "5"]
        await server.run(lambda: events.done("t3"))
        body = await reader.to_end()
    assert [e.json.get("message") for e in parse_sse(body).events] == ["step 3", "step 4", None]


async def test_bad_input_raises_at_the_call_and_appends_nothing(server, client) -> None:
    prefix, events = new_manager(server)
    await server.run(lambda: events.open("t4"))
    with pytest.raises(SSEDataError, match="artifact"):
        await server.run(lambda: events.artifact("t4", {"handle": object()}))
    with pytest.raises(SSEDataError):
        await server.run(lambda: events.emit("t4", "text-delta", {"delta": {1, 2}}))
    with pytest.raises(SSEDataError):
        await server.run(lambda: events.progress("t4", object(), 5))
    with pytest.raises(SSEDataError):
        await server.run(lambda: events.done("t4", result=float("nan")))
    with pytest.raises(ValueError, match="progress"):
        await server.run(lambda: events.progress("t4", "x", 101))
    assert events.get("t4").last_event_id == 0 and events.get("t4").open

    with pytest.raises(StreamBusyError):
        await server.run(lambda: events.open("t4"))
    with pytest.raises(UnknownStreamError):
        await server.run(lambda: events.progress("never-opened", "x"))
    await server.run(lambda: events.done("t4"))
    with pytest.raises(StreamClosedError):
        await server.run(lambda: events.state("t4", "completed", "working"))

    # Re-opening a finished task keeps counting ids, so an old Last-Event-ID never repeats anything.
    await server.run(lambda: events.open("t4"))
    assert await server.run(lambda: events.progress("t4", "again")) == 2

    missing = await client.get(f"{prefix}/nope")
    assert missing.status_code == 404 and missing.json() == {"detail": "There is no such stream."}
    assert events.get("nope") is None


async def test_in_process_subscribers_see_the_same_events() -> None:
    events = TaskEvents(StreamHub(), key_prefix="task_")
    await events.open("t5")
    sub = events.subscribe("t5")
    await events.progress("t5", "m", 1)
    await events.state("t5", None, "working")
    await events.done("t5")
    got = [(e.type, e.data.get("to", e.data.get("message"))) async for e in sub]
    assert got == [("progress", "m"), ("state", "working"), ("done", None)]
    assert events.key("t5") == "task_t5" and events.hub.get("task_t5") is not None
