"""The OpenAI-compatible wire read without LiteLLM's per-chunk wrapper, and the Anthropic wire through it (issue 38).

An OpenAI-compatible stream is read as plain JSON once LiteLLM has made the call
(`core/chat/openai_wire.py`); every other provider still goes through LiteLLM's wrapper. These
tests hold both to what LiteLLM's own parsing gives: the same OpenAI-compatible responses read
the new way and, with the fast path switched off, the old way give the same events and results;
an Anthropic-wire server (LiteLLM's Anthropic parsing over real HTTP) gives text, tool calls,
usage and errors.
"""

from __future__ import annotations

import json
from typing import Any

import httpx
import pytest

from core.chat import openai_wire
from core.chat.llm import LLMError, LLMGateway, TextDelta, litellm_module
from core.web.outbound_policy import AllowList
from tests.test_llm_gateway import ECHO_TOOL, collect, collect_until_error, only_result, user
from tests.utils.anthropic_server import AnthropicReply, AnthropicServer, anthropic_server  # noqa: F401
from tests.utils.openai_server import (  # noqa: F401
    OpenAIServer,
    ScriptedResponse,
    call,
    openai_server,
    text,
    tool_call,
    tool_calls,
)

REAL = "openai/test-model"
CLAUDE = "anthropic/claude-3-5-haiku-latest"


@pytest.fixture(scope="module", autouse=True)
def _litellm_imported() -> None:
    litellm_module()


async def _both_ways(
    server: OpenAIServer, response: ScriptedResponse, monkeypatch: pytest.MonkeyPatch, tools: list | None
) -> list[Any]:
    """The events of one scripted response read off the wire, then through LiteLLM's wrapper."""
    gateway = LLMGateway(api_base=server.api_base, api_key="sk-test", timeout_s=5)
    seen = []
    found: list[object] = []
    real_raw_response = openai_wire.raw_response

    def spy(wrapper: Any) -> Any:
        found.append(real_raw_response(wrapper))
        return found[-1]

    monkeypatch.setattr(openai_wire, "raw_response", spy)
    for fast in (True, False):
        if not fast:
            monkeypatch.setattr(openai_wire, "FAST_PROVIDERS", frozenset())
        server.script(response)
        deltas, results = await collect(gateway.stream(REAL, user("hello there"), tools=tools))
        seen.append(([d.text for d in deltas], only_result(results)))
    assert isinstance(found[0], httpx.Response) and found[1] is None  # read off the wire, then by the wrapper
    return seen


