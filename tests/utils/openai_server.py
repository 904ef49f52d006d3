"""A real OpenAI-compatible chat-completions server for tests, scripted per test.

It runs uvicorn + starlette on 127.0.0.1 (a free port) in a background thread with
its own event loop, so the code under test talks to it over real HTTP, through
LiteLLM and the openai SDK, exactly as it would talk to a provider.

Each request to `POST /v1/chat/completions` takes the next response from the
script queue (`server.script(...)`); with the queue empty it answers 500 with a
"script exhausted" error, so a missing script fails loudly instead of hanging.
Every request is recorded (`server.requests`: body and lower-cased headers), to any path: a
request to another path (another provider's API, e.g. `/v1/messages`) is answered 404.

Responses (build them with the helpers below):

- `text("Hel", "lo")`: text chunks, then `finish_reason="stop"`.
- `tool_call("echo", '{"text": "hi"}', text_chunks=["Let me"], fragments=3)`: text, then one tool
  call whose arguments are split over several fragments; only the first fragment carries
  `id`, `type` and `function.name`, later ones only `function.arguments` (as OpenAI does).
- `tool_calls(call(...), call(...))`: parallel tool calls (index 0, 1, ...).
- `error(401, "Incorrect API key provided", type="invalid_request_error", code="invalid_api_key")`.
- `stall(["par", "tial"], seconds=5)`: some chunks, then silence (for read timeouts).
- `broken(["par", "tial"])`: some chunks, then the connection is dropped without `[DONE]`
  (an incomplete chunked body, which the client sees as a protocol error).

`stream_options.include_usage` is honoured: the stream then ends with a chunk whose
`choices` is `[]` and whose `usage` is the response's usage. Non-streaming requests
get a `chat.completion` object built from the same script entry.

Usage::

    with OpenAIServer() as server:
        server.script(text("Hello", " world"))
        ... LLMGateway(api_base=server.api_base, api_key="sk-test") ...
        assert server.requests[0].headers["authorization"] == "Bearer sk-test"

or the `openai_server` fixture (import it into a test module).
"""

from __future__ import annotations

import asyncio
import json
import socket
import threading
import time
import zlib
from collections import deque
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import pytest
import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route
from starlette.types import Receive, Scope, Send

# -- the script -------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class ScriptedCall:
    """One tool call the scripted model makes; `arguments` is sent split into `fragments` pieces."""

    id: str
    name: str
    arguments: str
    fragments: int = 3


@dataclass(frozen=True, slots=True)
class ScriptedResponse:
    """One scripted answer to one request (see the module docstring for the kinds)."""

    text_chunks: tuple[str, ...] = ()
    calls: tuple[ScriptedCall, ...] = ()
    #: None: the server sends no usage, even when the client asks for it (some OpenAI-compatible servers).
    usage: tuple[int, int] | None = (11, 7)
    finish_reason: str | None = None
    #: 0 for a normal response; an HTTP error status otherwise.
    status: int = 0
    error_body: dict[str, Any] | None = None
    #: After the text chunks: stall for this many seconds, then end the response normally.
    stall_s: float | None = None
    #: After the text chunks: drop the connection.
    broken: bool = False
    #: Pause between chunks.
    chunk_delay_s: float = 0.0

    @property
    def effective_finish_reason(self) -> str:
        """`tool_calls` when the response calls tools, else `stop` (unless given)."""
        return self.finish_reason or ("tool_calls" if self.calls else "stop")


def text(*chunks: str, usage: tuple[int, int] | None = (11, 7), chunk_delay_s: float = 0.0) -> ScriptedResponse:
    """Text chunks, then `finish_reason="stop"` (`usage=None`: no usage chunk, even when asked)."""
    return ScriptedResponse(text_chunks=tuple(chunks), usage=usage, chunk_delay_s=chunk_delay_s)


def call(name: str, arguments: str | dict[str, Any], *, id: str | None = None, fragments: int = 3) -> ScriptedCall:
    """A tool call; dict arguments are JSON-encoded, a string is sent as it is (malformed JSON included)."""
    raw = arguments if isinstance(arguments, str) else json.dumps(arguments)
    return ScriptedCall(
        id=id or f"call_{name}_{zlib.crc32(raw.encode()):08x}", name=name, arguments=raw, fragments=fragments
    )


