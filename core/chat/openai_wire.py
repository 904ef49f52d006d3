"""An OpenAI-compatible stream read straight off the wire, once LiteLLM has made the call (issue 38).

LiteLLM stays the gateway: it routes the model, maps the parameters, picks the key, sends the
request and turns a refused request (401, 404, 429, 500, ...) into its exceptions. What it does
then per chunk of a streamed answer is the costly part of a real token: the openai SDK builds a
pydantic object of every SSE event, and LiteLLM's `CustomStreamWrapper` builds another one from
it, with its logging and checks. At 100 streams that was about two thirds of the server's CPU
(`bench/bench_model_path.py --profile 100`).

For the providers whose chunks LiteLLM passes on as OpenAI sends them (`FAST_PROVIDERS`, only
`openai`: `openai/...` models and any OpenAI-compatible `apiBase`), `raw_response` finds the
HTTP response under LiteLLM's wrapper before anything has read its body, and `WireStream` reads
its SSE events as plain JSON: the text as it comes, and at the end the tool calls (fragments
keyed by `index`, as `StreamAssembly` keys them), the finish reason and the usage chunk. An
`error` event in the stream is raised as `StreamEventError`; LiteLLM's check that a model does
not repeat one chunk over and over is kept. Every other provider (Anthropic, Gemini, Bedrock,
the demo model, ...) goes through LiteLLM's wrapper as before. This module imports neither
litellm nor openai.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Callable
from typing import Any

import httpx

from core.chat.llm_stream import ModelResult, ToolCall, Usage
from core.errors import AppError

__all__ = ["FAST_PROVIDERS", "StreamEventError", "WireStream", "raw_response", "wire_result"]

#: LiteLLM providers whose stream is the openai SDK's over an OpenAI-shaped wire, read here directly.
FAST_PROVIDERS = frozenset({"openai"})


class StreamEventError(AppError):
    """The server sent an `error` event in the middle of the stream (as the openai SDK would raise it)."""

    code = "model_stream_error"

    def __init__(self, message: str, body: Any) -> None:
        super().__init__(message)
        self.message = message
        self.body = body
        self.status_code = None


def raw_response(wrapper: Any) -> httpx.Response | None:
    """The unread HTTP response under LiteLLM's stream wrapper, when its provider's chunks are OpenAI's; else None."""
    if getattr(wrapper, "custom_llm_provider", None) not in FAST_PROVIDERS:
        return None
    stream = getattr(wrapper, "completion_stream", None)
    cls = type(stream)
    if cls.__name__ != "AsyncStream" or not cls.__module__.startswith("openai"):
        return None
    response = getattr(stream, "response", None)
    if not isinstance(response, httpx.Response) or response.is_stream_consumed:
        return None
    return response


class WireStream:
    """One OpenAI-compatible SSE stream: `texts()` yields the text as it comes; then the end's fields."""

    __slots__ = ("response", "repeat_limit", "text", "calls", "finish_reason", "usage")

    def __init__(self, response: httpx.Response, *, repeat_limit: int = 100) -> None:
        self.response = response
        self.repeat_limit = repeat_limit
        self.text: list[str] = []
        self.calls: dict[Any, list[Any]] = {}  # index -> [id, name, argument pieces]
        self.finish_reason: str | None = None
        self.usage: dict[str, Any] | None = None

    async def texts(self) -> AsyncIterator[str]:
        """The text pieces, in order, until `[DONE]` or the end of the body.

        Raises:
            StreamEventError: the server sent an error in the stream.
            RuntimeError: the model repeated one chunk `repeat_limit` times in a row (LiteLLM's check).
            httpx.HTTPError: the connection failed, or nothing came within the read timeout.
        """
        data: list[str] = []
        previous: str | None = None
        repeated = 1
        done = False
        async for line in self.response.aiter_lines():
            if done:
                continue  # the rest of the body, read as the openai SDK reads it: the connection is then reused
            if line.startswith("data:"):
                data.append(line[6:] if line.startswith("data: ") else line[5:])
                continue
            if line or not data:
                continue  # other fields (event:, id:, comments) carry nothing of a chat completion
            payload = "\n".join(data)
            data.clear()
            if payload == "[DONE]":
                done = True
                continue
            text = self._add(json.loads(payload))
            if text is None:
                continue
            if len(text) > 2 and text == previous:
                repeated += 1
                if repeated >= self.repeat_limit:
                    raise RuntimeError(f"The model is repeating the same chunk = {text}.")
            else:
                repeated = 1
            previous = text
            yield text

    def _add(self, chunk: Any) -> str | None:
        if not isinstance(chunk, dict):
            return None
        error = chunk.get("error")
        if error is not None:
            message = error.get("message") if isinstance(error, dict) else None
            raise StreamEventError(str(message or "An error occurred during streaming"), error)
        usage = chunk.get("usage")
        if usage:
            self.usage = usage
        choices = chunk.get("choices")
        if not choices:
            return None
        choice = choices[0]
        finish_reason = choice.get("finish_reason")
        if finish_reason:
            self.finish_reason = finish_reason
        delta = choice.get("delta")
        if not delta:
            return None
        tool_calls = delta.get("tool_calls")
        if tool_calls:
            for fragment in tool_calls:
                self._add_call_fragment(fragment)
        content = delta.get("content")
        if content and isinstance(content, str):
            self.text.append(content)
            return content
        return None

    def _add_call_fragment(self, fragment: dict[str, Any]) -> None:
        function = fragment.get("function")
        if not function:
            return
        index = fragment.get("index", 0)
        call = self.calls.get(index)
        if call is None:
            call = self.calls[index] = [None, None, []]
        if fragment.get("id"):
            call[0] = fragment["id"]
        if function.get("name"):
            call[1] = function["name"]
        if function.get("arguments"):
            call[2].append(function["arguments"])


async def wire_result(
    wire: WireStream,
    *,
    model: str,
    count_tokens: Callable[..., int],
    counted_as: str,
    messages: list[Any],
    map_finish_reason: Callable[[str], str],
    tool_call_json: Callable[[ToolCall], str],
) -> ModelResult:
    """The `ModelResult` of a wire stream that has ended; usage counted by LiteLLM when the server sent none.

    `count_tokens` is `litellm.token_counter`, `counted_as` the model name LiteLLM's wrapper counts
    tokens with (the provider's prefix off), so a server that ignores `include_usage` gets the
    figures LiteLLM's own count gave before (its text followed by each tool call as LiteLLM's JSON,
    `tool_call_json`); `map_finish_reason` is LiteLLM's too.
    """
    text = "".join(wire.text)
    calls = [
        ToolCall(id=call_id or f"call_{i}", name=name or "", arguments="".join(pieces))
        for i, (call_id, name, pieces) in enumerate(wire.calls.values())
    ]
    usage = wire.usage or {}
    prompt, completion = usage.get("prompt_tokens"), usage.get("completion_tokens")
    if prompt is None or completion is None:

        def count() -> tuple[int, int]:
            return (
                count_tokens(model=counted_as, messages=messages),
                count_tokens(
                    model=counted_as, text=text + "".join(map(tool_call_json, calls)), count_response_tokens=True
                ),
            )

        prompt, completion = await asyncio.to_thread(count)
    return ModelResult(
        text=text,
        tool_calls=calls,
        usage=Usage(input_tokens=int(prompt or 0), output_tokens=int(completion or 0)),
        finish_reason=map_finish_reason(wire.finish_reason) if wire.finish_reason else "stop",
        model=model,
    )
