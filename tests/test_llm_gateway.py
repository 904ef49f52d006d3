"""The LLM gateway (core/chat/llm.py): the offline demo model, and the real provider path.

The real path goes through LiteLLM and the openai SDK to a scripted OpenAI-compatible
server on 127.0.0.1 (tests/utils/openai_server.py), so chunk parsing, tool-call
reassembly, usage, error mapping and timeouts are LiteLLM's real behaviour.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import time
from typing import Any

import httpx
import pytest

from core.aio import cancel_and_wait
from core.chat.llm import (
    LLMError,
    LLMEvent,
    LLMGateway,
    LLMTimeoutError,
    ModelResult,
    TextDelta,
    ToolCall,
    Usage,
    litellm_module,
)
from tests.utils.openai_server import (
    OpenAIServer,
    auth_error,
    broken,
    call,
    error,
    openai_server,  # noqa: F401  (the fixture)
    stall,
    text,
    tool_call,
    tool_calls,
)

DEMO = "local/demo"
REAL = "openai/test-model"

AGENT_INVOKE_TOOL = {
    "type": "function",
    "function": {
        "name": "agent_invoke",
        "description": "Delegate to another agent.",
        "parameters": {
            "type": "object",
            "properties": {"agentSlug": {"type": "string"}, "input": {"type": "string"}},
            "required": ["agentSlug", "input"],
        },
    },
}
ECHO_TOOL = {
    "type": "function",
    "function": {
        "name": "echo",
        "description": "Echo the text back.",
        "parameters": {"type": "object", "properties": {"text": {"type": "string"}}, "required": ["text"]},
    },
}


@pytest.fixture(scope="module", autouse=True)
def _litellm_imported() -> None:
    """Import litellm once up front (3-5 s), so no single test pays for it."""
    litellm_module()


def user(content: str) -> list[dict[str, Any]]:
    """A one-message conversation."""
    return [{"role": "user", "content": content}]


async def collect(stream: Any, timeout: float = 10.0) -> tuple[list[TextDelta], list[ModelResult]]:
    """All events of a gateway stream, split into deltas and results (bounded in time)."""
    deltas: list[TextDelta] = []
    results: list[ModelResult] = []
    async with asyncio.timeout(timeout):
        async for event in stream:
            (deltas if isinstance(event, TextDelta) else results).append(event)
    return deltas, results


async def collect_until_error(stream: Any, timeout: float = 10.0) -> tuple[list[LLMEvent], LLMError]:
    """Events up to the error the stream raises; fails when it raises nothing."""
    events: list[LLMEvent] = []
    async with asyncio.timeout(timeout):
        try:
            async for event in stream:
                events.append(event)
        except LLMError as exc:
            return events, exc
    pytest.fail(f"the stream ended without an error; events: {events!r}")


def only_result(results: list[ModelResult]) -> ModelResult:
    """The single ModelResult a stream must end with."""
    assert len(results) == 1, results
    return results[0]


# -- the demo model ----------------------------------------------------------------------


@pytest.fixture
def demo() -> LLMGateway:
    """The gateway with the demo model and no delay."""
    return LLMGateway(demo_delay_s=0)


async def test_demo_text_reply_streams_deltas_then_result(demo: LLMGateway) -> None:
    events: list[LLMEvent] = []
    async for event in demo.stream(DEMO, user("hello there")):
        events.append(event)

    assert isinstance(events[-1], ModelResult)
    deltas = events[:-1]
    assert len(deltas) > 3 and all(isinstance(d, TextDelta) for d in deltas)
    result = events[-1]
    assert result.text == "".join(d.text for d in deltas)
    assert "hello there" in result.text
    assert result.tool_calls == []
    assert result.finish_reason == "stop"
    assert result.model == DEMO


async def test_demo_mention_with_agent_invoke_makes_one_tool_call(demo: LLMGateway) -> None:
    deltas, results = await collect(
        demo.stream(DEMO, user("@coding-assistant write a haiku"), tools=[AGENT_INVOKE_TOOL])
    )

    result = only_result(results)
    assert len(result.tool_calls) == 1
    [tool] = result.tool_calls
    assert tool.name == "agent_invoke"
    assert tool.id
    assert tool.parsed_arguments() == {"agentSlug": "coding-assistant", "input": "write a haiku"}
    assert result.finish_reason == "tool_calls"
    assert deltas and result.text == "".join(d.text for d in deltas)
    assert "@coding-assistant" in result.text


async def test_demo_two_mentions_make_two_calls_in_one_step(demo: LLMGateway) -> None:
    _, results = await collect(
        demo.stream(DEMO, user("@coding-assistant write a haiku @general-assistant say hi"), tools=[AGENT_INVOKE_TOOL])
    )

    result = only_result(results)
    assert [c.parsed_arguments() for c in result.tool_calls] == [
        {"agentSlug": "coding-assistant", "input": "write a haiku"},
        {"agentSlug": "general-assistant", "input": "say hi"},
    ]
    assert len({c.id for c in result.tool_calls}) == 2
    assert result.finish_reason == "tool_calls"


async def test_demo_mention_without_tool_offered_makes_no_call(demo: LLMGateway) -> None:
    _, results = await collect(demo.stream(DEMO, user("@coding-assistant write a haiku")))

    result = only_result(results)
    assert result.tool_calls == []
    assert result.finish_reason == "stop"
    assert result.text


async def test_demo_tool_result_reply_quotes_callee_output(demo: LLMGateway) -> None:
    messages = [
        {"role": "user", "content": "@coding-assistant write a haiku"},
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {
                    "id": "call_1",
                    "type": "function",
                    "function": {
                        "name": "agent_invoke",
                        "arguments": json.dumps({"agentSlug": "coding-assistant", "input": "write a haiku"}),
                    },
                },
            ],
        },
        {
            "role": "tool",
            "tool_call_id": "call_1",
            "name": "agent_invoke",
            "content": json.dumps(
                {"ok": True, "output": "Autumn moon rises\nover quiet code", "agentSlug": "coding-assistant"}
            ),
        },
    ]

    _, results = await collect(demo.stream(DEMO, messages, tools=[AGENT_INVOKE_TOOL]))

    result = only_result(results)
    assert result.tool_calls == []
    assert "coding-assistant" in result.text
    assert "> Autumn moon rises" in result.text
    assert "> over quiet code" in result.text


async def test_demo_lorem_gives_that_many_words(demo: LLMGateway) -> None:
    deltas, results = await collect(demo.stream(DEMO, user("/lorem 50")))

    result = only_result(results)
    assert len(result.text.split()) == 50
    assert len(deltas) == 50
    assert result.usage.output_tokens == 50


async def test_demo_error_raises_llm_error_after_some_text(demo: LLMGateway) -> None:
    events, exc = await collect_until_error(demo.stream(DEMO, user("/error")))

    assert events and all(isinstance(e, TextDelta) for e in events)
    assert not isinstance(exc, LLMTimeoutError)
    assert "demo model failed" in exc.message
    assert "\n" not in exc.message and "Traceback" not in exc.message
    assert len(exc.message) < 200


async def test_demo_usage_counts_are_nonzero(demo: LLMGateway) -> None:
    deltas, results = await collect(demo.stream(DEMO, user("count my words please")))

    usage = only_result(results).usage
    assert usage.input_tokens > 0
    assert usage.output_tokens == len(deltas) > 0


async def test_demo_delay_is_honoured() -> None:
    gateway = LLMGateway(demo_delay_s=0.02)
    started = time.monotonic()
    deltas, results = await collect(gateway.stream(DEMO, user("/lorem 20")))
    elapsed = time.monotonic() - started

    assert len(deltas) == 20
    assert elapsed >= 0.35, f"20 tokens at 20 ms took only {elapsed:.3f} s"
    only_result(results)


async def test_without_a_delay_a_long_demo_reply_still_lets_the_event_loop_run(demo: LLMGateway) -> None:
    """A provider's chunks are network reads, which let other tasks run; the demo model lets them run too."""
    passes = 0
    streaming = True

    async def other_task() -> None:
        nonlocal passes
        while streaming:
            passes += 1
            await asyncio.sleep(0)

    other = asyncio.create_task(other_task())
    await asyncio.sleep(0)
    passes_at_each_word = []
    async for event in demo.stream(DEMO, user("/lorem 2000")):
        if isinstance(event, TextDelta):
            passes_at_each_word.append(passes)
    streaming = False
    await other

    assert len(passes_at_each_word) == 2000
    # The most words streamed in a row while the other task could not run. Without the demo model's
    # slices it is all 2,000; with them, what fits in 2 ms (about 50 here).
    longest = max(len(list(run)) for _, run in itertools.groupby(passes_at_each_word))
    assert longest <= 500, f"{longest} words streamed in a row without letting the event loop run"


