"""The LLM gateway: every model call goes through LiteLLM, streaming, with tool calls.

This is the only module that imports litellm. Its import takes 3-5 s, so it is imported on first use (or by
`warm_up()` in a worker thread after start-up), never on the path to the first page.

The offline demo model is a LiteLLM `CustomLLM` registered under the `local/` prefix (`local/demo`,
`core/chat/demo_provider.py`); what it says is decided in `core/chat/demo_model.py`. While LiteLLM is still
being imported after a start, the demo model's stream is read directly, so the first demo turn does not wait
seconds for that import. Any other model string goes to LiteLLM's own providers (`openai/gpt-4o-mini`,
`anthropic/...`, ...); `LLM_API_BASE`/`LLM_API_KEY` point `openai/...` models at any OpenAI-compatible
server. Which key goes to which base URL is `core.chat.model_route`'s rule; the base URL is checked against
the outbound policy (`core.web.outbound_policy`) before every call (docs/ARCHITECTURE.md, "Model endpoints
and keys"). A call's set-up skips LiteLLM's per-call work the app does not use (`core.chat.llm_setup`).
"""

from __future__ import annotations

import asyncio
import logging
import os
import re
import threading
from collections.abc import AsyncIterator
from contextlib import aclosing
from typing import Any

import httpx

from core import tracing
from core.chat import demo_model, openai_wire
from core.chat.demo_provider import DemoEnd, demo_stream, make_demo_handler
from core.chat.llm_setup import install_quiet_metadata, quiet_call
from core.chat.llm_stream import (
    LLMEvent,
    ModelResult,
    StreamAssembly,
    TextDelta,
    ToolCall,
    Usage,
    compact_kept_chunks,
    read_through_wrapper,
)
from core.chat.model_route import ModelRoute, RouteRefusedError, model_route
from core.chat.prices import priced
from core.errors import AppError
from core.i18n import _
from core.web.outbound_policy import OPERATOR_CONFIGURED, AllowList, url_refusal

# The stream's types live in core.chat.llm_stream; they are named here too, where callers have always found them.
__all__ = [
    "DEMO_PROVIDER",
    "LLMError",
    "LLMEvent",
    "LLMGateway",
    "LLMTimeoutError",
    "ModelResult",
    "StreamAssembly",
    "TextDelta",
    "ToolCall",
    "Usage",
    "compact_kept_chunks",
    "litellm_module",
    "model_problem",
    "provider_of",
    "warm_up",
]

log = logging.getLogger(__name__)

DEMO_PROVIDER = "local"
_import_lock = threading.Lock()
_litellm: Any = None


class LLMError(AppError):
    """A model call failed; `message` is meant for the person using the app."""

    code = "llm_error"

    def __init__(self, message: str, *, status_code: int | None = None, retryable: bool = False) -> None:
        super().__init__(message)
        self.message = message
        self.status_code = status_code
        self.retryable = retryable


class LLMTimeoutError(LLMError):
    """The model sent nothing for longer than the configured timeout."""

    code = "llm_timeout"


def litellm_module() -> Any:
    """Import litellm once, offline-safe, with the demo provider registered."""
    global _litellm
    if _litellm is not None:
        return _litellm
    with _import_lock:
        if _litellm is None:
            # Without this litellm fetches a price list from the internet at import.
            os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")
            os.environ.setdefault("LITELLM_LOG", "WARNING")
            import litellm

            for name in ("LiteLLM", "LiteLLM Router", "LiteLLM Proxy"):
                logging.getLogger(name).setLevel(logging.WARNING)

            litellm.suppress_debug_info = True
            litellm.drop_params = True
            litellm.custom_provider_map = [
                *[p for p in (litellm.custom_provider_map or []) if p.get("provider") != DEMO_PROVIDER],
                {"provider": DEMO_PROVIDER, "custom_handler": make_demo_handler(litellm)},
            ]
            install_quiet_metadata(litellm)
            _litellm = litellm
    return _litellm


def warm_up() -> None:
    """Import litellm in a daemon thread so the first chat turn does not wait for it."""
    threading.Thread(target=litellm_module, name="litellm-import", daemon=True).start()


