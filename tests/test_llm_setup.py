"""A model call's set-up through LiteLLM (`core/chat/llm_setup.py`, issue 38 item 2).

An OpenAI-compatible call with its key is set up on the event loop, not on a thread of the default
executor; every other provider's set-up, and everything else submitted meanwhile, still goes to a
thread. A gateway call's stream is not priced at set-up (the app prices the usage at the end); a
call made outside the gateway still is. Two routes' keys each go to their own endpoint, and the
calls of one route share their connection.
"""

from __future__ import annotations

import asyncio
import contextvars
import functools
import threading
from typing import Any

import pytest

from core.chat import llm_setup
from core.chat.llm import LLMGateway, litellm_module
from core.web import outbound_policy
from core.web.outbound_policy import AllowList
from tests.test_llm_gateway import collect, only_result, user
from tests.utils.anthropic_server import AnthropicReply, AnthropicServer, anthropic_server  # noqa: F401
from tests.utils.openai_server import OpenAIServer, openai_server, text  # noqa: F401

REAL = "openai/test-model"
PRICED = "openai/gpt-4o-mini"  # in LiteLLM's price list: pricing it costs a prompt token count


@pytest.fixture(scope="module", autouse=True)
def _litellm_imported() -> None:
    litellm_module()


@pytest.fixture
def setup_threads(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The thread each LiteLLM `completion()` (the sync set-up `acompletion` hands on) ran on: "loop" or "thread"."""
    litellm = litellm_module()
    real = litellm.main.completion
    loop_thread = threading.get_ident()
    seen: list[str] = []

    @functools.wraps(real)
    def completion(*args: Any, **kwargs: Any) -> Any:
        seen.append("loop" if threading.get_ident() == loop_thread else "thread")
        return real(*args, **kwargs)

    monkeypatch.setattr(litellm.main, "completion", completion)
    return seen


async def test_an_openai_compatible_call_is_set_up_on_the_event_loop(
    openai_server: OpenAIServer,  # noqa: F811
    setup_threads: list[str],
) -> None:
    gateway = LLMGateway(api_base=openai_server.api_base, api_key="sk-test", timeout_s=5)
    for _ in range(2):
        openai_server.script(text("Hel", "lo"))
        deltas, results = await collect(gateway.stream(REAL, user("hi")))
        assert "".join(d.text for d in deltas) == "Hello" and only_result(results).usage.output_tokens == 7
    assert setup_threads == ["loop", "loop"]


async def test_an_anthropic_call_is_still_set_up_on_a_thread(
    anthropic_server: AnthropicServer,  # noqa: F811
    setup_threads: list[str],
) -> None:
    anthropic_server.reply(AnthropicReply(text=("Hi", " there")))
    gateway = LLMGateway(timeout_s=5, allow=AllowList.parse(["127.0.0.1"]))
    deltas, _ = await collect(
        gateway.stream("anthropic/claude-3-5-haiku-latest", user("hi"), api_base=anthropic_server.url, api_key="sk")
    )
    assert "".join(d.text for d in deltas) == "Hi there"
    assert setup_threads == ["thread"]


async def test_only_the_calls_set_up_submission_runs_inline() -> None:
    """Inside `quiet_call`, LiteLLM's `completion()` runs inline once; anything else submitted goes to a thread."""

    def completion() -> int:
        return threading.get_ident()

    fake = type("FakeLiteLLM", (), {"main": type("Main", (), {"completion": staticmethod(completion)})})
    loop = asyncio.get_running_loop()

    def submitted() -> Any:  # what `acompletion` hands the executor
        return functools.partial(contextvars.copy_context().run, functools.partial(completion))

    here = threading.get_ident()
    with llm_setup.quiet_call(fake, setup_on_loop=True):
        assert await asyncio.to_thread(threading.get_ident) != here  # not LiteLLM's set-up
        assert await loop.run_in_executor(None, submitted()) == here
        assert await loop.run_in_executor(None, submitted()) != here  # once per call
    with llm_setup.quiet_call(fake, setup_on_loop=False):
        assert await loop.run_in_executor(None, submitted()) != here
    assert await loop.run_in_executor(None, submitted()) != here  # outside a gateway call


async def test_a_failing_setup_on_the_loop_raises_to_the_caller() -> None:
    def completion() -> None:
        raise ValueError("no such model")

    fake = type("FakeLiteLLM", (), {"main": type("Main", (), {"completion": staticmethod(completion)})})
    with llm_setup.quiet_call(fake, setup_on_loop=True), pytest.raises(ValueError, match="no such model"):
        await asyncio.get_running_loop().run_in_executor(
            None, functools.partial(contextvars.copy_context().run, functools.partial(completion))
        )


async def test_a_gateway_stream_is_not_priced_at_set_up_and_other_calls_are(
    openai_server: OpenAIServer,  # noqa: F811
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    litellm = litellm_module()
    real = litellm.response_cost_calculator
    priced: list[str] = []

    def response_cost_calculator(*args: Any, **kwargs: Any) -> Any:
        priced.append(str(kwargs.get("model")))
        return real(*args, **kwargs)

    monkeypatch.setattr(litellm, "response_cost_calculator", response_cost_calculator)
    gateway = LLMGateway(api_base=openai_server.api_base, api_key="sk-test", timeout_s=5)
    openai_server.script(text("a", "b"), text("c"))
    _, results = await collect(gateway.stream(PRICED, user("hi")))
    assert priced == [] and only_result(results).usage.cost_usd  # the app's own price, from the usage
    response = await litellm.acompletion(
        model=PRICED, messages=user("hi"), stream=True, api_base=openai_server.api_base, api_key="sk"
    )
    async for _ in response:
        pass
    assert priced  # LiteLLM's own calls are priced as before


async def test_each_routes_key_goes_to_its_own_endpoint_and_a_route_reuses_its_connection() -> None:
    first, second = OpenAIServer().start(), OpenAIServer().start()
    try:
        gateway = LLMGateway(
            api_base=first.api_base, api_key="sk-operator", timeout_s=5, allow=AllowList.parse(["127.0.0.1"])
        )
        for _ in range(2):
            first.script(text("one"))
            second.script(text("two"))
            _, results = await collect(gateway.stream(REAL, user("hi")))
            assert only_result(results).text == "one"
            _, results = await collect(gateway.stream(REAL, user("hi"), api_base=second.api_base, api_key="sk-agent"))
            assert only_result(results).text == "two"
        assert [r.headers["authorization"] for r in first.requests] == ["Bearer sk-operator"] * 2
        assert [r.headers["authorization"] for r in second.requests] == ["Bearer sk-agent"] * 2
        assert len({r.client for r in first.requests}) == 1 and len({r.client for r in second.requests}) == 1
    finally:
        first.stop()
        second.stop()


async def test_an_address_written_as_one_is_not_looked_up(monkeypatch: pytest.MonkeyPatch) -> None:
    looked_up: list[str] = []

    async def getaddrinfo(self: Any, host: str, *args: Any, **kwargs: Any) -> Any:
        looked_up.append(host)
        return [(2, 1, 6, "", ("127.0.0.1", 80))]

    monkeypatch.setattr(asyncio.BaseEventLoop, "getaddrinfo", getaddrinfo)
    allow = AllowList.parse(["127.0.0.1", "::1"])
    assert await outbound_policy.url_refusal("http://127.0.0.1:8000/v1", allow) is None
    assert await outbound_policy.url_refusal("http://[::1]:8000/v1", allow) is None
    assert await outbound_policy.url_refusal("http://169.254.169.254/", allow) is not None
    assert looked_up == []
    for spelled in ("http://2130706433/", "http://0x7f.1/", "http://model.example/"):
        assert await outbound_policy.url_refusal(spelled, allow) is None
    assert looked_up == ["2130706433", "0x7f.1", "model.example"]