# -- the real provider path ------------------------------------------------------------------


@pytest.fixture
def real(openai_server: OpenAIServer) -> LLMGateway:  # noqa: F811
    """The gateway pointed at the scripted server."""
    return LLMGateway(api_base=openai_server.api_base, api_key="sk-test", timeout_s=5)


async def test_real_text_deltas_arrive_through_litellm(openai_server: OpenAIServer, real: LLMGateway) -> None:  # noqa: F811
    openai_server.script(text("Hel", "lo", ", wor", "ld!"))

    deltas, results = await collect(real.stream(REAL, user("hi")))

    assert [d.text for d in deltas] == ["Hel", "lo", ", wor", "ld!"]
    result = only_result(results)
    assert result.text == "Hello, world!"
    assert result.tool_calls == []
    assert result.finish_reason == "stop"
    assert result.model == REAL
    # The server counts a stream as completed after its last chunk is sent, on the server's own thread: the
    # client may have read that chunk (and the test got here) first. Under load that took a while (CI).
    for _ in range(500):
        if openai_server.completed_streams:
            break
        await asyncio.sleep(0.01)
    assert openai_server.completed_streams == 1


async def test_real_fragmented_tool_call_is_rebuilt(openai_server: OpenAIServer, real: LLMGateway) -> None:  # noqa: F811
    arguments = {"text": 'hi there, "quoted" and ünïcode', "times": 3}
    openai_server.script(
        tool_call("echo", arguments, id="call_abc123", text_chunks=["Let me ", "echo that."], fragments=5)
    )

    deltas, results = await collect(real.stream(REAL, user("echo hi"), tools=[ECHO_TOOL]))

    assert "".join(d.text for d in deltas) == "Let me echo that."
    result = only_result(results)
    assert result.text == "Let me echo that."
    assert result.finish_reason == "tool_calls"
    assert result.tool_calls == [ToolCall(id="call_abc123", name="echo", arguments=json.dumps(arguments))]
    assert result.tool_calls[0].parsed_arguments() == arguments