class LLMGateway:
    """Streams chat completions through LiteLLM.

    Args:
        demo_delay_s: pause between the demo model's tokens.
        api_base: OpenAI-compatible base URL for non-demo models (optional).
        api_key: key for that server, or for `openai/...` models (optional; providers also read their own env vars).
        timeout_s: longest wait for the next chunk (LiteLLM's per-read timeout).
        allow: the hosts and networks an agent's own `apiBase` may be on although not public
            (`OUTBOUND_ALLOW_HOSTS`).
    """

    def __init__(
        self,
        *,
        demo_delay_s: float = 0.03,
        api_base: str | None = None,
        api_key: str | None = None,
        timeout_s: float = 60.0,
        allow: AllowList | None = None,
    ) -> None:
        self.demo_delay_s = demo_delay_s
        self.api_base = api_base
        self.api_key = api_key
        self.timeout_s = timeout_s
        self.allow = allow or AllowList()

    async def route(self, model: str, *, api_base: str | None = None, api_key: str | None = None) -> ModelRoute:
        """Where a call of `model` with an agent's `api_base`/`api_key` goes, and with which key; its base URL checked.

        Raises:
            LLMError: the call would send a credential where it does not belong, or its base URL is not allowed
                (a private or loopback address not in OUTBOUND_ALLOW_HOSTS; a cloud metadata address, always).
        """
        litellm = await _ensure_litellm()
        try:
            route = model_route(
                provider=_provider(litellm, model),
                agent_base=api_base,
                agent_key=api_key,
                global_base=self.api_base,
                global_key=self.api_key,
            )
        except RouteRefusedError as exc:
            raise LLMError(f"The model {model!r} cannot be called: {exc}.") from None
        if route.endpoint != "provider" and route.api_base:
            problem = await self.endpoint_problem(route.api_base, operator=route.endpoint == "operator")
            if problem is not None:
                raise LLMError(f"The model {model!r} is not called at {route.api_base}: {problem}.")
        return route

    async def api_base_problem(self, model: str, api_base: str) -> str | None:
        """Why an agent of `model` may not have `api_base` (the model's provider, or the address), or None."""
        try:
            model_route(
                provider=_provider(await _ensure_litellm(), model),
                agent_base=api_base,
                agent_key=None,
                global_base=None,
                global_key=None,
            )
        except RouteRefusedError as exc:
            return str(exc)
        return await self.endpoint_problem(api_base)

    async def endpoint_problem(self, api_base: str, *, operator: bool = False) -> str | None:
        """Why a model may not be called at `api_base` ("not allowed: a loopback address; ..."), or None.

        An agent's `apiBase` is held to the outbound policy with `OUTBOUND_ALLOW_HOSTS`; the operator's
        `LLM_API_BASE` may be any address but a cloud metadata one.
        """
        refusal = await url_refusal(api_base, OPERATOR_CONFIGURED if operator else self.allow)
        if refusal is None or operator or "metadata" in refusal or not refusal.startswith("not allowed"):
            return refusal
        host = httpx.URL(api_base).host
        return f"{refusal} (an operator can allow it with OUTBOUND_ALLOW_HOSTS={host})"

    async def stream(
        self,
        model: str,
        messages: list[dict[str, Any]],
        *,
        tools: list[dict[str, Any]] | None = None,
        max_tokens: int | None = None,
        api_base: str | None = None,
        api_key: str | None = None,
        temperature: float | None = None,
    ) -> AsyncIterator[LLMEvent]:
        """Yield `TextDelta`s as they come, then one `ModelResult`.

        `api_base`/`api_key` are an agent's own: which key goes where is `route` (`core.chat.model_route`);
        a model string LiteLLM does not know goes to that base URL as an OpenAI-compatible server.

        Raises:
            LLMError: the provider refused or failed (mid-stream failures included), or `route` refused the call.
            LLMTimeoutError: nothing arrived within `timeout_s`.
        """
        if _litellm is None and model.startswith(f"{DEMO_PROVIDER}/"):
            # LiteLLM is still being imported (the first turns after a start): the demo model needs none of it.
            demo_span = tracing.start_span(
                "llm.call", kind=tracing.SpanKind.CLIENT, attributes={"gen_ai.request.model": model}
            )
            try:
                async for event in _demo_without_litellm(model, messages, tools, self.demo_delay_s):
                    yield event
            finally:
                demo_span.end()
            return
        litellm = await _ensure_litellm()
        kwargs: dict[str, Any] = {
            "model": model,
            "messages": messages,
            "stream": True,
            "timeout": self.timeout_s,
            "stream_options": {"include_usage": True},
        }
        if tools:
            kwargs["tools"] = tools
        if max_tokens:
            kwargs["max_tokens"] = max_tokens
        if temperature is not None:
            kwargs["temperature"] = temperature
        setup_on_loop = False  # LiteLLM's set-up on the event loop, not a thread (core/chat/llm_setup.py)
        if model.startswith(f"{DEMO_PROVIDER}/"):
            kwargs["api_base"] = f"demo://delay={self.demo_delay_s}"
        else:
            route = await self.route(model, api_base=api_base, api_key=api_key)
            provider = route.custom_llm_provider or _provider(litellm, model)
            setup_on_loop = bool(route.api_key) and provider in openai_wire.FAST_PROVIDERS
            if route.api_base:
                kwargs["api_base"] = route.api_base
            if route.api_key:
                kwargs["api_key"] = route.api_key
            if route.custom_llm_provider:
                kwargs["custom_llm_provider"] = route.custom_llm_provider

        assembly = StreamAssembly(model)
        streamed = False
        # Not made current: an async generator may not hold a context across its yields (core/tracing.py).
        call_span = tracing.start_span(
            "llm.call", kind=tracing.SpanKind.CLIENT, attributes={"gen_ai.request.model": model}
        )
        try:
            with quiet_call(litellm, setup_on_loop=setup_on_loop):
                response = await litellm.acompletion(**kwargs)
            if hasattr(response, "_emitted_disqualifying_content"):
                # LiteLLM checks every delta for eight fields (a pydantic attribute miss each) to decide
                # whether its Router may continue this stream on another model after a failure; the
                # gateway has no Router and no fallback, so the check is switched off. (Private to
                # litellm==1.110.2, which is pinned; without the attribute nothing changes.)
                response._emitted_disqualifying_content = True
            raw = openai_wire.raw_response(response)
            if raw is not None:  # an OpenAI-shaped wire: its chunks read as plain JSON (core/chat/openai_wire.py)
                wire = openai_wire.WireStream(raw, repeat_limit=litellm.REPEATED_STREAMING_CHUNK_LIMIT)
                try:
                    async for text in wire.texts():
                        streamed = True
                        yield TextDelta(text)
                finally:
                    await raw.aclose()
                result = await openai_wire.wire_result(
                    wire,
                    model=model,
                    count_tokens=litellm.token_counter,
                    counted_as=str(getattr(response, "model", None) or model),
                    messages=messages,
                    map_finish_reason=_map_finish_reason,
                    tool_call_json=_tool_call_json,
                )
            else:
                async with aclosing(read_through_wrapper(response, assembly)) as texts:
                    async for text in texts:
                        streamed = True
                        yield TextDelta(text)
                result = assembly.result()
            result = priced(litellm, result)
            call_span.set_attributes(
                {
                    "gen_ai.usage.input_tokens": result.usage.input_tokens,
                    "gen_ai.usage.output_tokens": result.usage.output_tokens,
                    "gen_ai.response.finish_reasons": [result.finish_reason],
                }
            )
        except asyncio.CancelledError:
            call_span.set_attribute("cancelled", True)
            raise
        except Exception as exc:  # litellm raises many types; the UI sees one
            call_span.set_status(tracing.Status(tracing.StatusCode.ERROR, type(exc).__name__))
            raise _as_llm_error(litellm, exc, model, streamed=streamed) from exc
        finally:
            call_span.end()  # the stream's end, its failure, or the reader's leaving (GeneratorExit)
        yield result