@pytest.mark.parametrize(
    "response",
    [
        text("Hel", "lo", " world"),
        text("no", " usage", " sent", usage=None),
        tool_call("echo", {"text": "hi"}, text_chunks=["Let me ", "check."], fragments=4),
        tool_calls(call("echo", {"text": "a"}, fragments=2), call("echo", {"text": "b"}, fragments=3)),
        tool_call("echo", '{"text": "unclosed', fragments=2, usage=None),
    ],
    ids=["text", "text-without-usage", "tool-call", "parallel-calls", "malformed-arguments"],
)
async def test_the_wire_gives_what_litellms_wrapper_gives(
    openai_server: OpenAIServer,  # noqa: F811
    response: ScriptedResponse,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    (fast_deltas, fast), (slow_deltas, slow) = await _both_ways(openai_server, response, monkeypatch, [ECHO_TOOL])
    assert fast_deltas == slow_deltas
    assert fast.text == slow.text == "".join(response.text_chunks)
    assert fast.tool_calls == slow.tool_calls
    assert [c.name for c in fast.tool_calls] == [c.name for c in response.calls]
    assert fast.finish_reason == slow.finish_reason == response.effective_finish_reason
    assert (fast.usage.input_tokens, fast.usage.output_tokens) == (slow.usage.input_tokens, slow.usage.output_tokens)
    assert fast.usage.output_tokens > 0 and fast.usage.input_tokens > 0
    if response.usage is not None:
        assert (fast.usage.input_tokens, fast.usage.output_tokens) == response.usage


async def test_an_openai_stream_is_read_off_the_wire_and_an_anthropic_one_through_the_wrapper(
    openai_server: OpenAIServer,  # noqa: F811
    anthropic_server: AnthropicServer,  # noqa: F811
) -> None:
    litellm = litellm_module()
    openai_server.script(text("a", "b"))
    response = await litellm.acompletion(
        model=REAL, messages=user("hi"), stream=True, api_base=openai_server.api_base, api_key="sk"
    )
    raw = openai_wire.raw_response(response)
    assert isinstance(raw, httpx.Response)
    await raw.aclose()
    anthropic_server.reply(AnthropicReply(text=("x",)))
    response = await litellm.acompletion(
        model=CLAUDE, messages=user("hi"), stream=True, api_base=anthropic_server.url, api_key="sk-ant"
    )
    assert openai_wire.raw_response(response) is None
    async for _ in response:
        pass


def _wire(*events: str) -> openai_wire.WireStream:
    body = "".join(f"data: {e}\n\n" for e in events).encode()
    return openai_wire.WireStream(httpx.Response(200, content=body), repeat_limit=5)


def _chunk(content: str) -> str:
    return json.dumps({"choices": [{"index": 0, "delta": {"content": content}, "finish_reason": None}]})


async def test_an_error_event_in_an_openai_stream_is_raised_after_the_text_before_it() -> None:
    wire = _wire(_chunk("Par"), _chunk("tial"), json.dumps({"error": {"message": "Upstream overloaded"}}))
    got = []
    with pytest.raises(openai_wire.StreamEventError, match="Upstream overloaded"):
        async for piece in wire.texts():
            got.append(piece)
    assert got == ["Par", "tial"]


async def test_a_model_repeating_one_chunk_is_stopped_as_litellm_stops_it() -> None:
    wire = _wire(*[_chunk("again ")] * 10, "[DONE]")
    got = []
    with pytest.raises(RuntimeError, match="repeating"):
        async for piece in wire.texts():
            got.append(piece)
    assert len(got) == 4  # the fifth identical chunk is the limit (LiteLLM's count)
    short = _wire(*[_chunk("ok")] * 10, "[DONE]")  # two characters or fewer are never counted
    assert [p async for p in short.texts()] == ["ok"] * 10


async def test_an_error_event_reads_as_a_sentence() -> None:
    from core.chat.llm import _as_llm_error

    exc = _as_llm_error(
        litellm_module(), openai_wire.StreamEventError("The engine is overloaded", {}), REAL, streamed=True
    )
    assert isinstance(exc, LLMError)
    assert exc.message.endswith("The engine is overloaded") and REAL in exc.message


# -- the Anthropic wire, through LiteLLM's own parsing -----------------------------------------


@pytest.fixture
def claude(anthropic_server: AnthropicServer) -> LLMGateway:  # noqa: F811
    return LLMGateway(timeout_s=5, allow=AllowList.parse(["127.0.0.1"]))


async def test_anthropic_text_and_usage(anthropic_server: AnthropicServer, claude: LLMGateway) -> None:  # noqa: F811
    anthropic_server.reply(AnthropicReply(text=("Hello", " from", " Claude"), input_tokens=21, output_tokens=9))

    deltas, results = await collect(claude.stream(CLAUDE, user("hi"), api_base=anthropic_server.url, api_key="k"))

    result = only_result(results)
    assert [d.text for d in deltas] == ["Hello", " from", " Claude"]
    assert result.text == "Hello from Claude"
    assert (result.usage.input_tokens, result.usage.output_tokens) == (21, 9)
    assert result.finish_reason == "stop"
    assert anthropic_server.requests[0].path.endswith("/v1/messages")
    assert anthropic_server.requests[0].headers["x-api-key"] == "k"


async def test_anthropic_tool_call(anthropic_server: AnthropicServer, claude: LLMGateway) -> None:  # noqa: F811
    arguments = json.dumps({"text": "hi there"})
    anthropic_server.reply(AnthropicReply(text=("Let me echo.",), calls=(("toolu_1", "echo", arguments),)))

    deltas, results = await collect(
        claude.stream(CLAUDE, user("echo"), tools=[ECHO_TOOL], api_base=anthropic_server.url, api_key="k")
    )

    result = only_result(results)
    assert "".join(d.text for d in deltas) == "Let me echo."
    assert [(c.id, c.name, c.parsed_arguments()) for c in result.tool_calls] == [
        ("toolu_1", "echo", {"text": "hi there"})
    ]
    assert result.finish_reason == "tool_calls"
    assert anthropic_server.requests[0].body["tools"][0]["name"] == "echo"


async def test_anthropic_errors(anthropic_server: AnthropicServer, claude: LLMGateway) -> None:  # noqa: F811
    anthropic_server.reply(AnthropicReply(status=401))
    events, exc = await collect_until_error(
        claude.stream(CLAUDE, user("hi"), api_base=anthropic_server.url, api_key="wrong")
    )
    assert events == [] and "API key" in exc.message and exc.status_code == 401

    anthropic_server.reply(AnthropicReply(text=("Half", " an", " answer"), error_after=2))
    events, exc = await collect_until_error(
        claude.stream(CLAUDE, user("hi"), api_base=anthropic_server.url, api_key="k")
    )
    assert [e.text for e in events if isinstance(e, TextDelta)] == ["Half", " an"]
    assert "Traceback" not in exc.message