def tool_call(
    name: str,
    arguments: str | dict[str, Any],
    *,
    id: str | None = None,
    text_chunks: list[str] | tuple[str, ...] = (),
    fragments: int = 3,
    usage: tuple[int, int] | None = (11, 7),
) -> ScriptedResponse:
    """Optional text, then one tool call whose arguments arrive in `fragments` pieces."""
    return ScriptedResponse(
        text_chunks=tuple(text_chunks), calls=(call(name, arguments, id=id, fragments=fragments),), usage=usage
    )


def tool_calls(
    *calls: ScriptedCall, text_chunks: list[str] | tuple[str, ...] = (), usage: tuple[int, int] | None = (11, 7)
) -> ScriptedResponse:
    """Parallel tool calls in one response (index 0, 1, ...)."""
    return ScriptedResponse(text_chunks=tuple(text_chunks), calls=tuple(calls), usage=usage)


def error(
    status: int,
    message: str = "The server had an error while processing your request.",
    *,
    type: str = "server_error",
    code: str | None = None,
) -> ScriptedResponse:
    """An HTTP error with an OpenAI-style body `{"error": {message, type, param, code}}`."""
    body = {"error": {"message": message, "type": type, "param": None, "code": code}}
    return ScriptedResponse(status=status, error_body=body)


def auth_error() -> ScriptedResponse:
    """OpenAI's 401 for a wrong key."""
    return error(
        401,
        "Incorrect API key provided: sk-test. You can find your API key at "
        "https://platform.openai.com/account/api-keys.",
        type="invalid_request_error",
        code="invalid_api_key",
    )


def stall(chunks: list[str] | tuple[str, ...] = (), *, seconds: float = 10.0) -> ScriptedResponse:
    """Send `chunks`, then nothing for `seconds` (the server stops waiting early when it shuts down)."""
    return ScriptedResponse(text_chunks=tuple(chunks), stall_s=seconds)


def broken(chunks: list[str] | tuple[str, ...] = ()) -> ScriptedResponse:
    """Send `chunks`, then close the connection in the middle of the body (no finish chunk, no `[DONE]`)."""
    return ScriptedResponse(text_chunks=tuple(chunks), broken=True)


# -- recording --------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class RecordedRequest:
    """What a client sent: path, headers (lower-case names), the decoded JSON body, and from where (host, port)."""

    path: str
    headers: dict[str, str]
    body: dict[str, Any]
    client: tuple[str, int] | None = None  # one port per connection: two requests on one connection share it

    @property
    def messages(self) -> list[dict[str, Any]]:
        """The request's chat messages."""
        return list(self.body.get("messages") or [])

    @property
    def tool_names(self) -> list[str]:
        """Function names of the tools offered."""
        return [t["function"]["name"] for t in self.body.get("tools") or []]


# -- the wire format ----------------------------------------------------------------------

_BREAK = object()


@dataclass(slots=True)
class _Stall:
    seconds: float


