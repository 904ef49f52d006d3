"""A real SSE server on 127.0.0.1 for the SSE tests (no tests of its own; shared by tests/ and e2e/).

`SSEServer` runs a tiny FastAPI app under uvicorn in a background thread (its
own event loop). The app serves, by name:

    GET /sse/{name}            an `SSEStream` of `server.streams` (`stream.attach(request)`)
    GET /new/{name}            `server.producers[name](request)`: a route that makes its own
                               `SSEStream(request=request)` (seed 002's `new SSEStream({res})`)
    GET /hub/{name}/{key}      `hub_sse_response` of the hub `server.hubs[name]`
    GET /tasks/{name}/{task}   `TaskEvents.response` of `server.tasks[name]`
    GET /bare                  `?n=` events from a bare sse-starlette `EventSourceResponse`
    GET /page                  the HTML given to `server.page_html` (for the browser test)

Streams, hubs and task managers live on the server's loop: the test creates and
drives them with `await server.call(fn)` (a plain function, run on that loop)
or `await server.run(coro_fn)`.

`parse_sse` parses raw bytes exactly as the SSE spec (and a browser's
EventSource) does, so the tests assert on what a client really receives.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Awaitable, Callable, Iterator
from contextlib import asynccontextmanager, contextmanager
from dataclasses import dataclass, field
from typing import Any, TypeVar

import httpx
from fastapi import FastAPI, Request
from fastapi.middleware.gzip import GZipMiddleware
from fastapi.responses import HTMLResponse, Response
from sse_starlette import EventSourceResponse, ServerSentEvent

from core.streaming.hub import StreamHub
from core.streaming.sse import hub_sse_response, last_event_id, stream_not_found
from core.streaming.sse_stream import SSEStream
from core.streaming.task_manager import TaskEvents
from tests.utils.live_server import live_server

T = TypeVar("T")


class SSEServer:
    """The app, its URL and a bridge to its event loop."""

    def __init__(self) -> None:
        self.streams: dict[str, SSEStream] = {}
        self.producers: dict[str, Callable[[Request], Response]] = {}
        self.hubs: dict[str, StreamHub] = {}
        self.hub_options: dict[str, dict[str, Any]] = {}
        self.tasks: dict[str, TaskEvents] = {}
        self.task_options: dict[str, dict[str, Any]] = {}
        self.page_html = "<!doctype html><title>empty</title>"
        self.url = ""
        self.loop: asyncio.AbstractEventLoop | None = None
        self.app = self._build_app()

    def _build_app(self) -> FastAPI:
        @asynccontextmanager
        async def lifespan(_app: FastAPI):
            self.loop = asyncio.get_running_loop()
            yield

        app = FastAPI(lifespan=lifespan)
        # As NiceGUI's `ui.run` does: SSE must get through it uncompressed and unbuffered.
        app.add_middleware(GZipMiddleware, minimum_size=1)

        @app.api_route("/sse/{name}", methods=["GET", "HEAD"], response_model=None)
        async def sse(name: str, request: Request):
            stream = self.streams.get(name)
            return stream_not_found() if stream is None else stream.attach(request)

        @app.get("/new/{name}", response_model=None)
        async def new(name: str, request: Request):
            return self.producers[name](request)

        @app.api_route("/hub/{name}/{key}", methods=["GET", "HEAD"], response_model=None)
        async def hub(name: str, key: str, request: Request):
            return hub_sse_response(self.hubs[name], key, last_event_id(request), **self.hub_options.get(name, {}))

        @app.get("/tasks/{name}/{task_id}", response_model=None)
        async def task(name: str, task_id: str, request: Request):
            return self.tasks[name].response(task_id, request, **self.task_options.get(name, {}))

        @app.get("/bare", response_model=None)
        async def bare(n: int = 10):
            async def events():
                for i in range(1, n + 1):
                    yield ServerSentEvent(data=json.dumps({"i": i}), event="tick", id=str(i), sep="\n")

            return EventSourceResponse(events(), sep="\n")

        @app.get("/page")
        async def page() -> HTMLResponse:
            return HTMLResponse(self.page_html)

        return app

    async def call(self, fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        """Run `fn(*args, **kwargs)` on the server's loop; its result."""

        async def wrapper() -> T:
            return fn(*args, **kwargs)

        return await self.run(wrapper)

    async def run(self, coro_fn: Callable[[], Awaitable[T]]) -> T:
        """Await `coro_fn()` on the server's loop; its result."""
        assert self.loop is not None
        return await asyncio.wrap_future(asyncio.run_coroutine_threadsafe(coro_fn(), self.loop))

    def run_sync(self, coro_fn: Callable[[], Awaitable[T]], timeout: float = 10.0) -> T:
        """`run` for synchronous callers (the browser tests)."""
        assert self.loop is not None
        return asyncio.run_coroutine_threadsafe(coro_fn(), self.loop).result(timeout)

    def call_sync(self, fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        """`call` for synchronous callers."""

        async def wrapper() -> T:
            return fn(*args, **kwargs)

        return self.run_sync(wrapper)

    async def wait_for(self, predicate: Callable[[], bool], timeout: float = 3.0) -> None:
        """Poll (on the server's loop) until `predicate()` is true."""
        deadline = time.monotonic() + timeout
        while not await self.call(predicate):
            if time.monotonic() > deadline:
                raise AssertionError(f"timed out after {timeout} s waiting for {predicate}")
            await asyncio.sleep(0.01)


@contextmanager
def sse_server() -> Iterator[SSEServer]:
    """An `SSEServer`, started on a free loopback port."""
    server = SSEServer()
    with live_server(server.app) as url:
        server.url = url
        yield server


# -- the client side -------------------------------------------------------------------------


@dataclass
class Event:
    """One dispatched SSE event as EventSource sees it (`type` is "message" for an unnamed one)."""

    type: str
    data: str
    id: str  # the last event id after this event (EventSource's `lastEventId`)
    retry: int | None = None

    @property
    def json(self) -> Any:
        """The data, decoded as JSON."""
        return json.loads(self.data)


@dataclass
class Parsed:
    """The outcome of parsing a byte stream."""

    events: list[Event] = field(default_factory=list)
    comments: list[str] = field(default_factory=list)
    retry: int | None = None
    last_id: str = ""
    #: Bytes after the last complete event (an event cut in the middle is not dispatched).
    rest: bytes = b""


def parse_sse(raw: bytes, *, last_id: str = "") -> Parsed:
    """Parse `raw` per the HTML SSE spec ("event stream interpretation")."""
    out = Parsed(last_id=last_id)
    # Only what ends in a blank line is dispatched; keep the tail (it may end inside a UTF-8 sequence).
    end = max(raw.rfind(b"\n\n"), raw.rfind(b"\r\r"), raw.rfind(b"\r\n\r\n"))
    if end < 0:
        out.rest = raw
        return out
    cut = end + (4 if raw.startswith(b"\r\n\r\n", end) else 2)
    out.rest = raw[cut:]
    text = raw[:cut].decode("utf-8")
    cut = len(text)
    data: list[str] = []
    event_type = ""
    retry: int | None = None
    pending_id = out.last_id
    lines = text[:cut].replace("\r\n", "\n").replace("\r", "\n").split("\n")
    for line in lines[:-1]:
        if line == "":
            out.last_id = pending_id
            if data:
                out.events.append(
                    Event(type=event_type or "message", data="\n".join(data), id=out.last_id, retry=retry)
                )
            data, event_type, retry = [], "", None
            continue
        if line.startswith(":"):
            out.comments.append(line[1:].lstrip(" ") if line.startswith(": ") else line[1:])
            continue
        name, colon, value = line.partition(":")
        if colon and value.startswith(" "):
            value = value[1:]
        if name == "data":
            data.append(value)
        elif name == "event":
            event_type = value
        elif name == "id" and "\0" not in value:
            pending_id = value
        elif name == "retry" and value.isdigit():
            retry = int(value)
            out.retry = retry
    return out


async def read_raw(
    client: httpx.AsyncClient,
    url: str,
    *,
    headers: dict[str, str] | None = None,
    until: Callable[[bytes], bool] | None = None,
    limit_bytes: int | None = None,
) -> tuple[httpx.Response, bytes]:
    """GET `url` and read the body as it arrives: to the end, until `until(body)`, or `limit_bytes` bytes.

    Stopping early closes the connection (the server sees a disconnect).
    """
    body = b""
    async with client.stream("GET", url, headers=headers) as response:
        async for chunk in response.aiter_raw():
            body += chunk
            if limit_bytes is not None and len(body) >= limit_bytes:
                body = body[:limit_bytes]
                break
            if until is not None and until(body):
                break
    return response, body


class RawReader:
    """Reads an open streaming response bit by bit: `await reader.until(...)` returns the body so far."""

    def __init__(self, response: httpx.Response) -> None:
        self.response = response
        self.body = b""
        self.ended = False
        self._chunks = response.aiter_raw()

    async def until(self, predicate: Callable[[bytes], bool], timeout: float = 5.0) -> bytes:
        """Read until `predicate(body)` holds or the response ends; the body so far."""

        async def read() -> None:
            while not predicate(self.body):
                try:
                    self.body += await anext(self._chunks)
                except StopAsyncIteration:
                    self.ended = True
                    return

        await asyncio.wait_for(read(), timeout)
        return self.body

    async def events(self, n: int, timeout: float = 5.0) -> list[Event]:
        """Read until `n` events have arrived (or the end); all events so far."""
        return parse_sse(await self.until(count_events(n), timeout)).events

    async def to_end(self, timeout: float = 5.0) -> bytes:
        """Read until the response ends."""
        return await self.until(lambda _body: False, timeout)


def count_events(n: int) -> Callable[[bytes], bool]:
    """`until` for `read_raw`: stop once `n` complete events have arrived."""
    return lambda body: len(parse_sse(body).events) >= n
