"""Remote agents (client side): their cards, the client for their best interface, their stream.

Cards are checked and stored; a remote task's stream is read into `RemoteEvent`s (`RemoteStreamReader`).
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from typing import Any
from urllib.parse import urlparse

import httpx
from a2a.client import A2AClientError, Client, ClientConfig, ClientFactory
from a2a.client.card_resolver import parse_agent_card
from a2a.types import (
    AgentCard,
    AgentInterface,
    Artifact,
    CancelTaskRequest,
    Message,
    Part,
    Role,
    SendMessageRequest,
    StreamResponse,
    Task,
    TaskState,
    TaskStatus,
)
from a2a.utils.constants import (
    AGENT_CARD_WELL_KNOWN_PATH,
)
from a2a.utils.errors import (
    A2AError,
)
from google.protobuf.json_format import MessageToDict

from core.a2a.protocol.parts import blocks_of
from core.a2a.protocol.states import FROM_PROTO, PROTO_TERMINAL
from core.delegation.registry import RemoteEvent
from core.errors import AppError


class CardError(AppError, ValueError):
    """A card that cannot be fetched or used; the message says what is wrong and where."""

    code = "card_error"


def card_location(url: str) -> str:
    """Where the card of `url` is: `url` itself when it names a `.json` file, else the agent's well-known card path.

    Raises:
        CardError: `url` is not an http(s) URL.
    """
    parsed = urlparse(url)
    if parsed.scheme not in {"http", "https"} or not parsed.netloc:
        raise CardError(
            f"{url!r} is not an http(s) URL; give the URL of the agent card "
            f"(…{AGENT_CARD_WELL_KNOWN_PATH}) or of the agent."
        )
    if parsed.path.endswith(".json"):
        return url
    return f"{url.rstrip('/')}{AGENT_CARD_WELL_KNOWN_PATH}"


def card_from_fetched(data: Any) -> AgentCard:
    """A fetched card's JSON as the SDK's type, checked (v0.3 shapes are converted).

    The errors use this app's words only, never the fetched text: a card URL can point anywhere.

    Raises:
        CardError: "could not fetch the card: not a valid agent card (...)".
    """
    invalid = "could not fetch the card: not a valid agent card"
    if not isinstance(data, dict):
        raise CardError(f"{invalid} (not a JSON object)")
    try:
        card = parse_agent_card(data)
    except Exception:  # protobuf's ParseError and friends; their text quotes the card
        raise CardError(f"{invalid} (its fields do not parse)") from None
    if not card.name.strip():
        raise CardError(f"{invalid} (it has no name)")
    if _pick_interface(card) is None:
        raise CardError(f"{invalid} (it offers no JSON-RPC interface, v1.0 or v0.3, with an http(s) URL)")
    return card


def endpoint_url(card: AgentCard) -> str | None:
    """The URL of the card's interface that this app calls (v1.0 first, else v0.3)."""
    interface = _pick_interface(card)
    return interface.url if interface else None


def check_card(card: AgentCard, *, source: str) -> None:
    """Raise `CardError` unless the card names the agent and offers an interface this app can call."""
    if not card.name.strip():
        raise CardError(f"The card at {source} is not an A2A agent card: it has no name.")
    if _pick_interface(card) is None:
        offered = (
            ", ".join(
                f"{i.protocol_binding} {i.protocol_version or '?'} at {i.url or '?'}" for i in card.supported_interfaces
            )
            or "none"
        )
        raise CardError(
            f"The card at {source} offers no JSON-RPC interface (v1.0 or v0.3) with an http(s) URL; "
            f"it offers: {offered}."
        )


def _pick_interface(card: AgentCard) -> AgentInterface | None:
    usable: list[AgentInterface] = [
        i
        for i in card.supported_interfaces
        if i.protocol_binding == "JSONRPC" and urlparse(i.url).scheme in {"http", "https"}
    ]
    for prefix in ("1.", "0.3"):
        for interface in usable:
            if (interface.protocol_version or "0.3").startswith(prefix):
                return interface
    return None


