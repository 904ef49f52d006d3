"""What a model's stream is made of, and how LiteLLM's chunks are assembled into it as they pass.

The gateway (`core.chat.llm`) yields `TextDelta`s and one `ModelResult`; this module holds those types and
the per-chunk work of the hot path (docs/ARCHITECTURE.md, "The streaming hot path"): `StreamAssembly`
gathers the end of a call a chunk at a time, and `compact_kept_chunks` folds the chunks LiteLLM keeps.
It imports nothing of litellm: the chunks are read duck-typed.
"""

from __future__ import annotations

import json
from collections.abc import AsyncGenerator
from dataclasses import dataclass, field
from typing import Any

__all__ = [
    "COMPACT_AT",
    "LLMEvent",
    "ModelResult",
    "StreamAssembly",
    "TextDelta",
    "ToolCall",
    "Usage",
    "compact_kept_chunks",
    "read_through_wrapper",
]


@dataclass(frozen=True, slots=True)
class TextDelta:
    """A piece of the reply text."""

    text: str


@dataclass(frozen=True, slots=True)
class ToolCall:
    """A complete tool call; `arguments` is the raw JSON text the model produced."""

    id: str
    name: str
    arguments: str

    def parsed_arguments(self) -> Any:
        """The arguments decoded from JSON.

        Raises:
            ValueError: the model produced text that is not JSON.
        """
        try:
            return json.loads(self.arguments or "{}")
        except json.JSONDecodeError as exc:
            raise ValueError(f"tool arguments are not valid JSON: {exc.msg} at position {exc.pos}") from exc


@dataclass(frozen=True, slots=True)
class Usage:
    """Token counts of one model call, and its price where LiteLLM's price list has the model (US dollars)."""

    input_tokens: int = 0
    output_tokens: int = 0
    cost_usd: float | None = None


@dataclass(frozen=True, slots=True)
class ModelResult:
    """The end of one model call: the full text, its tool calls and usage."""

    text: str
    tool_calls: list[ToolCall] = field(default_factory=list)
    usage: Usage = Usage()
    finish_reason: str = "stop"
    model: str = ""


LLMEvent = TextDelta | ModelResult


#: LiteLLM's list of a stream's chunks is folded whenever it holds this many (see `compact_kept_chunks`).
COMPACT_AT = 16


def compact_kept_chunks(chunks: list[Any]) -> None:
    """Fold the plain text chunks LiteLLM keeps of a running stream into one, in place.

    LiteLLM keeps every chunk of a stream (about a dozen garbage-collected objects each) until
    the stream ends, only to count usage at the end. A hundred streams of a few hundred tokens
    are then 100,000+ live objects, and each full garbage collection walks them all on the
    event loop: 50-100 ms in which no stream moves (docs/ARCHITECTURE.md, "The streaming hot
    path"). What its usage count reads of a plain text chunk is the text, so those chunks are
    folded into the first of them (its text becomes the text of all of them, in order); every
    other chunk (the first one, tool calls, finish reasons, usage, anything unusual) and the
    last two (LiteLLM compares them to detect a model repeating itself) stay as they are.
    """
    carrier: Any = None
    folded: list[str] = []
    kept = [chunks[0]]
    for chunk in chunks[1:-2]:
        text = _plain_text(chunk)
        if text is None:
            kept.append(chunk)
        elif carrier is None:
            carrier = chunk
            folded.append(text)
            kept.append(chunk)
        else:
            folded.append(text)
    if len(folded) > 1:  # one assignment: pydantic's __setattr__ is the costly part of a fold
        _field(carrier.choices[0], "delta").content = "".join(folded)
    kept.extend(chunks[-2:])
    chunks[:] = kept


def _plain_text(chunk: Any) -> str | None:
    """The text of a chunk that carries nothing but text, else None."""
    choices = chunk.choices
    if _field(chunk, "usage") is not None or len(choices) != 1:
        return None
    choice = choices[0]
    delta = _field(choice, "delta")
    if _field(choice, "finish_reason") or delta is None:
        return None
    content = _field(delta, "content")
    if (
        not isinstance(content, str)
        or _field(delta, "tool_calls")
        or _field(delta, "function_call")
        or _field(delta, "reasoning_content")
    ):
        return None
    return content