async def test_real_two_parallel_tool_calls(openai_server: OpenAIServer, real: LLMGateway) -> None:  # noqa: F811
    openai_server.script(
        tool_calls(
            call("echo", {"text": "first"}, id="call_0"),
            call("agent_invoke", {"agentSlug": "coding-assistant", "input": "second"}, id="call_1", fragments=4),
        )
    )

    _, results = await collect(real.stream(REAL, user("both"), tools=[ECHO_TOOL, AGENT_INVOKE_TOOL]))

    result = only_result(results)
    assert [(c.id, c.name, c.parsed_arguments()) for c in result.tool_calls] == [
        ("call_0", "echo", {"text": "first"}),
        ("call_1", "agent_invoke", {"agentSlug": "coding-assistant", "input": "second"}),
    ]
    assert result.finish_reason == "tool_calls"
    assert result.text == ""


async def test_real_usage_comes_from_the_usage_chunk(openai_server: OpenAIServer, real: LLMGateway) -> None:  # noqa: F811
    openai_server.script(text("one", " two", usage=(23, 5)))

    _, results = await collect(real.stream(REAL, user("hi")))

    usage = only_result(results).usage
    assert (usage.input_tokens, usage.output_tokens) == (23, 5)
    assert openai_server.requests[0].body["stream_options"] == {"include_usage": True}


async def test_real_request_carries_key_model_messages_and_tools(
    openai_server: OpenAIServer,
    real: LLMGateway,  # noqa: F811
) -> None:
    openai_server.script(text("ok"))
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "hi"}]

    await collect(real.stream(REAL, messages, tools=[ECHO_TOOL], max_tokens=64))

    [request] = openai_server.requests
    assert request.path == "/v1/chat/completions"
    assert request.headers["authorization"] == "Bearer sk-test"
    assert request.body["model"] == "test-model"
    assert request.body["stream"] is True
    assert request.messages == messages
    assert request.body["tools"] == [ECHO_TOOL]
    assert request.body["max_tokens"] == 64


