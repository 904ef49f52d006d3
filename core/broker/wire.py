"""The broker's wire: line-delimited JSON-RPC 2.0 carrying A2A, as seed 003 describes.

One JSON message per line; a WebSocket frame may hold several lines, a line
never spans frames. The broker is the JSON-RPC *client* here: it sends
`agent/authenticatedExtendedCard`, `message/stream` and `tasks/cancel`, and
reads the agent's responses. Requests use the v0.3 shape the seed shows
(`kind` objects, `role: "user"`); responses are accepted in both the v0.3
shape (`{"kind": "status-update", ..., "final": true}`) and the v1.0
`StreamResponse` shape (`{"statusUpdate": {...}}`, `TASK_STATE_*` enums).

Everything here is pure (no I/O): dicts in, plain dataclasses out. The rest of
the broker never looks at a raw A2A object.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from typing import Any, Literal

from core.chat.prompts import DISPATCH_TOOL_PREFIX as TOOL_NAME_PREFIX
from core.errors import AppError
from core.web.input_limits import MAX_JSON_NESTING as MAX_NESTING
from core.web.input_limits import json_error, json_nesting

JSONRPC = "2.0"

# Methods the broker sends. The first card method is the seed's; the others are
# the names v0.3 (`agent/getAuthenticatedExtendedCard`) and v1.0 (`GetExtendedAgentCard`)
# agents answer to, tried in turn when an agent says "method not found".
CARD_METHODS = ("agent/authenticatedExtendedCard", "GetExtendedAgentCard", "agent/getAuthenticatedExtendedCard")
STREAM_METHOD_V03, STREAM_METHOD_V10 = "message/stream", "SendStreamingMessage"
CANCEL_METHOD_V03, CANCEL_METHOD_V10 = "tasks/cancel", "CancelTask"

# JSON-RPC error codes.
PARSE_ERROR, INVALID_REQUEST, METHOD_NOT_FOUND = -32700, -32600, -32601

TERMINAL_STATES = frozenset({"completed", "failed", "canceled", "rejected"})
# Interrupted states also end a stream (the agent waits for the user); the broker reports them as the end.
INTERRUPTED_STATES = frozenset({"input-required", "auth-required"})

# An id joins the app's one registry next to local agents (whose slugs follow the same rule),
# and becomes the LLM tool name `a2a_<id>` (at most 64 characters).
A2A_ID_PATTERN = re.compile(r"^[a-z0-9][a-z0-9_-]{0,59}$")


class WireError(AppError, ValueError):
    """A line or a result that is not what the protocol allows; the message says what is wrong."""

    code = "wire_error"


# -- framing -------------------------------------------------------------------------------


def split_lines(frame: str) -> list[str]:
    """The non-blank lines of one WebSocket frame."""
    return [line for line in frame.split("\n") if line.strip()]


def encode(message: dict[str, Any]) -> str:
    """One JSON-RPC message as one line (no newline inside: JSON escapes them)."""
    return json.dumps(message, ensure_ascii=False, separators=(",", ":"))


@dataclass(frozen=True, slots=True)
class Incoming:
    """One decoded line from an agent.

    kind: 'response' (result or error for one of our requests), 'request' or
    'notification' (the agent calling us: the broker serves no methods).
    """

    kind: Literal["response", "request", "notification"]
    id: Any = None
    result: Any = None
    error: dict[str, Any] | None = None
    method: str | None = None


def decode(line: str) -> Incoming:
    """Parse one line.

    Raises:
        WireError: not JSON (`code` PARSE_ERROR) or not a JSON-RPC 2.0 message (INVALID_REQUEST).
    """
    try:
        obj = json.loads(line)
    except ValueError as exc:
        raise RpcLineError(PARSE_ERROR, f"not valid JSON: {json_error(exc)}") from exc
    except RecursionError as exc:  # json's parser recurses per level: thousands of `[` exhaust the stack
        raise RpcLineError(PARSE_ERROR, f"not valid JSON: nested more than {MAX_NESTING} levels deep") from exc
    if json_nesting(obj) > MAX_NESTING:
        raise RpcLineError(PARSE_ERROR, f"not valid JSON: nested more than {MAX_NESTING} levels deep")
    if not isinstance(obj, dict):
        raise RpcLineError(INVALID_REQUEST, "a JSON-RPC message must be a JSON object")
    if obj.get("jsonrpc") != JSONRPC:
        raise RpcLineError(INVALID_REQUEST, 'not JSON-RPC 2.0: "jsonrpc" must be "2.0"', obj.get("id"))
    if "method" in obj:
        if not isinstance(obj["method"], str):
            raise RpcLineError(INVALID_REQUEST, '"method" must be a string', obj.get("id"))
        return Incoming("request" if "id" in obj else "notification", id=obj.get("id"), method=obj["method"])
    has_result, has_error = "result" in obj, "error" in obj
    if has_result == has_error:
        raise RpcLineError(INVALID_REQUEST, 'a response needs exactly one of "result" and "error"', obj.get("id"))
    if "id" not in obj:
        raise RpcLineError(INVALID_REQUEST, 'a response needs an "id"')
    error = obj.get("error")
    if has_error and not (isinstance(error, dict) and isinstance(error.get("code"), int)):
        raise RpcLineError(INVALID_REQUEST, '"error" must be an object with an integer "code"', obj.get("id"))
    return Incoming("response", id=obj["id"], result=obj.get("result"), error=error if has_error else None)


class RpcLineError(WireError):
    """A line the broker answers with a JSON-RPC error (`code`, and the request `id` when known)."""

    code: int  # type: ignore[assignment]  # JSON-RPC's error number here, not AppError's string code

    def __init__(self, code: int, message: str, id: Any = None) -> None:
        super().__init__(message)
        self.code = code
        self.id = id if isinstance(id, (str, int)) and not isinstance(id, bool) else None


def error_response(code: int, message: str, id: Any = None) -> dict[str, Any]:
    """A JSON-RPC error object to send back."""
    return {"jsonrpc": JSONRPC, "id": id, "error": {"code": code, "message": message}}


def request(id: int, method: str, params: dict[str, Any]) -> dict[str, Any]:
    """A JSON-RPC request."""
    return {"jsonrpc": JSONRPC, "id": id, "method": method, "params": params}


def card_request(id: int, method: str = CARD_METHODS[0]) -> dict[str, Any]:
    """Ask for the agent's card (seed: `agent/authenticatedExtendedCard`, empty params)."""
    return request(id, method, {})


