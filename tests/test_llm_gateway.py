"""The LLM gateway (core/chat/llm.py): the offline demo model, and the real provider path.

The real path goes through LiteLLM and the openai SDK to a scripted OpenAI-compatible
server on 127.0.0.1 (tests/utils/openai_server.py), so chunk parsing, tool-call
reassembly, usage, error mapping and timeouts are LiteLLM's real behaviour.
"""

from __future__ import annotations

import asyncio
import json
import time
from typing import Any

import httpx
import pytest

from core.chat.llm import LLMError, LLMEvent, LLMGateway, LLMTimeout, ModelResult, TextDelta, ToolCall, litellm_module
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
        demo.stream(DEMO, user("@coding-assistant write a haiku @general-assistant say hi"),
                    tools=[AGENT_INVOKE_TOOL])
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
        {"role": "assistant", "content": None, "tool_calls": [
            {"id": "call_1", "type": "function",
             "function": {"name": "agent_invoke",
                          "arguments": json.dumps({"agentSlug": "coding-assistant", "input": "write a haiku"})}},
        ]},
        {"role": "tool", "tool_call_id": "call_1", "name": "agent_invoke",
         "content": json.dumps({"ok": True, "output": "Autumn moon rises\nover quiet code", "agentSlug": "coding-assistant"})},
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
    assert not isinstance(exc, LLMTimeout)
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
    assert openai_server.completed_streams == 1


async def test_real_fragmented_tool_call_is_rebuilt(openai_server: OpenAIServer, real: LLMGateway) -> None:  # noqa: F811
    arguments = {"text": "hi there, \"quoted\" and ünïcode", "times": 3}
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
    openai_server.script(tool_calls(
        call("echo", {"text": "first"}, id="call_0"),
        call("agent_invoke", {"agentSlug": "coding-assistant", "input": "second"}, id="call_1", fragments=4),
    ))

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
    openai_server: OpenAIServer, real: LLMGateway,  # noqa: F811
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
    assert not isinstance(exc, LLMTimeout)
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
    assert not isinstance(exc, LLMTimeout)
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

    assert isinstance(exc, LLMTimeout)
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
    assert not isinstance(exc, LLMTimeout)
    assert exc.message
    assert openai_server.broken_streams == 1


# -- the test server itself (so that a failure above is not the server's) ----------------------


async def test_server_streams_sse_with_usage_and_done(openai_server: OpenAIServer) -> None:  # noqa: F811
    openai_server.script(tool_call("echo", {"text": "x"}, id="call_x", text_chunks=["a"], fragments=3, usage=(3, 4)))

    async with httpx.AsyncClient() as client:
        async with client.stream("POST", f"{openai_server.api_base}/chat/completions", json={
            "model": "m", "messages": [], "stream": True, "stream_options": {"include_usage": True},
        }) as response:
            assert response.status_code == 200
            assert response.headers["content-type"].startswith("text/event-stream")
            lines = [line async for line in response.aiter_lines() if line]

    assert lines[-1] == "data: [DONE]"
    chunks = [json.loads(line.removeprefix("data: ")) for line in lines[:-1]]
    assert all(c["object"] == "chat.completion.chunk" and c["model"] == "m" for c in chunks)
    fragments = [c["choices"][0]["delta"]["tool_calls"][0] for c in chunks if c["choices"]
                 and c["choices"][0]["delta"].get("tool_calls")]
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