def card_to_storage(card: AgentCard) -> dict[str, Any]:
    """The card as JSON, for the database."""
    stored: dict[str, Any] = MessageToDict(card)
    return stored


def card_from_json(data: dict[str, Any]) -> AgentCard:
    """A stored (or fetched) card back as the SDK's type (v0.3 shapes are converted).

    Raises:
        CardError: the JSON is not a usable card.
    """
    try:
        card = parse_agent_card(json.loads(json.dumps(data)))  # parse_agent_card edits its argument
    except Exception as exc:  # protobuf's ParseError and friends
        raise CardError(f"The stored card is not valid: {exc}") from exc
    check_card(card, source="the stored card")
    return card


def card_summary(card: AgentCard) -> dict[str, Any]:
    """What the registry and the UI show about a remote agent's card."""
    interface = _pick_interface(card)
    return {
        "name": card.name,
        "description": card.description,
        "version": card.version,
        "url": interface.url if interface else None,
        "protocolVersion": (interface.protocol_version or "0.3") if interface else None,
        "streaming": card.capabilities.streaming,
        "inputModes": list(card.default_input_modes),
        "outputModes": list(card.default_output_modes),
        "skills": [
            {"id": s.id, "name": s.name, "description": s.description, "tags": list(s.tags)} for s in card.skills
        ],
    }


def open_client(card: AgentCard, http: httpx.AsyncClient, *, streaming: bool = True) -> Client:
    """A client for the card's best interface (v1.0 first, else v0.3 through the SDK's compat transport).

    The client uses `http` and does not close it; `streaming=False` sends `SendMessage`, not the streaming call.
    """
    return ClientFactory(ClientConfig(httpx_client=http, streaming=streaming)).create(card)


def text_message_request(
    text: str, *, message_id: str, context_id: str | None = None, task_id: str | None = None
) -> SendMessageRequest:
    """A `SendMessage` request carrying one text part from the user (into task `task_id`, when it continues one)."""
    message = Message(message_id=message_id, role=Role.ROLE_USER, parts=[Part(text=text)])
    if context_id:
        message.context_id = context_id
    if task_id:
        message.task_id = task_id
    return SendMessageRequest(message=message)


def cancel_request(task_id: str) -> CancelTaskRequest:
    """A `CancelTask` request."""
    return CancelTaskRequest(id=task_id)


