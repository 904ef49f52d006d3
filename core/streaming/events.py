"""The events of the app's two kinds of streams, as types, with their one wire format.

A chat session's stream (hub key = the session id) carries one turn's events in the
Vercel AI SDK UI stream protocol that seed 000 uses; a delegated task's stream (hub key
`a2a_<taskId>`) carries the callee's run in that same protocol, framed by the task's
`state` changes and its `done`:

    kind                    type            payload (key order is the wire's)
    start                   `Start`         {messageId}
    text-delta              `TextDelta`     {id, delta}
    tool-input-available    `ToolInput`     {toolCallId, toolName, input}
    tool-output-available   `ToolOutput`    {toolCallId, output, metadata, isError}
    a2a-task-started        `TaskStarted`   {taskId, calleeAgentSlug, calleeAgentName, toolCallId,
                                             parentTaskId, recursionDepth}
    error                   `Error`         {errorText} (+ code)
    finish                  `Finish`        {finishReason, usage: {inputTokens, outputTokens}}
    state (task stream)     `TaskState`     {state, previous, timestamp} (+ error, + message: the
                                            question of `input-required` / `auth-required`)
    done (task stream)      `TaskDone`      {state, error, durationMs, usage}

Producers build these types and `publish` them into a hub; consumers turn what a hub
hands them back into types with `from_stream` (or `parse_event` for a wire dict) and
dispatch on the type (`match`), never on a string. `to_wire` is the one serializer:
`{"type": kind, **payload}`, the JSON a chat stream's SSE frame carries, byte for byte
as before the types existed. `seed_task_wire` is the task stream's HTTP face
(`GET /api/agents/a2a/stream`): seed 000's and seed 002's shapes of the same events.

The types are frozen dataclasses with slots: `text-delta` is on the token hot path, and
building one costs an object and a two-key dict, no validation.

Seed 002's `state` event says `from` is a string: a task's first state has no earlier
one, so its `previous` is `NO_PREVIOUS_STATE` ("unknown", the A2A name of a state that
is not known) rather than null.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, ClassVar, Protocol

from core.errors import AppError

__all__ = [
    "NO_PREVIOUS_STATE",
    "Error",
    "Event",
    "EventFormatError",
    "EventSink",
    "Finish",
    "Start",
    "TaskArtifact",
    "TaskDone",
    "TaskStarted",
    "TaskState",
    "TextDelta",
    "ToolInput",
    "ToolOutput",
    "UnknownEventTypeError",
    "from_stream",
    "parse_event",
    "publish",
    "seed_task_wire",
    "to_wire",
]

#: The `previous` (seed 002 `from`) of a task's first `state` event: there was no state before it.
NO_PREVIOUS_STATE = "unknown"


class EventFormatError(AppError, ValueError):
    """A wire dict that is not an event of these streams (a missing or ill-typed field)."""

    code = "event_format_error"


class UnknownEventTypeError(EventFormatError):
    """A wire dict whose `type` is none of the event kinds of these streams."""

    code = "unknown_event_type"


@dataclass(frozen=True, slots=True)
class Start:
    """A turn (or a callee's run) begins: `start` {messageId}."""

    kind: ClassVar[str] = "start"
    message_id: str

    def payload(self) -> dict[str, Any]:
        """The event's fields as the wire names them."""
        return {"messageId": self.message_id}


@dataclass(frozen=True, slots=True)
class TextDelta:
    """A piece of the answer's text: `text-delta` {id, delta}; `id` names the text part (one per model step)."""

    kind: ClassVar[str] = "text-delta"
    id: str
    delta: str

    def payload(self) -> dict[str, Any]:
        """The event's fields as the wire names them."""
        return {"id": self.id, "delta": self.delta}


@dataclass(frozen=True, slots=True)
class ToolInput:
    """The model called a tool: `tool-input-available` {toolCallId, toolName, input}.

    `input` is the parsed arguments (a JSON value), or their raw text when they are not JSON.
    """

    kind: ClassVar[str] = "tool-input-available"
    tool_call_id: str
    tool_name: str
    input: Any

    def payload(self) -> dict[str, Any]:
        """The event's fields as the wire names them."""
        return {"toolCallId": self.tool_call_id, "toolName": self.tool_name, "input": self.input}


@dataclass(frozen=True, slots=True)
class ToolOutput:
    """A tool call's result: `tool-output-available` {toolCallId, output, metadata, isError}."""

    kind: ClassVar[str] = "tool-output-available"
    tool_call_id: str
    output: Any
    metadata: dict[str, Any] = field(default_factory=dict)
    is_error: bool = False

    def payload(self) -> dict[str, Any]:
        """The event's fields as the wire names them."""
        return {
            "toolCallId": self.tool_call_id,
            "output": self.output,
            "metadata": self.metadata,
            "isError": self.is_error,
        }


@dataclass(frozen=True, slots=True)
class TaskStarted:
    """A delegated task was created for a tool call: `a2a-task-started` (in the caller's stream)."""

    kind: ClassVar[str] = "a2a-task-started"
    task_id: str
    callee_agent_slug: str
    callee_agent_name: str
    tool_call_id: str
    parent_task_id: str | None
    recursion_depth: int

    def payload(self) -> dict[str, Any]:
        """The event's fields as the wire names them."""
        return {
            "taskId": self.task_id,
            "calleeAgentSlug": self.callee_agent_slug,
            "calleeAgentName": self.callee_agent_name,
            "toolCallId": self.tool_call_id,
            "parentTaskId": self.parent_task_id,
            "recursionDepth": self.recursion_depth,
        }


@dataclass(frozen=True, slots=True)
class Error:
    """Something failed: `error` {errorText} and, for the task panel, a machine `code` (`core.delegation.states`)."""

    kind: ClassVar[str] = "error"
    error_text: str
    code: str | None = None

    def payload(self) -> dict[str, Any]:
        """The event's fields as the wire names them (`code` only when there is one)."""
        if self.code:
            return {"errorText": self.error_text, "code": self.code}
        return {"errorText": self.error_text}


@dataclass(frozen=True, slots=True)
class Finish:
    """A turn's last event: `finish` {finishReason, usage: {inputTokens, outputTokens[, costUsd]}}."""

    kind: ClassVar[str] = "finish"
    finish_reason: str
    input_tokens: int = 0
    output_tokens: int = 0
    cost_usd: float | None = None  # in `usage` only when the model has a price

    def payload(self) -> dict[str, Any]:
        """The event's fields as the wire names them."""
        return {
            "finishReason": self.finish_reason,
            "usage": usage_payload(self.input_tokens, self.output_tokens, self.cost_usd),
        }


@dataclass(frozen=True, slots=True)
class TaskState:
    """A task's state changed: `state` {state, previous, timestamp} (+ error) in the task's stream."""

    kind: ClassVar[str] = "state"
    state: str
    previous: str
    timestamp: str
    error: str | None = None
    message: str | None = None  # what the callee asks, in `input-required` / `auth-required`

    def payload(self) -> dict[str, Any]:
        """The event's fields as the buffer holds them (`error` and `message` only when there is one)."""
        data: dict[str, Any] = {"state": self.state, "previous": self.previous, "timestamp": self.timestamp}
        if self.error:
            data["error"] = self.error
        if self.message:
            data["message"] = self.message
        return data


@dataclass(frozen=True, slots=True)
class TaskDone:
    """A task's last event: `done` {state, error, durationMs, usage}."""

    kind: ClassVar[str] = "done"
    state: str
    error: str | None
    duration_ms: int
    input_tokens: int = 0
    output_tokens: int = 0
    cost_usd: float | None = None

    def payload(self) -> dict[str, Any]:
        """The event's fields as the wire names them."""
        return {
            "state": self.state,
            "error": self.error,
            "durationMs": self.duration_ms,
            "usage": usage_payload(self.input_tokens, self.output_tokens, self.cost_usd),
        }


def usage_payload(input_tokens: int, output_tokens: int, cost_usd: float | None) -> dict[str, Any]:
    """`usage` on the wire: the tokens, and `costUsd` when the model has a price (LiteLLM's list prices)."""
    usage: dict[str, Any] = {"inputTokens": input_tokens, "outputTokens": output_tokens}
    if cost_usd is not None:
        usage["costUsd"] = cost_usd
    return usage


@dataclass(frozen=True, slots=True)
class TaskArtifact:
    """A file or a JSON value a delegated agent returned: `a2a-artifact` (in the task's stream, before `done`).

    A file is stored for the caller's owner (`attachment_id`, downloaded from `/api/attachments/{id}`), or
    only linked (`url`, a remote agent's own link, not fetched); a data artifact carries its JSON `data`.
    """

    kind: ClassVar[str] = "a2a-artifact"
    artifact_kind: str  # "file" | "data"
    name: str
    mime: str | None = None
    size: int | None = None
    attachment_id: str | None = None
    url: str | None = None
    data: Any = None

    def payload(self) -> dict[str, Any]:
        """The event's fields as the wire names them."""
        return {
            "artifactKind": self.artifact_kind,
            "name": self.name,
            "mime": self.mime,
            "size": self.size,
            "attachmentId": self.attachment_id,
            "url": self.url,
            "data": self.data,
        }


Event = Start | TextDelta | ToolInput | ToolOutput | TaskStarted | Error | Finish | TaskState | TaskDone | TaskArtifact


class EventSink(Protocol):
    """Where events are published: a stream hub (either backend)."""

    async def append(self, key: str, type: str, data: dict[str, Any] | None = None) -> int:
        """Add one event under `key`; returns its id."""
        ...


async def publish(hub: EventSink, key: str, event: Event) -> int:
    """Append `event` to the hub buffer `key`; returns its id."""
    return await hub.append(key, event.kind, event.payload())


def to_wire(event: Event) -> dict[str, Any]:
    """The event as a chat stream's SSE frame carries it: `{"type": kind, **payload}`."""
    return {"type": event.kind, **event.payload()}


def parse_event(wire: Mapping[str, Any]) -> Event:
    """The event a wire dict (`to_wire`'s shape) stands for.

    Raises:
        UnknownEventTypeError: its `type` is not a kind of these streams.
        EventFormatError: a field is missing or has the wrong type.
    """
    kind = wire.get("type")
    if not isinstance(kind, str):
        raise EventFormatError(f"an event needs a string 'type', got {kind!r}")
    return from_stream(kind, wire)


def from_stream(kind: str, data: Mapping[str, Any]) -> Event:
    """The event a hub hands back as its `type` and `data` (`StreamEvent.type`, `StreamEvent.data`).

    Raises:
        UnknownEventTypeError: `kind` is not a kind of these streams.
        EventFormatError: a field is missing or has the wrong type.
    """
    parse = _PARSERS.get(kind)
    if parse is None:
        raise UnknownEventTypeError(f"unknown event type {kind!r}; known: {', '.join(sorted(_PARSERS))}")
    try:
        return parse(data)
    except (KeyError, TypeError) as exc:
        raise EventFormatError(f"malformed {kind!r} event ({exc!r}): {dict(data)!r}") from exc


def seed_task_wire(event: Event, task_id: str) -> tuple[str, dict[str, Any]]:
    """A task stream's event as `GET /api/agents/a2a/stream` sends it: `(type, payload)` in the seeds' shapes.

    Seed 000 (§3.2.2, §3.3.1): text `{"type": "text-delta", "textDelta": …}`, an error
    `{"type": "error", "message": …}`, the end `{"type": "done", …}`. Seed 002: the named
    `state` event is `{taskId, from, to, timestamp}` (and `error` when the task failed).
    Every other event is sent as the buffer holds it.
    """
    match event:
        case TextDelta(delta=delta):
            return event.kind, {"textDelta": delta}
        case Error(error_text=text):
            return event.kind, {"message": text}
        case TaskState():
            seed: dict[str, Any] = {
                "taskId": task_id,
                "from": event.previous,
                "to": event.state,
                "timestamp": event.timestamp,
            }
            if event.error:
                seed["error"] = event.error
            if event.message:
                seed["message"] = event.message
            return event.kind, seed
    return event.kind, event.payload()


# -- parsing, one function per kind ---------------------------------------------------------


def _str(data: Mapping[str, Any], name: str) -> str:
    value = data[name]
    if not isinstance(value, str):
        raise TypeError(f"{name!r} must be a string, got {type(value).__name__}")
    return value


def _opt_str(data: Mapping[str, Any], name: str) -> str | None:
    value = data.get(name)
    if value is not None and not isinstance(value, str):
        raise TypeError(f"{name!r} must be a string or null, got {type(value).__name__}")
    return value


def _int(data: Mapping[str, Any], name: str) -> int:
    value = data[name]
    if not isinstance(value, int) or isinstance(value, bool):
        raise TypeError(f"{name!r} must be an integer, got {type(value).__name__}")
    return value


def _usage(data: Mapping[str, Any]) -> tuple[int, int, float | None]:
    usage = data.get("usage") or {}
    if not isinstance(usage, Mapping):
        raise TypeError(f"'usage' must be an object, got {type(usage).__name__}")
    cost = usage.get("costUsd")
    return (
        int(usage.get("inputTokens") or 0),
        int(usage.get("outputTokens") or 0),
        float(cost) if isinstance(cost, int | float) else None,
    )


def _start(d: Mapping[str, Any]) -> Event:
    return Start(_str(d, "messageId"))


def _text_delta(d: Mapping[str, Any]) -> Event:
    return TextDelta(_str(d, "id"), _str(d, "delta"))


def _tool_input(d: Mapping[str, Any]) -> Event:
    return ToolInput(_str(d, "toolCallId"), _str(d, "toolName"), d.get("input"))


def _tool_output(d: Mapping[str, Any]) -> Event:
    metadata = d.get("metadata") or {}
    if not isinstance(metadata, dict):
        raise TypeError(f"'metadata' must be an object, got {type(metadata).__name__}")
    return ToolOutput(_str(d, "toolCallId"), d.get("output"), metadata, bool(d.get("isError")))


def _task_started(d: Mapping[str, Any]) -> Event:
    return TaskStarted(
        _str(d, "taskId"),
        _str(d, "calleeAgentSlug"),
        _str(d, "calleeAgentName"),
        _str(d, "toolCallId"),
        _opt_str(d, "parentTaskId"),
        _int(d, "recursionDepth"),
    )


def _error(d: Mapping[str, Any]) -> Event:
    return Error(_str(d, "errorText"), _opt_str(d, "code"))


def _finish(d: Mapping[str, Any]) -> Event:
    return Finish(_str(d, "finishReason"), *_usage(d))


def _task_state(d: Mapping[str, Any]) -> Event:
    # A buffer written before `NO_PREVIOUS_STATE` existed holds null there.
    return TaskState(
        _str(d, "state"),
        _opt_str(d, "previous") or NO_PREVIOUS_STATE,
        _str(d, "timestamp"),
        _opt_str(d, "error"),
        _opt_str(d, "message"),
    )


def _task_artifact(d: Mapping[str, Any]) -> Event:
    size = d.get("size")
    return TaskArtifact(
        _str(d, "artifactKind"),
        _str(d, "name"),
        _opt_str(d, "mime"),
        size if isinstance(size, int) and not isinstance(size, bool) else None,
        _opt_str(d, "attachmentId"),
        _opt_str(d, "url"),
        d.get("data"),
    )


def _task_done(d: Mapping[str, Any]) -> Event:
    return TaskDone(_str(d, "state"), _opt_str(d, "error"), _int(d, "durationMs"), *_usage(d))


_PARSERS: dict[str, Callable[[Mapping[str, Any]], Event]] = {
    Start.kind: _start,
    TextDelta.kind: _text_delta,
    ToolInput.kind: _tool_input,
    ToolOutput.kind: _tool_output,
    TaskStarted.kind: _task_started,
    Error.kind: _error,
    Finish.kind: _finish,
    TaskState.kind: _task_state,
    TaskDone.kind: _task_done,
    TaskArtifact.kind: _task_artifact,
}