async def test_real_401_is_an_llm_error_about_the_api_key(openai_server: OpenAIServer, real: LLMGateway) -> None:  # noqa: F811
    openai_server.script(auth_error())

    events, exc = await collect_until_error(real.stream(REAL, user("hi")))

    assert events == []
    assert not isinstance(exc, LLMTimeoutError)
    assert "API key" in exc.message
    assert exc.status_code == 401
    assert len(openai_server.requests) == 1  # not retried


async def test_real_500_is_an_llm_error(openai_server: OpenAIServer, real: LLMGateway) -> None:  # noqa: F811
    # The openai SDK retries 5xx itself (twice by default), so script enough failures for every attempt.
    openai_server.script(*[error(500, "The upstream model crashed.")] * 3)
    started = time.monotonic()

    events, exc = await collect_until_error(real.stream(REAL, user("hi")))

    assert time.monotonic() - started < 5
    assert events == []
    assert not isinstance(exc, LLMTimeoutError)
    assert exc.status_code == 500
    assert "The upstream model crashed." in exc.message
    assert "Traceback" not in exc.message and "\n" not in exc.message
    assert 1 <= len(openai_server.requests) <= 3


async def test_real_stall_longer_than_timeout_is_llm_timeout(openai_server: OpenAIServer) -> None:  # noqa: F811
    gateway = LLMGateway(api_base=openai_server.api_base, api_key="sk-test", timeout_s=0.5)
    openai_server.script(stall(["par", "tial"], seconds=10))
    started = time.monotonic()

    events, exc = await collect_until_error(gateway.stream(REAL, user("hi")))
    elapsed = time.monotonic() - started

    assert isinstance(exc, LLMTimeoutError)
    assert "LLM_TIMEOUT_S" in exc.message
    assert [e.text for e in events if isinstance(e, TextDelta)] == ["par", "tial"]
    assert 0.4 <= elapsed < 2, elapsed
    assert len(openai_server.requests) == 1  # a read timeout is not retried


async def test_real_broken_stream_is_llm_error_without_hanging(openai_server: OpenAIServer, real: LLMGateway) -> None:  # noqa: F811
    openai_server.script(broken(["Partial ", "answer"]))
    started = time.monotonic()

    events, exc = await collect_until_error(real.stream(REAL, user("hi")), timeout=4)

    assert time.monotonic() - started < 2
    assert [e.text for e in events if isinstance(e, TextDelta)] == ["Partial ", "answer"]
    assert not any(isinstance(e, ModelResult) for e in events)
    assert not isinstance(exc, LLMTimeoutError)
    assert exc.message
    assert openai_server.broken_streams == 1


# -- the test server itself (so that a failure above is not the server's) ----------------------


async def test_server_streams_sse_with_usage_and_done(openai_server: OpenAIServer) -> None:  # noqa: F811
    openai_server.script(tool_call("echo", {"text": "x"}, id="call_x", text_chunks=["a"], fragments=3, usage=(3, 4)))

    async with httpx.AsyncClient() as client:
        async with client.stream(
            "POST",
            f"{openai_server.api_base}/chat/completions",
            json={
                "model": "m",
                "messages": [],
                "stream": True,
                "stream_options": {"include_usage": True},
            },
        ) as response:
            assert response.status_code == 200
            assert response.headers["content-type"].startswith("text/event-stream")
            lines = [line async for line in response.aiter_lines() if line]

    assert lines[-1] == "data: [DONE]"
    chunks = [json.loads(line.removeprefix("data: ")) for line in lines[:-1]]
    assert all(c["object"] == "chat.completion.chunk" and c["model"] == "m" for c in chunks)
    fragments = [
        c["choices"][0]["delta"]["tool_calls"][0]
        for c in chunks
        if c["choices"] and c["choices"][0]["delta"].get("tool_calls")
    ]
    assert len(fragments) == 3
    assert fragments[0]["id"] == "call_x" and fragments[0]["function"]["name"] == "echo"
    assert all("id" not in f and "name" not in f["function"] for f in fragments[1:])
    assert "".join(f["function"]["arguments"] for f in fragments) == '{"text": "x"}'
    assert chunks[-2]["choices"][0]["finish_reason"] == "tool_calls"
    assert chunks[-1]["choices"] == [] and chunks[-1]["usage"]["total_tokens"] == 7


