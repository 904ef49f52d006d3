"""A real Anthropic-wire (Messages API) server for tests, scripted per test, like `openai_server`.

`POST .../v1/messages` with `stream: true` answers Anthropic's SSE events (`message_start`,
`content_block_start` / `_delta` / `_stop` for text and `tool_use` blocks, `message_delta` with
the stop reason and output tokens, `message_stop`), so LiteLLM's own Anthropic parsing runs over
real HTTP. Each request takes the next scripted `AnthropicReply`; an empty script answers 500.
`AnthropicReply(status=401, ...)` answers an HTTP error with Anthropic's error body, and
`error_after` sends an `error` event after that many text pieces (Anthropic's "overloaded" in a
stream). Requests are recorded (`server.requests`).
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pytest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, StreamingResponse
from starlette.routing import Route

from tests.utils.openai_server import OpenAIServer, RecordedRequest


@dataclass(frozen=True, slots=True)
class AnthropicReply:
    """One scripted answer: text pieces, then optional tool calls `(id, name, arguments JSON)`."""

    text: tuple[str, ...] = ()
    calls: tuple[tuple[str, str, str], ...] = ()
    input_tokens: int = 21
    output_tokens: int = 9
    status: int = 0
    error_type: str = "authentication_error"
    error_message: str = "invalid x-api-key"
    error_after: int | None = None


def _event(kind: str, data: dict[str, Any]) -> bytes:
    return f"event: {kind}\ndata: {json.dumps({'type': kind, **data})}\n\n".encode()


def anthropic_events(reply: AnthropicReply, model: str) -> Iterator[bytes]:
    """The SSE bytes of a streamed reply."""
    message = {
        "id": "msg_test",
        "type": "message",
        "role": "assistant",
        "model": model,
        "content": [],
        "stop_reason": None,
        "stop_sequence": None,
        "usage": {"input_tokens": reply.input_tokens, "output_tokens": 1},
    }
    yield _event("message_start", {"message": message})
    index = 0
    if reply.text:
        yield _event("content_block_start", {"index": 0, "content_block": {"type": "text", "text": ""}})
        for n, piece in enumerate(reply.text):
            if reply.error_after is not None and n == reply.error_after:
                yield _event("error", {"error": {"type": "overloaded_error", "message": "Overloaded"}})
                return
            yield _event("content_block_delta", {"index": 0, "delta": {"type": "text_delta", "text": piece}})
        yield _event("content_block_stop", {"index": 0})
        index = 1
    for call_id, name, arguments in reply.calls:
        block = {"type": "tool_use", "id": call_id, "name": name, "input": {}}
        yield _event("content_block_start", {"index": index, "content_block": block})
        third = max(1, -(-len(arguments) // 3))
        for i in range(0, len(arguments), third):
            delta = {"type": "input_json_delta", "partial_json": arguments[i : i + third]}
            yield _event("content_block_delta", {"index": index, "delta": delta})
        yield _event("content_block_stop", {"index": index})
        index += 1
    stop = "tool_use" if reply.calls else "end_turn"
    yield _event(
        "message_delta",
        {"delta": {"stop_reason": stop, "stop_sequence": None}, "usage": {"output_tokens": reply.output_tokens}},
    )
    yield _event("message_stop", {})


class AnthropicServer(OpenAIServer):
    """The scripted Anthropic-wire server (the OpenAI server's thread and lifecycle, another endpoint)."""

    def __init__(self, host: str = "127.0.0.1") -> None:
        super().__init__(host)
        self._replies: list[AnthropicReply] = []
        self.app = Starlette(routes=[Route("/{path:path}", self._messages, methods=["POST"])])

    def reply(self, *replies: AnthropicReply) -> AnthropicServer:
        """Queue replies; each request takes the next one."""
        with self._lock:
            self._replies.extend(replies)
        return self

    async def _messages(self, request: Request) -> Any:
        body = json.loads(await request.body())
        with self._lock:
            self.requests.append(
                RecordedRequest(request.url.path, {k.lower(): v for k, v in request.headers.items()}, body)
            )
            reply = self._replies.pop(0) if self._replies else None
        if not request.url.path.endswith("/messages"):
            return JSONResponse({"type": "error", "error": {"type": "not_found_error", "message": "no"}}, 404)
        if reply is None:
            return JSONResponse({"type": "error", "error": {"type": "api_error", "message": "script exhausted"}}, 500)
        if reply.status:
            error = {"type": "error", "error": {"type": reply.error_type, "message": reply.error_message}}
            return JSONResponse(error, status_code=reply.status)
        return StreamingResponse(
            anthropic_events(reply, str(body.get("model"))), media_type="text/event-stream; charset=utf-8"
        )


@pytest.fixture
def anthropic_server() -> Iterator[AnthropicServer]:
    """A started server for one test."""
    with AnthropicServer() as server:
        yield server
