"""The offline demo model as a model provider (`local/...`): its stream, paced as a provider's.

What the demo model says is `core.chat.demo_model`'s; this is how it streams. `demo_chunks` gives
LiteLLM's generic streaming chunks, paced like a provider's; `make_demo_handler` wraps them in the
LiteLLM `CustomLLM` that `core.chat.llm` registers under `local/` (built from the litellm module
given: this module imports no litellm itself), so a demo turn goes through the same LiteLLM path as
a real provider. Only while LiteLLM is still being imported after a start (3-5 s, in a worker
thread: docs/ARCHITECTURE.md "Lazy imports that keep start-up fast") does the gateway read the
chunks itself (`demo_stream`), so the first demo turn after a start does not wait for that import.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

from core.chat import demo_model

#: Without a delay, the demo model lets the event loop run at least this often.
_ZERO_DELAY_SLICE_S = 0.002


async def demo_chunks(
    messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None, delay: float
) -> AsyncIterator[dict[str, Any]]:
    """The demo model's reply to `messages` as LiteLLM `GenericStreamingChunk`s, `delay` s apart.

    Text tokens, then each tool call in two fragments, then a last chunk with the finish reason and
    the usage (words: the prompt's, and the ones sent).

    Raises:
        demo_model.DemoModelError: the reply asks for a failure (`/fail`, `/error`).
    """
    reply = demo_model.plan_reply(messages, tools)
    delay = reply.delay_s if reply.delay_s is not None else delay
    pace = _Pace(delay)
    loop = asyncio.get_running_loop()
    ran_since = loop.time()
    emitted = 0
    for token in reply.tokens:
        if reply.fail_after_tokens is not None and emitted >= reply.fail_after_tokens:
            raise demo_model.DemoModelError(f"failure requested after {emitted} words (/fail, /error)")
        if delay:
            await pace.next()
        elif loop.time() - ran_since >= _ZERO_DELAY_SLICE_S:
            # A provider's next chunk is a network read that lets the event loop run; without a
            # delay the demo model has none, and a long reply would hold the loop to its end
            # (118 ms for 2,000 words). It lets the loop run every few ms instead: a pass per
            # chunk would cost every burst its batching (one SSE write per event).
            await asyncio.sleep(0)
            ran_since = loop.time()
        emitted += 1
        yield _chunk(text=token)
    if reply.hang:
        await asyncio.Event().wait()  # until the turn is canceled (/hang)
    for index, call in enumerate(reply.tool_calls):
        if delay:
            await asyncio.sleep(delay)
        # The id must be on the first fragment, or stream_chunk_builder drops the call.
        half = len(call.arguments) // 2
        yield _chunk(
            tool_use={
                "id": call.id,
                "type": "function",
                "index": index,
                "function": {"name": call.name, "arguments": call.arguments[:half]},
            }
        )
        yield _chunk(
            tool_use={
                "id": None,
                "type": "function",
                "index": index,
                "function": {"name": None, "arguments": call.arguments[half:]},
            }
        )
        emitted += 1
    yield _chunk(
        finished=True,
        finish_reason=reply.finish_reason,
        usage={
            "prompt_tokens": reply.prompt_tokens,
            "completion_tokens": emitted,
            "total_tokens": reply.prompt_tokens + emitted,
        },
    )


@dataclass(frozen=True, slots=True)
class DemoEnd:
    """The end of a demo reply read without LiteLLM: what LiteLLM's stream would have summed up."""

    text: str
    tool_calls: list[tuple[str | None, str | None, str]]  # (id, name, arguments), in index order
    prompt_tokens: int
    completion_tokens: int
    finish_reason: str


async def demo_stream(
    messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None, delay: float
) -> AsyncIterator[str | DemoEnd]:
    """`demo_chunks` read as LiteLLM passes them on: each text piece, then one `DemoEnd`.

    Raises:
        demo_model.DemoModelError: the reply asks for a failure (`/fail`, `/error`).
    """
    text: list[str] = []
    calls: dict[int, list[Any]] = {}  # index -> [id, name, argument pieces]: the last id and name win
    finish_reason, usage = "stop", dict[str, Any]()
    async for chunk in demo_chunks(messages, tools, delay):
        if chunk["text"]:
            text.append(chunk["text"])
            yield chunk["text"]
        fragment = chunk["tool_use"]
        if fragment is not None:
            call = calls.setdefault(fragment["index"], [None, None, []])
            call[0] = fragment["id"] or call[0]
            call[1] = fragment["function"]["name"] or call[1]
            call[2].append(fragment["function"]["arguments"] or "")
        if chunk["is_finished"]:
            finish_reason, usage = chunk["finish_reason"] or "stop", chunk["usage"] or {}
    yield DemoEnd(
        "".join(text),
        [(i, n, "".join(pieces)) for i, n, pieces in calls.values()],
        usage.get("prompt_tokens", 0),
        usage.get("completion_tokens", 0),
        finish_reason,
    )


def demo_delay(api_base: str | None) -> float:
    """The delay a gateway passes through `api_base` ("demo://delay=0.03"), else 0.

    One provider object serves every gateway in the process, each with its own delay.
    """
    if api_base and api_base.startswith("demo://delay="):
        try:
            return max(0.0, float(api_base.removeprefix("demo://delay=")))
        except ValueError:
            return 0.0
    return 0.0


def make_demo_handler(litellm: Any) -> Any:
    """Build the `local/` provider; built here, once litellm is imported, because it subclasses its CustomLLM."""

    class LocalDemoLLM(litellm.CustomLLM):  # type: ignore[misc]  # litellm has no type information here
        """The offline demo model as a LiteLLM provider (streaming only, plus a non-stream fallback)."""

        async def astreaming(
            self,
            model: str,
            messages: list[dict[str, Any]],
            api_base: str | None,
            custom_prompt_dict: dict[str, Any],
            model_response: Any,
            print_verbose: Any,
            encoding: Any,
            api_key: str | None,
            logging_obj: Any,
            optional_params: dict[str, Any],
            **kwargs: Any,
        ) -> AsyncIterator[dict[str, Any]]:  # noqa: D102
            async for chunk in demo_chunks(messages, optional_params.get("tools"), demo_delay(api_base)):
                yield chunk

        async def acompletion(
            self,
            model: str,
            messages: list[dict[str, Any]],
            api_base: str | None,
            custom_prompt_dict: dict[str, Any],
            model_response: Any,
            print_verbose: Any,
            encoding: Any,
            api_key: str | None,
            logging_obj: Any,
            optional_params: dict[str, Any],
            **kwargs: Any,
        ) -> Any:  # noqa: D102
            reply = demo_model.plan_reply(messages, optional_params.get("tools"))
            return litellm.completion(model="openai/demo", messages=messages, mock_response="".join(reply.tokens))

    return LocalDemoLLM()


class _Pace:
    """The demo model's clock: token k is due `k * delay` after the first, as a provider sends them.

    A provider produces tokens on its own clock; when the app is late to read one, the next is
    already there. Sleeping `delay` after each token instead would slow a stream down whenever the
    event loop is busy, and would line up the streams that were late together, so they all come
    due in the same loop iteration from then on (100 streams at 50 tokens/s: every 20 ms, one
    iteration doing the work of all of them). A token that is due already is read at once, as a
    network read finds the chunks that came while the app was busy in its buffer: a late reader
    then gets the tokens it missed in one step (which the A2A stream joins into one update), so a
    loaded event loop does less per token instead of one pass per token. A stream more than
    `_MAX_DEBT` tokens behind starts its clock again rather than sending the debt in one burst.
    """

    _MAX_DEBT = 5

    def __init__(self, delay: float) -> None:
        self.delay = delay
        self.due: float | None = None

    async def next(self) -> None:
        """Wait until the next token is due; a token that is due already is there at once, without a wait."""
        now = asyncio.get_running_loop().time()
        self.due = (now if self.due is None else self.due) + self.delay
        if now - self.due > self._MAX_DEBT * self.delay:
            self.due = now
        if self.due > now:
            await asyncio.sleep(self.due - now)


def _chunk(
    *,
    text: str = "",
    tool_use: dict[str, Any] | None = None,
    finished: bool = False,
    finish_reason: str = "",
    usage: dict[str, Any] | None = None,
) -> dict[str, Any]:
    return {
        "text": text,
        "tool_use": tool_use,
        "is_finished": finished,
        "finish_reason": finish_reason,
        "usage": usage,
        "index": 0,
    }