def _field(obj: Any, name: str) -> Any:
    """`getattr(obj, name, None)` for LiteLLM's pydantic objects, without the cost of a miss.

    LiteLLM keeps most of a chunk's fields as pydantic extras and deletes the optional ones
    that are unset; a plain `getattr` of one that is absent (`usage` on every chunk but the
    last) goes through pydantic's `__getattr__` and an exception: about 5 µs, per chunk, per
    field. (The names read here are all extras or declared fields in litellm==1.110.2.)
    """
    extra = getattr(obj, "__pydantic_extra__", None)
    if extra is None:  # not one of LiteLLM's models with extras: ask it the usual way
        return getattr(obj, name, None)
    if name in extra:
        return extra[name]
    return obj.__dict__.get(name)  # a declared field, or nothing (litellm deletes unset optional fields)


class StreamAssembly:
    """The end of a streamed call (text, tool calls, finish reason, usage), built from the chunks as they pass.

    What `litellm.stream_chunk_builder` would rebuild from the whole list of chunks at the end, in
    one blocking pass (tens of ms for a long reply, on the event loop), is gathered here a chunk
    at a time for the cost of a few attribute reads (docs/ARCHITECTURE.md, "The streaming hot
    path"). Tool calls are keyed by their `index`, as the builder keys them: the last id and
    name a fragment carries win, argument pieces are joined in order; a call that never got an
    id is kept under `call_<n>` (the builder drops it). Usage is the last one a chunk carried:
    with `stream_options.include_usage` LiteLLM ends every stream with a usage chunk (the
    provider's figures, or its own count when the provider sent none).
    """

    __slots__ = ("model", "_text", "_calls", "_finish_reason", "_usage", "has_final_usage")

    def __init__(self, model: str) -> None:
        self.model = model
        self._text: list[str] = []
        self._calls: dict[Any, list[Any]] = {}  # index -> [id, name, argument pieces]
        self._finish_reason: str | None = None
        self._usage: Any = None
        #: The usage-only chunk that ends a stream asked for `include_usage` has come: nothing follows it.
        self.has_final_usage = False

    def add(self, chunk: Any) -> str | None:
        """Take one chunk into account; returns its text, if it has any."""
        usage = _field(chunk, "usage")
        if usage is not None:
            self._usage = usage
        choices = chunk.choices
        if not choices:
            self.has_final_usage = usage is not None
            return None
        choice = choices[0]
        finish_reason = _field(choice, "finish_reason")
        if finish_reason:
            self._finish_reason = finish_reason
        delta = _field(choice, "delta")
        if delta is None:
            return None
        tool_calls = _field(delta, "tool_calls")
        if tool_calls:
            for fragment in tool_calls:
                self._add_call_fragment(fragment)
        content: str | None = _field(delta, "content")  # a string in LiteLLM's deltas
        if content:
            self._text.append(content)
            return content
        return None

    def _add_call_fragment(self, fragment: Any) -> None:
        function = getattr(fragment, "function", None)
        if function is None:
            return
        index = getattr(fragment, "index", 0)
        call = self._calls.get(index)
        if call is None:
            call = self._calls[index] = [None, None, []]
        if fragment.id:
            call[0] = fragment.id
        if function.name:
            call[1] = function.name
        if function.arguments:
            call[2].append(function.arguments)

    def result(self) -> ModelResult:
        """The `ModelResult` of everything added."""
        usage = self._usage
        return ModelResult(
            text="".join(self._text),
            tool_calls=[
                ToolCall(id=call_id or f"call_{i}", name=name or "", arguments="".join(pieces))
                for i, (call_id, name, pieces) in enumerate(self._calls.values())
            ],
            usage=Usage(
                input_tokens=getattr(usage, "prompt_tokens", 0) or 0,
                output_tokens=getattr(usage, "completion_tokens", 0) or 0,
            ),
            finish_reason=self._finish_reason or "stop",
            model=self.model,
        )


async def read_through_wrapper(response: Any, assembly: StreamAssembly) -> AsyncGenerator[str, None]:
    """The text of a stream read through LiteLLM's wrapper (every provider but an OpenAI-shaped wire)."""
    kept = getattr(response, "chunks", None)  # what LiteLLM keeps for its end-of-stream usage count
    if not isinstance(kept, list):
        kept = None
    async with response:
        async for chunk in response:
            text = assembly.add(chunk)
            if kept is not None and len(kept) >= COMPACT_AT:
                compact_kept_chunks(kept)
            if text:
                yield text
            elif assembly.has_final_usage:
                # LiteLLM's last chunk. Iterating once more would only make it rebuild the whole
                # response again for its success logging and cost, which nothing here reads.
                break