class RemoteStreamReader:
    """Turns one remote task's stream (the SDK's `StreamResponse`s) into `RemoteEvent`s.

    Agents stream in two styles: text in `working` status messages (ours, and
    many SDK agents), or the answer as artifacts (whole or in appended chunks)
    with progress notes in status messages. Both are shown as they come (the side
    panel), a status message's text marked so (`RemoteEvent.status_text`): once an
    artifact is shown, those are notes, each laid out on its own line
    (`core/delegation/notes.py`). An artifact that only repeats the text already
    streamed as status messages (what this app's own server sends at the end) is
    not shown again; a second artifact starts after a blank line.

    The task's result is its answer as an A2A client reads it (`RemoteEvent.answer`
    on the final event): its artifacts, else its final status message (or, for a
    finished task sent whole, its last agent message). Progress notes are not part
    of it. An agent that gives neither leaves the answer to what it streamed.

    An agent that asks back (`input-required`, `auth-required`) gives an event with that
    state and its `question` (not final): the caller answers into the same task, or ends.

    Attributes:
        remote_task_id: the remote task's id, once the stream named it (for CancelTask).
        remote_context_id: the remote task's context id, once the stream named it (to answer a question).
    """

    def __init__(self, agent_name: str) -> None:
        self.agent_name = agent_name
        self.remote_task_id: str | None = None
        self.remote_context_id: str | None = None
        self._status_text: list[str] = []
        self._artifact_text: dict[str, str] = {}
        self._last_agent_message = ""

    def read(self, response: StreamResponse) -> list[RemoteEvent]:
        """The events in one stream response (usually one)."""
        kind = response.WhichOneof("payload")
        if kind == "message":
            text = _text_of(response.message.parts) + blocks_of(response.message.parts)
            return [RemoteEvent(text=text), RemoteEvent(state="completed", final=True, answer=text)]
        if kind == "task":
            return self._read_task(response.task)
        if kind == "status_update":
            update = response.status_update
            self._ids(update.task_id, update.context_id)
            return self._read_status(update.status)
        if kind == "artifact_update":
            update = response.artifact_update
            self._ids(update.task_id, update.context_id)
            return self._read_artifact(update.artifact, append=update.append)
        return []

    def _ids(self, task_id: str, context_id: str) -> None:
        self.remote_task_id = task_id or self.remote_task_id
        self.remote_context_id = context_id or self.remote_context_id

    def _read_task(self, task: Task) -> list[RemoteEvent]:
        self._ids(task.id, task.context_id)
        events: list[RemoteEvent] = []
        if task.status.state in PROTO_TERMINAL:  # a non-streaming answer: the finished task at once
            for artifact in task.artifacts:
                events.extend(self._read_artifact(artifact, append=False))
            if not task.artifacts:
                answers = [m for m in task.history if m.role == Role.ROLE_AGENT]
                if answers:
                    self._last_agent_message = _text_of(answers[-1].parts)
                    events.append(RemoteEvent(text=self._last_agent_message))
        events.extend(self._read_status(task.status))
        return events

    def _read_status(self, status: TaskStatus) -> list[RemoteEvent]:
        state = FROM_PROTO.get(status.state)
        text = _text_of(status.message.parts) if status.HasField("message") else ""
        if status.state in PROTO_TERMINAL:
            if state == "completed":
                end = RemoteEvent(state="completed", final=True, answer=self._answer(text))
                return [RemoteEvent(text=text, status_text=True), end] if text else [end]
            if state == "rejected":
                return [
                    RemoteEvent(
                        state="failed",
                        final=True,
                        error=f"{self.agent_name} rejected the task" + (f": {text}" if text else "."),
                    )
                ]
            return [RemoteEvent(state=state, final=True, error=text or None)]
        if status.state in (TaskState.TASK_STATE_INPUT_REQUIRED, TaskState.TASK_STATE_AUTH_REQUIRED):
            return [RemoteEvent(state=state, question=text)]  # the caller answers into the same task (issue 36)
        if text:
            self._status_text.append(text)
        return [RemoteEvent(text=text, state=state, status_text=bool(text))]

    def _read_artifact(self, artifact: Artifact, *, append: bool) -> list[RemoteEvent]:
        text = _text_of(artifact.parts) + blocks_of(artifact.parts)  # files and data as artifact blocks
        if not text:
            return []
        seen = self._artifact_text.get(artifact.artifact_id)
        self._artifact_text[artifact.artifact_id] = (seen or "") + text if append else text
        streamed = "".join(self._status_text)
        if not append and streamed and text.strip() == streamed.strip():
            return []  # the full text of what was streamed already
        if seen is None and len(self._artifact_text) > 1:  # the next artifact: as in the answer (`_answer`)
            text = "\n\n" + text
        return [RemoteEvent(text=text)]

    def _answer(self, final_text: str) -> str | None:
        """The result: the artifacts (in the order they came), else the final message, never both; None: neither.

        An agent that sends its answer as artifacts often ends with a status message that says so again, or
        sums it up ("Here is your plan"): the artifacts are the answer (A2A's own reading), the message is not
        glued to them.
        """
        pieces = [t for t in self._artifact_text.values() if t.strip()]
        if not pieces and final_text.strip():
            pieces.append(final_text)
        if not pieces and self._last_agent_message.strip():
            pieces.append(self._last_agent_message)
        return "\n\n".join(p.strip("\n") for p in pieces) or None


def _text_of(parts: Iterable[Part]) -> str:
    return "".join(p.text for p in parts if p.WhichOneof("content") == "text")


def is_client_error(exc: BaseException) -> bool:
    """True for the SDK client's own failures (HTTP errors, timeouts, JSON-RPC errors from the agent)."""
    return isinstance(exc, A2AClientError | A2AError | httpx.HTTPError)