async def test_server_answers_without_streaming_and_when_exhausted(openai_server: OpenAIServer) -> None:  # noqa: F811
    openai_server.script(text("Hello", " there", usage=(2, 2)))

    async with httpx.AsyncClient() as client:
        url = f"{openai_server.api_base}/chat/completions"
        first = await client.post(url, json={"model": "m", "messages": [{"role": "user", "content": "x"}]})
        second = await client.post(url, json={"model": "m", "messages": []}, headers={"Authorization": "Bearer k"})

    assert first.status_code == 200
    body = first.json()
    assert body["object"] == "chat.completion"
    assert body["choices"][0]["message"] == {"role": "assistant", "content": "Hello there", "refusal": None}
    assert body["usage"] == {"prompt_tokens": 2, "completion_tokens": 2, "total_tokens": 4}
    assert second.status_code == 500 and second.json()["error"]["code"] == "script_exhausted"
    assert [r.messages for r in openai_server.requests] == [[{"role": "user", "content": "x"}], []]
    assert openai_server.requests[1].headers["authorization"] == "Bearer k"


# -- the final message is built from the stream (StreamAssembly) ------------------------


async def test_real_no_usage_from_the_provider_is_counted_like_before(
    openai_server: OpenAIServer,
    real: LLMGateway,  # noqa: F811
) -> None:
    """A server that ignores include_usage: LiteLLM's own count, as stream_chunk_builder gave before."""
    openai_server.script(text("one", " two", " three", usage=None))
    messages = user("count these words please")

    _, results = await collect(real.stream(REAL, messages))

    litellm = litellm_module()
    usage = only_result(results).usage
    assert usage.input_tokens == litellm.token_counter(model="test-model", messages=messages) > 0
    assert (
        usage.output_tokens
        == litellm.token_counter(model="test-model", text="one two three", count_response_tokens=True)
        > 0
    )


async def test_real_tool_call_split_over_many_chunks_with_usage_from_the_last_one(
    openai_server: OpenAIServer,
    real: LLMGateway,  # noqa: F811
) -> None:
    arguments = {"agentSlug": "coding-assistant", "input": "a longer task " * 8}
    openai_server.script(
        tool_calls(
            call("agent_invoke", arguments, id="call_a", fragments=12),
            call("echo", {"text": "two"}, id="call_b", fragments=6),
            text_chunks=["Asking", " both."],
            usage=(101, 37),
        )
    )

    deltas, results = await collect(real.stream(REAL, user("both"), tools=[ECHO_TOOL, AGENT_INVOKE_TOOL]))

    result = only_result(results)
    assert "".join(d.text for d in deltas) == result.text == "Asking both."
    assert result.tool_calls == [
        ToolCall("call_a", "agent_invoke", json.dumps(arguments)),
        ToolCall("call_b", "echo", json.dumps({"text": "two"})),
    ]
    assert (result.usage.input_tokens, result.usage.output_tokens) == (101, 37)
    assert result.finish_reason == "tool_calls"


def _stream_chunk(
    litellm: Any,
    *,
    content: str | None = None,
    tool_calls: list[dict] | None = None,
    finish_reason: str | None = None,
    usage: dict | None = None,
    choices: bool = True,
) -> Any:
    """A real LiteLLM `ModelResponseStream`, as `CustomStreamWrapper` yields them."""
    from litellm.types.utils import ModelResponseStream

    delta: dict[str, Any] = {"role": "assistant", "content": content}
    if tool_calls is not None:
        delta["tool_calls"] = tool_calls
    choice = {"index": 0, "delta": delta, "finish_reason": finish_reason}
    body: dict[str, Any] = {
        "id": "chatcmpl-1",
        "model": "m",
        "object": "chat.completion.chunk",
        "created": 1,
        "choices": [choice] if choices else [],
    }
    if usage is not None:
        body["usage"] = usage
    return ModelResponseStream(**body)


def _assemble(chunks: list[Any]) -> ModelResult:
    from core.chat.llm import StreamAssembly

    assembly = StreamAssembly("m")
    for chunk in chunks:
        assembly.add(chunk)
    return assembly.result()


def _as_the_builder_did(litellm: Any, chunks: list[Any]) -> ModelResult:
    """What the gateway made of a stream before StreamAssembly: `litellm.stream_chunk_builder` at the end."""
    full = litellm.stream_chunk_builder(chunks, messages=[{"role": "user", "content": "hi"}])
    message = full.choices[0].message
    return ModelResult(
        text=message.content or "",
        tool_calls=[
            ToolCall(tc.id or f"call_{i}", tc.function.name or "", tc.function.arguments or "")
            for i, tc in enumerate(message.tool_calls or [])
        ],
        usage=Usage(full.usage.prompt_tokens or 0, full.usage.completion_tokens or 0),
        finish_reason=full.choices[0].finish_reason or "stop",
        model="m",
    )