def _split(raw: str, pieces: int) -> list[str]:
    pieces = max(1, min(pieces, len(raw) or 1))
    size = -(-len(raw) // pieces) if raw else 0
    parts = [raw[i : i + size] for i in range(0, len(raw), size)] if raw else [""]
    return parts


@dataclass(slots=True)
class _ChunkFactory:
    completion_id: str
    model: str
    created: int = field(default_factory=lambda: int(time.time()))

    def chunk(self, delta: dict[str, Any], finish_reason: str | None = None) -> dict[str, Any]:
        return {
            "id": self.completion_id,
            "object": "chat.completion.chunk",
            "created": self.created,
            "model": self.model,
            "system_fingerprint": None,
            "choices": [{"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish_reason}],
        }

    def usage_chunk(self, usage: tuple[int, int]) -> dict[str, Any]:
        return {
            "id": self.completion_id,
            "object": "chat.completion.chunk",
            "created": self.created,
            "model": self.model,
            "system_fingerprint": None,
            "choices": [],
            "usage": _usage(usage),
        }


def _usage(usage: tuple[int, int]) -> dict[str, int]:
    return {"prompt_tokens": usage[0], "completion_tokens": usage[1], "total_tokens": usage[0] + usage[1]}


def stream_items(response: ScriptedResponse, *, model: str, include_usage: bool, completion_id: str) -> list[Any]:
    """The SSE payloads of a streamed response: chunk dicts, `_Stall`, `_BREAK`, then `"[DONE]"`."""
    f = _ChunkFactory(completion_id, model)
    items: list[Any] = [f.chunk({"role": "assistant", "content": ""})]
    items += [f.chunk({"content": piece}) for piece in response.text_chunks]
    if response.broken:
        return [*items, _BREAK]
    if response.stall_s is not None:
        items.append(_Stall(response.stall_s))
    for index, c in enumerate(response.calls):
        for n, piece in enumerate(_split(c.arguments, c.fragments)):
            if n == 0:
                fragment = {
                    "index": index,
                    "id": c.id,
                    "type": "function",
                    "function": {"name": c.name, "arguments": piece},
                }
            else:
                fragment = {"index": index, "function": {"arguments": piece}}
            items.append(f.chunk({"tool_calls": [fragment]}))
    items.append(f.chunk({}, response.effective_finish_reason))
    if include_usage and response.usage is not None:
        items.append(f.usage_chunk(response.usage))
    items.append("[DONE]")
    return items


def completion_body(response: ScriptedResponse, *, model: str, completion_id: str) -> dict[str, Any]:
    """The `chat.completion` object of a non-streamed response."""
    content = "".join(response.text_chunks)
    message: dict[str, Any] = {"role": "assistant", "content": content or None, "refusal": None}
    if response.calls:
        message["tool_calls"] = [
            {"id": c.id, "type": "function", "function": {"name": c.name, "arguments": c.arguments}}
            for c in response.calls
        ]
    body = {
        "id": completion_id,
        "object": "chat.completion",
        "created": int(time.time()),
        "model": model,
        "system_fingerprint": None,
        "choices": [
            {"index": 0, "message": message, "logprobs": None, "finish_reason": response.effective_finish_reason}
        ],
    }
    if response.usage is not None:
        body["usage"] = _usage(response.usage)
    return body


class _SSEStream:
    """A raw ASGI response, so that it can stall or drop the connection half-way."""

    def __init__(self, items: list[Any], server: OpenAIServer, delay_s: float) -> None:
        self.items = items
        self.server = server
        self.delay_s = delay_s

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        await send(
            {
                "type": "http.response.start",
                "status": 200,
                "headers": [
                    (b"content-type", b"text/event-stream; charset=utf-8"),
                    (b"cache-control", b"no-cache"),
                ],
            }
        )
        try:
            for item in self.items:
                if item is _BREAK:
                    # Returning without `more_body=False` makes uvicorn close the socket mid-body.
                    self.server.broken_streams += 1
                    return
                if isinstance(item, _Stall):
                    await self.server._sleep(item.seconds)
                    continue
                if self.delay_s:
                    await self.server._sleep(self.delay_s)
                payload = item if isinstance(item, str) else json.dumps(item)
                await send({"type": "http.response.body", "body": f"data: {payload}\n\n".encode(), "more_body": True})
            await send({"type": "http.response.body", "body": b"", "more_body": False})
            self.server.completed_streams += 1
        except OSError:  # the client went away
            self.server.disconnects += 1


# -- the server ---------------------------------------------------------------------------


class OpenAIServer:
    """The scripted server; a context manager (or call `start()` / `stop()`)."""

    def __init__(self, host: str = "127.0.0.1") -> None:
        self.host = host
        self.port = 0
        self.requests: list[RecordedRequest] = []
        self.completed_streams = 0
        self.broken_streams = 0
        self.disconnects = 0
        self._queue: deque[ScriptedResponse] = deque()
        self._lock = threading.Lock()
        self._stopping = threading.Event()
        self._thread: threading.Thread | None = None
        self._server: uvicorn.Server | None = None
        self._counter = 0
        self.app = Starlette(
            routes=[
                Route("/v1/chat/completions", self._chat_completions, methods=["POST"]),
                Route("/{path:path}", self._elsewhere, methods=["GET", "POST"]),
            ]
        )

    # -- scripting ------------------------------------------------------------------------

    def script(self, *responses: ScriptedResponse) -> OpenAIServer:
        """Queue responses; each request takes the next one."""
        with self._lock:
            self._queue.extend(responses)
        return self

    @property
    def pending(self) -> int:
        """Scripted responses not used yet."""
        with self._lock:
            return len(self._queue)

    @property
    def url(self) -> str:
        """`http://127.0.0.1:<port>`."""
        return f"http://{self.host}:{self.port}"

    @property
    def api_base(self) -> str:
        """The base URL clients use (`.../v1`)."""
        return f"{self.url}/v1"

    # -- lifecycle ------------------------------------------------------------------------

    def start(self, timeout: float = 10.0) -> OpenAIServer:
        """Bind a free port and serve in a daemon thread; returns once it accepts connections."""
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((self.host, 0))
        self.port = sock.getsockname()[1]
        config = uvicorn.Config(
            self.app, lifespan="off", log_level="warning", access_log=False, timeout_graceful_shutdown=1, ws="none"
        )
        self._server = uvicorn.Server(config)
        self._thread = threading.Thread(
            target=lambda: asyncio.run(self._server.serve(sockets=[sock])),
            name=f"openai-server-{self.port}",
            daemon=True,
        )
        self._thread.start()
        deadline = time.monotonic() + timeout
        while not self._server.started:
            if not self._thread.is_alive() or time.monotonic() > deadline:
                raise RuntimeError("the test OpenAI server did not start")
            time.sleep(0.005)
        return self

    def stop(self, timeout: float = 5.0) -> None:
        """End stalled streams, stop uvicorn and join its thread."""
        self._stopping.set()
        if self._server is not None:
            self._server.should_exit = True
        if self._thread is not None:
            self._thread.join(timeout)
            if self._thread.is_alive() and self._server is not None:
                self._server.force_exit = True
                self._thread.join(timeout)

    def __enter__(self) -> OpenAIServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    async def _sleep(self, seconds: float) -> None:
        deadline = time.monotonic() + seconds
        while not self._stopping.is_set() and time.monotonic() < deadline:
            await asyncio.sleep(min(0.02, max(0.0, deadline - time.monotonic())))

    # -- the endpoint ---------------------------------------------------------------------

    async def _elsewhere(self, request: Request) -> Any:
        """Any other path (another provider's API, a doubled `/v1`): recorded, and answered 404."""
        raw = await request.body()
        try:
            body = json.loads(raw) if raw else {}
        except json.JSONDecodeError:
            body = {"_raw": raw.decode(errors="replace")}
        with self._lock:
            self.requests.append(
                RecordedRequest(
                    request.url.path,
                    {k.lower(): v for k, v in request.headers.items()},
                    body if isinstance(body, dict) else {"_raw": body},
                )
            )
        return JSONResponse(
            {"error": {"message": "not an endpoint of the test server", "type": "not_found"}}, status_code=404
        )

    async def _chat_completions(self, request: Request) -> Any:
        raw = await request.body()
        try:
            body = json.loads(raw)
        except json.JSONDecodeError:
            body = {"_raw": raw.decode(errors="replace")}
        headers = {k.lower(): v for k, v in request.headers.items()}
        with self._lock:
            client = (request.client.host, request.client.port) if request.client else None
            self.requests.append(RecordedRequest(request.url.path, headers, body, client))
            response = self._queue.popleft() if self._queue else None
            self._counter += 1
            completion_id = f"chatcmpl-test{self._counter:04d}"
        if response is None:
            return JSONResponse(
                {
                    "error": {
                        "message": "the test server's script is exhausted",
                        "type": "server_error",
                        "param": None,
                        "code": "script_exhausted",
                    }
                },
                status_code=500,
            )
        if response.status:
            return JSONResponse(response.error_body, status_code=response.status)
        model = str(body.get("model") or "")
        if not body.get("stream"):
            if response.stall_s is not None:
                await self._sleep(response.stall_s)
            return JSONResponse(completion_body(response, model=model, completion_id=completion_id))
        include_usage = bool((body.get("stream_options") or {}).get("include_usage"))
        items = stream_items(response, model=model, include_usage=include_usage, completion_id=completion_id)
        return _SSEStream(items, self, response.chunk_delay_s)


@pytest.fixture
def openai_server() -> Iterator[OpenAIServer]:
    """A started server for one test (a new port each time, so no client pool outlives its loop)."""
    with OpenAIServer() as server:
        yield server