def stream_request(
    id: int,
    text: str,
    *,
    message_id: str,
    context_id: str | None = None,
    v1: bool = False,
    task_id: str | None = None,
    metadata: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """`message/stream` with one text part (v0.3, as the seed shows), or v1.0 `SendStreamingMessage`.

    `task_id`: the agent's task this message goes on with (the answer to its question, issue 36).
    `metadata` goes on the message (the W3C `traceparent` of the task's span, when traces are on).
    """
    if v1:
        message: dict[str, Any] = {"messageId": message_id, "role": "ROLE_USER", "parts": [{"text": text}]}
    else:
        message = {
            "kind": "message",
            "role": "user",
            "parts": [{"kind": "text", "text": text}],
            "messageId": message_id,
        }
    if context_id:
        message["contextId"] = context_id
    if task_id:
        message["taskId"] = task_id
    if metadata:
        message["metadata"] = metadata
    return request(id, STREAM_METHOD_V10 if v1 else STREAM_METHOD_V03, {"message": message})


def cancel_request(id: int, task_id: str, *, v1: bool = False) -> dict[str, Any]:
    """`tasks/cancel` (or v1.0 `CancelTask`) for the agent's own task id."""
    return request(id, CANCEL_METHOD_V10 if v1 else CANCEL_METHOD_V03, {"id": task_id})


# -- stream events -----------------------------------------------------------------------------


WireKind = Literal["task", "status", "artifact", "message"]


@dataclass(frozen=True, slots=True)
class WireEvent:
    """One event of a streamed task, out of its wire shape.

    Attributes:
        kind: task, status, artifact or message (a direct reply: the task's whole answer).
        text: the agent's text in this event ('' when none).
        state: normalised task state (working, completed, failed, canceled, rejected, input-required, ...).
        final: the last event of the stream (final flag, a terminal or interrupted state, or a message).
        task_id: the agent's id for the task, when the event names it.
        artifact_id / append: for artifact events, which artifact and whether the text extends it.
    """

    kind: WireKind
    text: str = ""
    state: str | None = None
    final: bool = False
    task_id: str | None = None
    artifact_id: str | None = None
    append: bool = False
    context_id: str | None = None  # the agent's context of the task, when the event names it


def answer_piece(event: WireEvent) -> str:
    """The event's text as a piece of the running answer a reader sees (the side panel, saved messages).

    Artifact chunks continue the text as they are; a status message is a whole message
    (progress such as "Searching…"), so it stands as a paragraph of its own.
    """
    if not event.text or event.kind == "artifact":
        return event.text
    return event.text if event.final else f"{event.text}\n\n"


@dataclass(slots=True)
class Answer:
    """What a task answered, as an A2A client reads it: its artifacts, else its final status message.

    Progress (working status messages) is not the answer; `last_progress` is what to fall back
    on when a caller wants one (the broker's final inject does).
    """

    artifacts: dict[str, str] = field(default_factory=dict)
    last_progress: str = ""

    def add_artifact(self, event: WireEvent) -> None:
        """Take an artifact update (a whole artifact, or a chunk appended to one)."""
        key = event.artifact_id or f"artifact-{len(self.artifacts)}"
        self.artifacts[key] = (self.artifacts.get(key, "") + event.text) if event.append else event.text

    def text(self, final: WireEvent) -> str:
        """The answer once `final` (the last event) came: the artifacts (one per line), else the final message.

        Never both: a closing message after the artifacts ("Here is the answer.") is not glued to them.
        """
        pieces = [t for t in self.artifacts.values() if t.strip()]
        if not pieces and final.text.strip():
            pieces.append(final.text)
        return "\n".join(pieces).strip() or self.last_progress


def normalise_state(value: Any) -> str | None:
    """`TASK_STATE_INPUT_REQUIRED` and `input-required` both become `input-required`."""
    if not isinstance(value, str) or not value:
        return None
    state = value.strip().lower()
    state = state.removeprefix("task_state_").replace("_", "-")
    return "canceled" if state == "cancelled" else state


def parts_text(parts: Any) -> str:
    """The text parts of a message or artifact, joined (file and data parts carry no text)."""
    if not isinstance(parts, list):
        return ""
    texts = []
    for part in parts:
        if isinstance(part, dict) and isinstance(part.get("text"), str) and part.get("kind", "text") == "text":
            texts.append(part["text"])
    return "".join(texts)


def _message_text(message: Any) -> str:
    if not isinstance(message, dict):
        return ""
    role = str(message.get("role", "agent")).lower()
    if role in {"user", "role_user"}:
        return ""  # an echo of the request (a task's history), not the agent speaking
    return parts_text(message.get("parts"))


_V1_KEYS: dict[str, WireKind] = {
    "task": "task",
    "message": "message",
    "statusUpdate": "status",
    "status_update": "status",
    "artifactUpdate": "artifact",
    "artifact_update": "artifact",
}
_V03_KINDS: dict[str, WireKind] = {
    "task": "task",
    "message": "message",
    "status-update": "status",
    "artifact-update": "artifact",
}


def parse_stream_result(result: Any) -> WireEvent:
    """One `result` of a `message/stream` response, in either shape.

    Raises:
        WireError: not an A2A stream event.
    """
    if not isinstance(result, dict):
        raise WireError("a stream result must be a JSON object")
    kind = _V03_KINDS.get(str(result.get("kind"))) if "kind" in result else None
    body = result
    if kind is None:
        present = [k for k in _V1_KEYS if k in result]
        if len(present) != 1 or not isinstance(result[present[0]], dict):
            raise WireError(
                'a stream result needs "kind" (task, status-update, artifact-update, message) or exactly one of '
                "task, message, statusUpdate, artifactUpdate"
            )
        kind, body = _V1_KEYS[present[0]], result[present[0]]
    if kind == "message":
        return WireEvent(
            "message",
            text=_message_text(body),
            state="completed",
            final=True,
            task_id=_str(body.get("taskId") or body.get("task_id")),
        )
    if kind == "artifact":
        artifact = body.get("artifact")
        if not isinstance(artifact, dict):
            raise WireError('an artifact update needs an "artifact" object')
        return WireEvent(
            "artifact",
            text=parts_text(artifact.get("parts")),
            task_id=_str(body.get("taskId") or body.get("task_id")),
            artifact_id=_str(artifact.get("artifactId") or artifact.get("artifact_id")),
            append=bool(body.get("append")),
        )
    status = body.get("status")
    if not isinstance(status, dict):
        raise WireError(f'a {"task" if kind == "task" else "status update"} needs a "status" object')
    state = normalise_state(status.get("state"))
    text = _message_text(status.get("message"))
    if kind == "task":
        task_id = _str(body.get("id"))
        artifacts = body.get("artifacts")
        if isinstance(artifacts, list):
            text = "".join([text, *(parts_text(a.get("parts")) for a in artifacts if isinstance(a, dict))])
    else:
        task_id = _str(body.get("taskId") or body.get("task_id"))
    final = bool(body.get("final")) or state in TERMINAL_STATES or state in INTERRUPTED_STATES
    context_id = _str(body.get("contextId") or body.get("context_id"))
    return WireEvent(kind, text=text, state=state, final=final, task_id=task_id, context_id=context_id)


def _str(value: Any) -> str | None:
    return value if isinstance(value, str) and value else None


# -- agent cards and tool definitions ----------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Skill:
    """One skill from an agent card."""

    id: str
    name: str
    description: str = ""

    def as_dict(self) -> dict[str, str]:
        """The JSON shape of `/a2a/agents` (seed 003: `{id, name}`; description when the card has one)."""
        out = {"id": self.id, "name": self.name}
        if self.description:
            out["description"] = self.description
        return out


@dataclass(frozen=True, slots=True)
class AgentCard:
    """The parts of an A2A agent card the broker uses (the raw card is kept for display)."""

    name: str
    description: str
    skills: tuple[Skill, ...] = ()
    version: str | None = None
    v1: bool = False  # the card says the agent speaks A2A 1.x
    raw: dict[str, Any] = field(default_factory=dict, compare=False)


def parse_card(obj: Any) -> AgentCard:
    """Check and read an agent card (v0.3 or v1.0 JSON).

    Raises:
        WireError: it is not an object, or lacks `name`, `description` or `skills`, or a skill lacks `id`/`name`.
    """
    if not isinstance(obj, dict):
        raise WireError("the agent card must be a JSON object")
    problems = []
    name, description, skills = obj.get("name"), obj.get("description"), obj.get("skills")
    if not isinstance(name, str) or not name.strip():
        problems.append("name (a non-empty string)")
    if not isinstance(description, str):
        problems.append("description (a string)")
    if not isinstance(skills, list):
        problems.append("skills (a list)")
    parsed: list[Skill] = []
    for i, skill in enumerate(skills if isinstance(skills, list) else []):
        if not (
            isinstance(skill, dict)
            and isinstance(skill.get("id"), str)
            and skill["id"]
            and isinstance(skill.get("name"), str)
            and skill["name"]
        ):
            problems.append(f"skills[{i}].id and skills[{i}].name (strings)")
            continue
        parsed.append(Skill(skill["id"], skill["name"], str(skill.get("description") or "")))
    if problems:
        raise WireError("the agent card lacks " + ", ".join(problems))
    interfaces = obj.get("supportedInterfaces") or obj.get("supported_interfaces") or []
    versions = [
        str(i.get("protocolVersion") or i.get("protocol_version") or "") for i in interfaces if isinstance(i, dict)
    ]
    v1 = any(v.startswith("1") for v in versions) and not any(v.startswith("0.") for v in versions)
    return AgentCard(
        name=str(name).strip(),  # checked above
        description=str(description).strip(),
        skills=tuple(parsed),
        version=_str(obj.get("version")),
        v1=v1,
        raw=obj,
    )


def tool_definition(a2a_id: str, card: AgentCard) -> dict[str, Any]:
    """The LLM tool that stands for the agent (seed 003: `a2a_<id>`, input `{task: string}`)."""
    lines = [card.description or f"Delegate a task to the remote agent {card.name}."]
    if card.skills:
        lines.append(
            "Skills: "
            + "; ".join(f"{s.name} ({s.description})" if s.description else s.name for s in card.skills)
            + "."
        )
    return {
        "name": f"{TOOL_NAME_PREFIX}{a2a_id}",
        "description": f"[{card.name}] " + " ".join(lines),
        "inputSchema": {
            "type": "object",
            "properties": {"task": {"type": "string", "description": f"The complete task for {card.name}"}},
            "required": ["task"],
        },
    }