def _interleaved_calls_stream(litellm: Any) -> list[Any]:
    """Text, then two tool calls whose fragments interleave; the id and name of the second come late."""
    return [
        _stream_chunk(litellm, content="Two "),
        _stream_chunk(litellm, content="calls."),
        _stream_chunk(
            litellm,
            tool_calls=[
                {"index": 0, "id": "call_x", "type": "function", "function": {"name": "echo", "arguments": '{"te'}}
            ],
        ),
        _stream_chunk(litellm, tool_calls=[{"index": 1, "type": "function", "function": {"arguments": '{"agentS'}}]),
        _stream_chunk(litellm, tool_calls=[{"index": 0, "type": "function", "function": {"arguments": 'xt": "a"}'}}]),
        _stream_chunk(
            litellm,
            tool_calls=[
                {
                    "index": 1,
                    "id": "call_y",
                    "type": "function",
                    "function": {"name": "agent_invoke", "arguments": 'lug": "b"}'},
                }
            ],
        ),
        _stream_chunk(litellm, finish_reason="tool_calls"),
        _stream_chunk(litellm, choices=False, usage={"prompt_tokens": 9, "completion_tokens": 4, "total_tokens": 13}),
    ]


def test_assembly_matches_the_builder_for_interleaved_tool_call_fragments() -> None:
    litellm = litellm_module()
    chunks = _interleaved_calls_stream(litellm)

    result = _assemble(chunks)

    assert result.text == "Two calls."
    assert result.tool_calls == [
        ToolCall("call_x", "echo", '{"text": "a"}'),
        ToolCall("call_y", "agent_invoke", '{"agentSlug": "b"}'),
    ]
    assert (result.usage.input_tokens, result.usage.output_tokens) == (9, 4)
    assert result.finish_reason == "tool_calls"
    assert result == _as_the_builder_did(litellm, chunks)


def test_assembly_matches_the_builder_for_plain_text() -> None:
    litellm = litellm_module()
    chunks = [_stream_chunk(litellm, content=piece) for piece in ("Hel", "lo", " ", "wörld")]
    chunks += [
        _stream_chunk(litellm, finish_reason="length"),
        _stream_chunk(litellm, choices=False, usage={"prompt_tokens": 3, "completion_tokens": 4, "total_tokens": 7}),
    ]

    result = _assemble(chunks)

    assert (result.text, result.finish_reason, result.usage) == ("Hello wörld", "length", Usage(3, 4))
    assert result == _as_the_builder_did(litellm, chunks)


def test_assembly_without_any_usage_chunk_counts_zero_and_keeps_an_id_less_call() -> None:
    litellm = litellm_module()
    chunks = [
        _stream_chunk(
            litellm, tool_calls=[{"index": 0, "type": "function", "function": {"name": "echo", "arguments": "{}"}}]
        ),
        _stream_chunk(litellm, finish_reason="tool_calls"),
    ]

    result = _assemble(chunks)

    # (The gateway always gets a usage chunk from LiteLLM; this is the assembly on its own.)
    assert result.usage == Usage(0, 0)
    assert result.tool_calls == [ToolCall("call_0", "echo", "{}")]  # the builder dropped a call without an id
    assert result.text == "" and result.finish_reason == "tool_calls"


def test_compacting_kept_chunks_leaves_the_builders_result_unchanged() -> None:
    """LiteLLM's end-of-stream count reads the kept chunks: folding the text ones changes nothing it gives."""
    from core.chat.llm import compact_kept_chunks

    litellm = litellm_module()
    words = [f"w{i} " for i in range(40)]

    def stream() -> list[Any]:
        chunks = [_stream_chunk(litellm, content=word) for word in words[:25]]
        chunks += _interleaved_calls_stream(litellm)[2:6]  # tool-call fragments in the middle
        chunks += [_stream_chunk(litellm, content=word) for word in words[25:]]
        return [*chunks, _stream_chunk(litellm, finish_reason="tool_calls")]

    whole, folded = stream(), stream()
    compact_kept_chunks(folded)

    assert len(folded) == 1 + 1 + 4 + 2  # the first, one carrier of the text, the tool calls, the last two
    assert folded[-1].choices[0].finish_reason == "tool_calls" and folded[-2].choices[0].delta.content == "w39 "
    before = litellm.stream_chunk_builder(whole, messages=[{"role": "user", "content": "hi"}])
    after = litellm.stream_chunk_builder(folded, messages=[{"role": "user", "content": "hi"}])
    assert after.choices[0].message.content == before.choices[0].message.content == "".join(words)
    assert [(c.id, c.function.name, c.function.arguments) for c in after.choices[0].message.tool_calls] == [
        (c.id, c.function.name, c.function.arguments) for c in before.choices[0].message.tool_calls
    ]
    assert after.usage.completion_tokens == before.usage.completion_tokens > 0
    assert after.usage.prompt_tokens == before.usage.prompt_tokens


