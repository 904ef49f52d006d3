"""Every provider failure LiteLLM raises reads as a sentence a person understands (issue 37, item 3).

Through the real LiteLLM path to a scripted OpenAI-compatible server on 127.0.0.1 (tests/utils/openai_server.py):
the provider's error bodies are the ones OpenAI sends; LiteLLM maps them to its exception types, the gateway
to `LLMError`. No message carries LiteLLM's class names or a traceback; they go to the log.
"""

from __future__ import annotations

import logging

import pytest

from core.chat.llm import LLMGateway, LLMTimeoutError, litellm_module
from core.i18n import use_language
from tests.test_llm_gateway import REAL, collect_until_error, user
from tests.utils.openai_server import (
    OpenAIServer,
    broken,
    error,
    openai_server,  # noqa: F401  (the fixture)
)
from tests.utils.ports import free_port

LIBRARY_WORDS = ("litellm", "OpenAIException", "InternalServerError", "APIConnectionError", "BadRequestError")


@pytest.fixture(scope="module", autouse=True)
def _litellm_imported() -> None:
    litellm_module()


@pytest.fixture
def real(openai_server: OpenAIServer) -> LLMGateway:  # noqa: F811
    return LLMGateway(api_base=openai_server.api_base, api_key="sk-test", timeout_s=5)


def assert_readable(message: str) -> None:
    assert not any(word in message for word in LIBRARY_WORDS), message
    assert "Traceback" not in message and "\n" not in message, message


@pytest.mark.parametrize(
    ("responses", "says", "status", "retryable"),
    [
        pytest.param(
            [error(500, "The upstream model crashed.")] * 3,
            ["server error", "The upstream model crashed.", "try again"],
            500,
            True,
            id="server-error",
        ),
        pytest.param(
            [error(503, "The engine is currently overloaded.", type="server_error")] * 3,
            ["server error", "overloaded"],
            503,
            True,
            id="unavailable",
        ),
        pytest.param(
            [error(400, "'messages' must contain the word 'json'.", type="invalid_request_error")],
            ["refused the request", "'messages' must contain the word 'json'."],
            400,
            False,
            id="bad-request",
        ),
        pytest.param(
            [
                error(
                    400,
                    "This model's maximum context length is 8192 tokens. However, your messages resulted in 9000 "
                    "tokens. Please reduce the length of the messages.",
                    type="invalid_request_error",
                    code="context_length_exceeded",
                )
            ],
            ["too long", "start a new chat"],
            400,
            False,
            id="context-too-long",
        ),
        pytest.param(
            [
                error(
                    400,
                    "Invalid prompt: your prompt was flagged as potentially violating our usage policy.",
                    type="invalid_request_error",
                    code="invalid_prompt",
                )
            ],
            ["content filter", "rephrase"],
            400,
            False,
            id="content-filtered",
        ),
        pytest.param(
            [
                error(
                    404, "The model `test-model` does not exist.", type="invalid_request_error", code="model_not_found"
                )
            ],
            ["was not found", "check the model name"],
            404,
            False,
            id="model-not-found",
        ),
        pytest.param(
            [error(429, "Rate limit reached for requests.", type="requests", code="rate_limit_exceeded")] * 3,
            ["rate limited"],
            429,
            True,
            id="rate-limited",
        ),
    ],
)
async def test_a_provider_failure_reads_as_a_sentence(
    real: LLMGateway,
    openai_server: OpenAIServer,  # noqa: F811
    caplog: pytest.LogCaptureFixture,
    responses: list,
    says: list[str],
    status: int,
    retryable: bool,
) -> None:
    openai_server.script(*responses)
    with caplog.at_level(logging.WARNING, logger="core.chat.llm"):
        events, exc = await collect_until_error(real.stream(REAL, user("hi")))
    assert events == []
    assert_readable(exc.message)
    assert all(part in exc.message for part in says), exc.message
    assert REAL in exc.message
    assert (exc.status_code, exc.retryable) == (status, retryable)
    assert not isinstance(exc, LLMTimeoutError)
    assert any("litellm" in r.getMessage() for r in caplog.records)  # the library's own words: in the log


async def test_a_stream_cut_off_midway_says_the_answer_was_cut_off(
    real: LLMGateway,
    openai_server: OpenAIServer,  # noqa: F811
) -> None:
    openai_server.script(broken(["Partial ", "answer"]))
    events, exc = await collect_until_error(real.stream(REAL, user("hi")), timeout=4)
    assert [e.text for e in events] == ["Partial ", "answer"]
    assert_readable(exc.message)
    assert "lost before its answer ended" in exc.message and exc.retryable


async def test_a_server_that_is_not_there_says_where_to_look() -> None:
    gateway = LLMGateway(api_base=f"http://127.0.0.1:{free_port()}/v1", api_key="sk-test", timeout_s=5)
    events, exc = await collect_until_error(gateway.stream(REAL, user("hi")), timeout=30)
    assert events == []
    assert_readable(exc.message)
    assert "Cannot reach the model" in exc.message and "base URL" in exc.message


async def test_the_sentence_is_in_the_readers_language(
    real: LLMGateway,
    openai_server: OpenAIServer,  # noqa: F811
) -> None:
    openai_server.script(*[error(500, "The upstream model crashed.")] * 3)
    with use_language("zh-CN"):
        _, exc = await collect_until_error(real.stream(REAL, user("hi")))
    assert exc.message.startswith("模型 openai/test-model 的提供方发生服务器错误"), exc.message