def _map_finish_reason(reason: str) -> str:
    from litellm.litellm_core_utils.core_helpers import map_finish_reason

    return str(map_finish_reason(reason))


def _tool_call_json(call: ToolCall) -> str:
    """A tool call as LiteLLM writes it when it counts a reply's tokens itself."""
    from litellm.types.utils import ChatCompletionMessageToolCall, Function

    function = Function(name=call.name, arguments=call.arguments)
    return str(ChatCompletionMessageToolCall(id=call.id, type="function", function=function).model_dump_json())


async def provider_of(model: str) -> str | None:
    """LiteLLM's provider of `model` (`openai`, `anthropic`, `local` for the demo model), or None if unknown."""
    return _provider(await _ensure_litellm(), model)


async def model_problem(model: str, *, api_base: str | None = None) -> str | None:
    """Why `model` cannot be used, or None.

    LiteLLM must know it (its own provider detection), unless it has an `api_base` (then it is sent
    to that OpenAI-compatible server). The demo model is always known.
    """
    if not model.strip():
        return "a model is needed (local/demo is the offline demo model)"
    if model.startswith(f"{DEMO_PROVIDER}/") or api_base:
        return None
    if _provider(await _ensure_litellm(), model) is not None:
        return None
    return (
        f"LiteLLM does not know the model {model!r}: write it as provider/model (for example "
        "openai/gpt-4o-mini or anthropic/claude-3-5-haiku-latest), or give an apiBase of an OpenAI-compatible "
        "server"
    )


