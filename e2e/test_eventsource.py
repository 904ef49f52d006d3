"""A real Chromium `EventSource` on the SSE core: `onmessage` and `addEventListener('progress', ...)`.

As seed 002's client example does.

The server is a small app on 127.0.0.1 (`tests/test_sse_harness.py`) serving a
task stream (`TaskEvents` + `hub_sse_response`) and an `SSEStream`, plus the page
that opens the EventSource (same origin). What the browser's own reconnect
logic does is part of the test: `retry:` is honoured, a connection cut off for
falling behind resumes with `Last-Event-ID` without a gap or a repeat, and the
204 after the end makes EventSource stop for good.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator

import pytest
from playwright.sync_api import Browser, Page

from core.streaming.hub import StreamHub
from core.streaming.sse_stream import SSEStream
from core.streaming.task_manager import TaskEvents
from tests.test_sse_harness import SSEServer, sse_server

# The seed's client example, recording what arrives instead of logging it.
PAGE = """<!doctype html>
<meta charset="utf-8">
<title>EventSource</title>
<script>
window.log = {messages: [], progress: [], states: [], artifacts: [], notes: [], overflows: 0, resets: 0,
              opens: 0, errors: 0};
const es = new EventSource(new URLSearchParams(location.search).get('src'));
window.es = es;
es.onopen = () => { log.opens++; };
es.onmessage = (event) => {
  const data = JSON.parse(event.data);
  log.messages.push({id: event.lastEventId, type: data.type, data});
};
es.addEventListener('progress', (event) => {
  const data = JSON.parse(event.data);
  log.progress.push({id: event.lastEventId, taskId: data.taskId, message: data.message, progress: data.progress});
});
es.addEventListener('state', (event) => {
  const data = JSON.parse(event.data);
  log.states.push(`${data.taskId}: ${data.from} -> ${data.to}`);
});
es.addEventListener('artifact', (event) => { log.artifacts.push(JSON.parse(event.data).artifact); });
es.addEventListener('note', (event) => { log.notes.push(event.data); });
es.addEventListener('overflow', () => { log.overflows++; });
es.addEventListener('reset', () => { log.resets++; });
es.onerror = () => { log.errors++; };
</script>
"""


@pytest.fixture(scope="module")
def sse() -> Iterator[SSEServer]:
    with sse_server() as server:
        server.page_html = PAGE
        yield server


@pytest.fixture
def page(browser: Browser, sse: SSEServer) -> Iterator[Page]:
    context = browser.new_context(base_url=sse.url)
    context.set_default_timeout(10_000)
    new_page = context.new_page()
    errors: list[str] = []
    new_page.on("pageerror", lambda exc: errors.append(str(exc)))
    try:
        yield new_page
        assert errors == []
    finally:
        context.close()


def log(page: Page) -> dict:
    return page.evaluate("() => window.log")


def test_a_task_stream_in_eventsource_named_and_unnamed_events_resume_and_end(page: Page, sse: SSEServer) -> None:
    name = uuid.uuid4().hex[:8]
    # A per-client queue of 5, so the burst below cuts the browser off once (it must resume by itself).
    events = TaskEvents(StreamHub(subscriber_queue=5))
    sse.tasks[name] = events
    sse.task_options[name] = {"retry_ms": 100, "keepalive_s": None}

    async def before_the_client() -> None:
        await events.open("task-123")
        await events.state("task-123", "submitted", "working")
        await events.progress("task-123", "任务开始", 0)

    sse.run_sync(before_the_client)
    page.goto(f"/page?src=/tasks/{name}/task-123")
    page.wait_for_function("() => log.progress.length === 1 && log.states.length === 1")

    async def burst() -> None:  # 12 at once: more than the client's queue holds
        for step in range(1, 13):
            await events.progress("task-123", f"处理中... {step}", min(100, step * 8))

    sse.run_sync(burst)
    page.wait_for_function("() => log.progress.length === 13")

    async def finish() -> None:
        await events.emit("task-123", "text-delta", {"id": "text-0", "delta": "all done"})
        await events.artifact("task-123", {"type": "report", "content": "任务执行结果...", "files": ["output.txt"]})
        await events.state("task-123", "working", "completed")
        await events.done("task-123")

    sse.run_sync(finish)
    # The stream ends; EventSource reconnects after `retry` (100 ms), gets 204 and stops (readyState CLOSED).
    page.wait_for_function("() => window.es.readyState === 2 && log.messages.length === 2")
    got = log(page)
    assert [p["message"] for p in got["progress"]] == ["任务开始"] + [f"处理中... {i}" for i in range(1, 13)]
    assert [p["progress"] for p in got["progress"]] == [0] + [min(100, i * 8) for i in range(1, 13)]
    ids = [int(p["id"]) for p in got["progress"]] + [int(m["id"]) for m in got["messages"]]
    assert ids == sorted(set(ids)) and ids[0] == 2  # in order, none twice
    assert {p["taskId"] for p in got["progress"]} == {"task-123"}
    assert got["states"] == ["task-123: submitted -> working", "task-123: working -> completed"]
    assert got["artifacts"] == [{"type": "report", "content": "任务执行结果...", "files": ["output.txt"]}]
    assert [(m["type"], m["data"].get("delta")) for m in got["messages"]] == [
        ("text-delta", "all done"),
        ("done", None),
    ]
    assert got["overflows"] == 1 and got["resets"] == 0
    assert got["opens"] == 2  # the first connection, and the resume after the overflow


def test_an_sse_stream_buffered_before_the_browser_attaches(page: Page, sse: SSEServer) -> None:
    name = uuid.uuid4().hex[:8]
    stream = SSEStream(retry_ms=100, keepalive_s=None)
    sse.streams[name] = stream
    sse.call_sync(stream.send_progress, "task-456", "初始化中...", 0)
    sse.call_sync(stream.send_progress, "task-456", "加载数据...", 10)
    sse.call_sync(stream.send_event, "note", "two\nlines")
    assert len(sse.call_sync(stream.get_buffer)) == 3

    page.goto(f"/page?src=/sse/{name}")
    page.wait_for_function("() => log.progress.length === 2 && log.notes.length === 1")
    assert sse.call_sync(stream.get_buffer) == []
    sse.call_sync(stream.send_progress, "task-456", "处理完成", 100)
    sse.call_sync(stream.send_event, "message", {"type": "custom", "n": 1})  # the "message" type reaches onmessage
    sse.call_sync(stream.close)
    page.wait_for_function("() => window.es.readyState === 2")
    got = log(page)
    assert [(p["message"], p["progress"]) for p in got["progress"]] == [
        ("初始化中...", 0),
        ("加载数据...", 10),
        ("处理完成", 100),
    ]
    assert got["notes"] == ["two\nlines"]
    assert [(m["id"], m["data"]) for m in got["messages"]] == [("5", {"type": "custom", "n": 1})]
    assert got["opens"] == 1 and stream.close_reason == "closed"