async def test_real_long_reply_without_usage_is_counted_over_all_its_text(
    openai_server: OpenAIServer,
    real: LLMGateway,  # noqa: F811
) -> None:
    """Many more chunks than the gateway lets LiteLLM keep: the estimate still covers every word."""
    pieces = [f" word{i}" for i in range(120)]
    openai_server.script(text(*pieces, usage=None))

    deltas, results = await collect(real.stream(REAL, user("talk")))

    litellm = litellm_module()
    result = only_result(results)
    assert result.text == "".join(pieces) == "".join(d.text for d in deltas)
    assert result.usage.output_tokens == litellm.token_counter(
        model="test-model", text="".join(pieces), count_response_tokens=True
    )


async def _arrival_times(delay_s: float, tokens: int, *, hold_after: int, hold_s: float) -> list[float]:
    """When each token of a demo reply reaches the reader, the event loop held for `hold_s` after one of them."""
    gateway = LLMGateway(demo_delay_s=delay_s)
    times: list[float] = []
    async for event in gateway.stream("local/demo", [{"role": "user", "content": f"/lorem {tokens}"}]):
        if isinstance(event, TextDelta):
            times.append(time.perf_counter())
            if len(times) == hold_after:
                time.sleep(hold_s)  # a busy event loop: nothing runs meanwhile
    return times


async def test_the_demo_model_keeps_its_own_clock_when_the_reader_is_late() -> None:
    # 20 tokens 20 ms apart take 0.38 s from the first. An 80 ms stall after the 5th (within the
    # five tokens of debt it makes up) does not make it 0.46 s: the tokens due meanwhile come at once.
    times = await _arrival_times(0.02, 20, hold_after=5, hold_s=0.08)
    assert len(times) == 20
    assert times[-1] - times[0] < 0.43
    assert times[5] - times[4] >= 0.075  # the stall itself
    assert times[6] - times[5] < 0.018  # due during the stall: not another 20 ms


async def test_the_demo_model_restarts_its_clock_after_a_long_stall_instead_of_a_burst() -> None:
    times = await _arrival_times(0.02, 16, hold_after=3, hold_s=0.3)  # 15 tokens' worth of debt
    gaps = [b - a for a, b in zip(times[2:], times[3:], strict=False)]
    assert gaps[0] >= 0.29
    assert all(gap >= 0.012 for gap in gaps[1:])  # paced again, not 15 tokens at once


async def test_tokens_that_came_due_while_the_reader_was_late_are_read_without_a_pass_of_the_event_loop() -> None:
    # As a network read finds in its buffer the chunks that came while the app was busy: a loaded
    # loop then does one step for the tokens it missed, not one loop pass per token.
    passes = 0

    async def count_passes() -> None:
        nonlocal passes
        while True:
            await asyncio.sleep(0)
            passes += 1

    counter = asyncio.create_task(count_passes())
    try:
        gateway = LLMGateway(demo_delay_s=0.02)
        seen: list[int] = []
        async for event in gateway.stream("local/demo", [{"role": "user", "content": "/lorem 12"}]):
            if isinstance(event, TextDelta):
                seen.append(passes)
                if len(seen) == 3:
                    time.sleep(0.09)  # four more tokens come due meanwhile (within the debt it makes up)
    finally:
        await cancel_and_wait(counter)
    assert len(seen) == 12
    assert seen[3] == seen[4] == seen[5] == seen[6] == seen[2]  # due during the stall: no pass between them
    assert all(later > earlier for earlier, later in zip(seen[7:], seen[8:], strict=False))  # paced again