def _provider(litellm: Any, model: str) -> str | None:
    """LiteLLM's provider of `model` (its own detection, no base URL or key given), or None when it cannot tell."""
    try:
        provider = litellm.get_llm_provider(model)[1]
    except Exception:  # litellm raises BadRequestError (and others) for a provider it cannot tell
        return None
    return provider if isinstance(provider, str) else None


async def _demo_without_litellm(
    model: str, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None, delay: float
) -> AsyncIterator[LLMEvent]:
    """The demo model's events while LiteLLM is still being imported.

    tests/test_first_turn.py checks they are the ones LiteLLM gives (docs/ARCHITECTURE.md "Lazy imports that
    keep start-up fast").
    """
    try:
        async for piece in demo_stream(messages, tools, delay):
            if isinstance(piece, DemoEnd):
                yield ModelResult(
                    text=piece.text,
                    tool_calls=[
                        ToolCall(id=call_id or f"call_{i}", name=name or "", arguments=arguments)
                        for i, (call_id, name, arguments) in enumerate(piece.tool_calls)
                    ],
                    usage=Usage(piece.prompt_tokens, piece.completion_tokens),
                    finish_reason=piece.finish_reason,
                    model=model,
                )
            else:
                yield TextDelta(piece)
    except demo_model.DemoModelError as exc:
        raise LLMError(_("The demo model failed: {reason}").format(reason=exc)) from exc


async def _ensure_litellm() -> Any:
    if _litellm is not None:
        return _litellm
    return await asyncio.to_thread(litellm_module)


def _as_llm_error(litellm: Any, exc: Exception, model: str, *, streamed: bool = False) -> LLMError:
    """What a person reads for a failed model call; LiteLLM's own text goes to the log only.

    `streamed`: part of the answer had arrived (a connection lost then is a cut-off answer).
    """
    original = getattr(exc, "original_exception", None) or exc
    demo_failure = _find_in_chain(exc, demo_model.DemoModelError)
    if demo_failure is not None:
        return LLMError(_("The demo model failed: {reason}").format(reason=demo_failure))
    log.warning("the call to model %s failed: %s", model, _short(exc))
    if isinstance(exc, litellm.Timeout) or isinstance(original, TimeoutError | httpx.TimeoutException):
        return LLMTimeoutError(
            _("The model {model} sent nothing for too long; try again, or raise LLM_TIMEOUT_S.").format(model=model)
        )
    status = getattr(exc, "status_code", None)
    detail = _provider_detail(exc)
    if isinstance(exc, litellm.AuthenticationError):
        message = _("The model {model} rejected the API key; check the agent's API key (or LLM_API_KEY).")
        return LLMError(message.format(model=model), status_code=status)
    if isinstance(exc, litellm.PermissionDeniedError):
        message = _("The model {model} may not be used with this API key (its provider said no).")
        return LLMError(message.format(model=model), status_code=status)
    if isinstance(exc, litellm.NotFoundError):
        message = _("The model {model} was not found at its provider; check the model name.")
        return LLMError(message.format(model=model), status_code=status)
    if isinstance(exc, litellm.ContextWindowExceededError):
        message = _(
            "This conversation is too long for the model {model}: start a new chat, or use a model with a "
            "longer context."
        )
        return LLMError(message.format(model=model), status_code=status)
    if isinstance(exc, litellm.ContentPolicyViolationError):
        message = _("The provider of the model {model} refused this content (its content filter); rephrase it.")
        return LLMError(message.format(model=model), status_code=status)
    if isinstance(exc, litellm.BadRequestError):
        message = _("The model {model} refused the request: {reason}")
        return LLMError(message.format(model=model, reason=detail), status_code=status)
    if isinstance(exc, litellm.RateLimitError):
        message = _("The model {model} is rate limited; try again shortly.")
        return LLMError(message.format(model=model), status_code=status, retryable=True)
    if _lost_connection(exc):  # LiteLLM may call it a server error, or a failed mid-stream fallback
        message = (
            _("The connection to the model {model} was lost before its answer ended; try again.")
            if streamed
            else _("Cannot reach the model {model}; check its base URL, or try again shortly.")
        )
        return LLMError(message.format(model=model), status_code=status, retryable=True)
    if isinstance(exc, litellm.InternalServerError | litellm.ServiceUnavailableError) or (status or 0) >= 500:
        message = _("The provider of the model {model} had a server error ({reason}); try again shortly.")
        return LLMError(message.format(model=model, reason=detail), status_code=status, retryable=True)
    message = _("The model {model} failed: {reason}")
    return LLMError(message.format(model=model, reason=detail), status_code=status)


def _lost_connection(exc: BaseException) -> bool:
    """True when the call failed for want of a connection (refused, reset, cut mid-stream), whatever its name."""
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        names = {cls.__name__ for cls in type(current).__mro__}
        if "APIConnectionError" in names or isinstance(current, httpx.TransportError | ConnectionError):
            return True
        seen.add(id(current))
        current = getattr(current, "original_exception", None) or current.__cause__ or current.__context__
    return False


# LiteLLM's own words before the provider's: "litellm.BadRequestError: OpenAIException - ", "InternalServerError: ".
_LIBRARY_PREFIX = re.compile(r"^(?:(?:litellm\.)?\w+(?:Error|Exception)(?::\s*|\s+-\s+))+")


def _provider_detail(exc: BaseException) -> str:
    """The provider's own message (its error body's first line), without LiteLLM's class names before it."""
    message = getattr(exc, "message", None)
    text = _short_text(str(message if isinstance(message, str) and message else exc))
    stripped = _LIBRARY_PREFIX.sub("", text).strip()
    if stripped.startswith("{") or not stripped:  # a raw error body: nothing a person reads
        status = getattr(exc, "status_code", None)
        return _("HTTP {status}").format(status=status) if status else _("no reason given")
    return stripped


def _find_in_chain(exc: BaseException, kind: type[BaseException]) -> BaseException | None:
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        if isinstance(current, kind):
            return current
        seen.add(id(current))
        current = getattr(current, "original_exception", None) or current.__cause__ or current.__context__
    return None


def _short(exc: BaseException, limit: int = 300) -> str:
    # litellm appends a formatted traceback to some messages; a person needs the first line.
    return _short_text(str(exc), limit) or type(exc).__name__


def _short_text(text: str, limit: int = 300) -> str:
    line = (text.strip().splitlines() or [""])[0]
    return line if len(line) <= limit else line[: limit - 1] + "…"
