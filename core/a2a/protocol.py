"""The A2A wire, in one module: everything that knows a2a-sdk 1.3.0's types and helpers.

Why one file of about 740 lines: it is the only module that imports the a2a-sdk, which
is pinned exactly because of divergence 2 below, so an SDK upgrade is read and tested in
one place. Its sections follow the SDK's own split: task states, agent cards and tasks
(server side), the JSON-RPC endpoint (server side), remote agents (client side).

The rest of `core` talks to A2A through plain values: `CardSpec` and
`TaskSnapshot` in, protobuf objects handed straight back to the SDK out
(server side, `core/a2a/server.py`), and `RemoteEvent`s out of a remote
agent's stream (client side, `core/a2a/client.py`). v1.0 ProtoJSON, the v0.3
`kind` objects and the JSON-RPC framing stay inside the SDK, which this module
wraps; v0.3 is served by the SDK's compat adapter on the same URL
(`enable_v0_3_compat=True`) and chosen by its client factory when a card
offers only 0.3.

Importing this module costs about 0.2 s (protobuf, google-api-core), so the
app imports it lazily, never on the path to the first page (`core/a2a/routes.py`).

Divergences from the SDK's usual shape (don't "fix" these):

1. The JSON-RPC endpoint is one route with the agent id in its path, in front
   of one `JsonRpcDispatcher`, instead of `create_jsonrpc_routes` per agent:
   agents come and go at run time, and the route first checks the API key and
   the body size before the dispatcher sees the request.
2. SDK-internal helpers (`JsonRpcDispatcher`, `to_compat_agent_card`,
   `build_error_response`, `parse_agent_card`, `validate_proto_required_fields`)
   are used; they are importable but not in `__all__`, hence the exact pin.
3. A streamed answer's SSE events that are ready at the same moment are written
   to the socket as one chunk (`coalesce_sse`), instead of one write per event.
   Every event stays its own SSE event; what changes is that a burst of tokens
   costs one pass through the ASGI stack (a dozen middlewares, NiceGUI's made
   pure ASGI by `ui/asgi_middlewares.py`, each with its own `send` wrapper)
   instead of one per token. The first event of a burst is never held back.
4. The v1.0 streams write the per-token event (a status update whose message
   holds text) as JSON field by field instead of through `MessageToDict`
   (`_Dispatcher`, which replaces the SDK's `_process_streaming_request`);
   the JSON is exactly the SDK's, and every other event goes the SDK's way.
   For them the request handler does not build that event as protobuf at all:
   it yields a `TextUpdate` (plain values) when the stream's context carries
   `PLAIN_TEXT_UPDATES`, which only `_Dispatcher` sets.
5. One error of the app's own, `TooManyRunningTasksError` (-32029, a code in JSON-RPC's range for
   server errors that A2A, which uses -32001 to -32009, leaves free), is added to the SDK's maps of
   error types to codes, so its dispatcher answers it with that code instead of -32603. The v0.3
   compat adapter knows only v0.3's codes and still says -32603 for it, with the same message.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any
from urllib.parse import urlparse

import httpx
from a2a.client import A2AClientError, Client, ClientConfig, ClientFactory
from a2a.client.card_resolver import parse_agent_card
from a2a.compat.v0_3.conversions import to_compat_agent_card
from a2a.server.context import ServerCallContext
from a2a.server.jsonrpc_models import InvalidRequestError as _JsonRpcInvalidRequest
from a2a.server.jsonrpc_models import JSONParseError as _JsonRpcParseError
from a2a.server.jsonrpc_models import MethodNotFoundError as _JsonRpcMethodNotFound
from a2a.server.request_handlers import response_helpers as _sdk_response_helpers
from a2a.server.request_handlers.request_handler import RequestHandler
from a2a.server.request_handlers.response_helpers import build_error_response
from a2a.server.routes.common import DefaultServerCallContextBuilder
from a2a.server.routes.jsonrpc_dispatcher import JsonRpcDispatcher
from a2a.server.tasks.task_store import TaskStore
from a2a.types import (
    AgentCapabilities,
    AgentCard,
    AgentInterface,
    AgentProvider,
    AgentSkill,
    Artifact,
    CancelTaskRequest,
    HTTPAuthSecurityScheme,
    ListTasksRequest,
    ListTasksResponse,
    Message,
    Part,
    Role,
    SecurityRequirement,
    SecurityScheme,
    SendMessageRequest,
    StreamResponse,
    StringList,
    Task,
    TaskArtifactUpdateEvent,
    TaskState,
    TaskStatus,
    TaskStatusUpdateEvent,
)
from a2a.utils import errors as _sdk_errors
from a2a.utils.constants import (
    AGENT_CARD_WELL_KNOWN_PATH,
    DEFAULT_LIST_TASKS_PAGE_SIZE,
    MAX_LIST_TASKS_PAGE_SIZE,
    PROTOCOL_VERSION_0_3,
    PROTOCOL_VERSION_1_0,
    VERSION_HEADER,
)
from a2a.utils.errors import (
    A2AError,
    ContentTypeNotSupportedError,
    InvalidParamsError,
    PushNotificationNotSupportedError,
    TaskNotCancelableError,
    TaskNotFoundError,
    UnsupportedOperationError,
    VersionNotSupportedError,
)
from a2a.utils.proto_utils import to_stream_response, validate_proto_required_fields
from a2a.utils.task import (
    ListTasksCursor,
    decode_list_tasks_cursor,
    encode_list_tasks_cursor,
    validate_history_length,
    validate_page_size,
)
from a2a.utils.version_validator import validate_version
from google.protobuf.json_format import MessageToDict, ParseDict
from pydantic import ValidationError
from sse_starlette.event import ensure_bytes
from sse_starlette.sse import EventSourceResponse

from core.delegation.registry import RemoteEvent
from core.web.input_limits import MAX_JSON_NESTING, json_error, json_nesting

__all__ = [
    "AGENT_CARD_WELL_KNOWN_PATH",
    "PLAIN_TEXT_UPDATES",
    "VERSION_HEADER",
    "A2AClientError",
    "A2AError",
    "CallContextBuilder",
    "CardError",
    "CardSpec",
    "ContentTypeNotSupportedError",
    "IncomingMessage",
    "InvalidParamsError",
    "ListQuery",
    "ListTasksRequest",
    "ListTasksResponse",
    "PushNotificationNotSupportedError",
    "RemoteStreamReader",
    "RequestHandler",
    "ServerCallContext",
    "SkillSpec",
    "Task",
    "TaskEvents",
    "TaskNotCancelableError",
    "TaskNotFoundError",
    "TaskSnapshot",
    "TooManyRunningTasksError",
    "TaskStore",
    "TextUpdate",
    "UnsupportedOperationError",
    "build_card",
    "card_from_fetched",
    "card_from_json",
    "card_location",
    "card_json",
    "card_summary",
    "card_to_storage",
    "cancel_request",
    "coalesce_sse",
    "create_dispatcher",
    "cursor_time",
    "endpoint_url",
    "invalid_request_body",
    "list_page_token",
    "open_client",
    "our_state",
    "read_history_length",
    "read_list_request",
    "read_send_request",
    "state_name",
    "text_message_request",
    "to_task",
]

SECURITY_SCHEME = "apiKey"
TEXT_MODES = ("text/plain", "text/markdown")
RESULT_ARTIFACT_ID = "result"
MAX_MESSAGE_ID_CHARS = 255  # a2a_task_sessions.input_message_id

# Our task states (a2a_task_sessions.state) and the protocol's.
_TO_PROTO: dict[str, int] = {
    "submitted": TaskState.TASK_STATE_SUBMITTED,
    "working": TaskState.TASK_STATE_WORKING,
    "completed": TaskState.TASK_STATE_COMPLETED,
    "failed": TaskState.TASK_STATE_FAILED,
    "canceled": TaskState.TASK_STATE_CANCELED,
    "rejected": TaskState.TASK_STATE_REJECTED,
    "input-required": TaskState.TASK_STATE_INPUT_REQUIRED,
    "auth-required": TaskState.TASK_STATE_AUTH_REQUIRED,
}
_FROM_PROTO: dict[int, str] = {v: k for k, v in _TO_PROTO.items()}
_PROTO_TERMINAL = frozenset(
    {
        TaskState.TASK_STATE_COMPLETED,
        TaskState.TASK_STATE_FAILED,
        TaskState.TASK_STATE_CANCELED,
        TaskState.TASK_STATE_REJECTED,
    }
)


def our_state(task: Task) -> str:
    """One of our states for a Task's status (`TASK_STATE_COMPLETED` → `completed`)."""
    return _FROM_PROTO.get(task.status.state, "working")


def state_name(state: str) -> str:
    """The protocol's name of one of our states (`completed` → `TASK_STATE_COMPLETED`), for messages."""
    return TaskState.Name(_TO_PROTO.get(state, TaskState.TASK_STATE_UNSPECIFIED))


# -- agent cards (server side) -----------------------------------------------------------


@dataclass(frozen=True, slots=True, kw_only=True)
class SkillSpec:
    """One skill on a card."""

    id: str
    name: str
    description: str
    tags: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True, kw_only=True)
class CardSpec:
    """What a served card says, in plain values.

    Attributes:
        name: the agent's display name.
        description: what it does.
        rpc_url: the absolute URL of its JSON-RPC endpoint (both protocol versions).
        version: the agent's version string.
        provider: who runs it, and `provider_url` where.
        skills: its skills; at least one (the card requires them).
        extra_skills: skills listed on the extended card only (for callers with a key).
        notes: how this server treats requests (e.g. contextIds), after the description.
    """

    name: str
    description: str
    rpc_url: str
    version: str
    provider: str
    provider_url: str
    skills: tuple[SkillSpec, ...]
    extra_skills: tuple[SkillSpec, ...] = ()
    notes: str = ""


def build_card(spec: CardSpec, *, extended: bool = False) -> AgentCard:
    """The agent card: v1.0 and v0.3 JSON-RPC interfaces on one URL, bearer-key security, text in and out."""
    skills = [*spec.skills, *(spec.extra_skills if extended else ())]
    return AgentCard(
        name=spec.name,
        description="\n\n".join(t for t in (spec.description or spec.name, spec.notes) if t),
        version=spec.version,
        provider=AgentProvider(organization=spec.provider, url=spec.provider_url),
        supported_interfaces=[
            AgentInterface(url=spec.rpc_url, protocol_binding="JSONRPC", protocol_version=PROTOCOL_VERSION_1_0),
            AgentInterface(url=spec.rpc_url, protocol_binding="JSONRPC", protocol_version=PROTOCOL_VERSION_0_3),
        ],
        capabilities=AgentCapabilities(streaming=True, push_notifications=False, extended_agent_card=True),
        security_schemes={
            SECURITY_SCHEME: SecurityScheme(
                http_auth_security_scheme=HTTPAuthSecurityScheme(
                    scheme="bearer",
                    bearer_format="API key",
                    description=f"An API key of this app (create one at {spec.provider_url}/api-keys), "
                    "sent as 'Authorization: Bearer <key>'.",
                )
            )
        },
        security_requirements=[SecurityRequirement(schemes={SECURITY_SCHEME: StringList()})],
        default_input_modes=list(TEXT_MODES),
        default_output_modes=list(TEXT_MODES),
        skills=[
            AgentSkill(
                id=s.id,
                name=s.name,
                description=s.description or s.name,
                tags=list(s.tags) or ["agent"],
                input_modes=list(TEXT_MODES),
                output_modes=list(TEXT_MODES),
            )
            for s in skills
        ],
    )


def card_json(card: AgentCard, *, version: str | None = None) -> dict[str, Any]:
    """The card as served, in the shape of the protocol version the client asked for.

    v1.0 (the default): strict ProtoJSON, nothing else, so a strict v1.0 parser reads it.
    The SDK's own serializer (`agent_card_to_dict`) merges the v0.3 fields into it (top-level
    `url`, `protocolVersion`, and `type`/`scheme` inside each security scheme), which such a
    parser rejects. v0.3 (`A2A-Version: 0.3`): the SDK's v0.3 card (`to_compat_agent_card`).

    Args:
        card: the card.
        version: the `A2A-Version` the client sent (header or query parameter), if any.
    """
    if version and version.strip().startswith("0."):
        return to_compat_agent_card(card).model_dump(mode="json", by_alias=True, exclude_none=True)
    return MessageToDict(card)


# -- tasks (server side) ---------------------------------------------------------------


@dataclass(frozen=True, slots=True, kw_only=True)
class TaskSnapshot:
    """A task as our database knows it.

    Attributes:
        id: the task id (`a2a_task_sessions.id`).
        context_id: the A2A context: the task's hidden session id.
        state: one of our states (submitted, working, completed, failed, canceled).
        input: what the caller asked.
        output: the callee's saved answer ('' while it runs).
        error: why it failed or stopped, if it did.
        created_at: when it was created; `updated_at` when its state last changed.
        metadata: extra facts for the client (callee id, tokens, ...).
        input_message_id: the client's `messageId` of the input (None: `<taskId>-in`).
    """

    id: str
    context_id: str
    state: str
    input: str
    output: str
    error: str | None
    created_at: datetime
    updated_at: datetime
    metadata: dict[str, Any] = field(default_factory=dict)
    input_message_id: str | None = None


def to_task(snapshot: TaskSnapshot, *, history_length: int | None = None, artifacts: bool = True) -> Task:
    """The protocol's Task for a snapshot: status, the full answer as artifact, the exchange as history.

    Args:
        snapshot: the task.
        history_length: keep only this many most recent history messages (None: all; 0: none).
        artifacts: whether to include the answer as the `result` artifact (ListTasks' `includeArtifacts`).
    """
    task_id, context_id = snapshot.id, snapshot.context_id
    status = TaskStatus(state=_TO_PROTO.get(snapshot.state, TaskState.TASK_STATE_UNSPECIFIED))
    status.timestamp.FromDatetime(snapshot.updated_at)
    if snapshot.error and snapshot.state in {"failed", "canceled", "rejected"}:
        status.message.CopyFrom(_agent_message(task_id, context_id, f"{task_id}-status", snapshot.error))
    history = [
        Message(
            message_id=snapshot.input_message_id or f"{task_id}-in",
            context_id=context_id,
            task_id=task_id,
            role=Role.ROLE_USER,
            parts=[Part(text=snapshot.input)],
        )
    ]
    if snapshot.output:
        history.append(_agent_message(task_id, context_id, f"{task_id}-out", snapshot.output))
    if history_length is not None:
        history = history[len(history) - history_length :] if history_length > 0 else []
    task = Task(id=task_id, context_id=context_id, status=status, history=history)
    if artifacts and snapshot.output and snapshot.state == "completed":
        task.artifacts.append(
            Artifact(artifact_id=RESULT_ARTIFACT_ID, name="result", parts=[Part(text=snapshot.output)])
        )
    if snapshot.metadata:
        task.metadata.update(snapshot.metadata)
    return task


def read_history_length(params: Any) -> int | None:
    """A request's `historyLength` (GetTask, ListTasks, a send's configuration): None when unset.

    Raises:
        InvalidParamsError: a negative value (-32602).
    """
    if not params.HasField("history_length"):
        return None
    try:
        validate_history_length(params)
    except InvalidParamsError:
        raise InvalidParamsError(
            message=f"historyLength must be 0 or more (got {params.history_length}): 0 for no history, "
            "N for the N most recent messages, or leave it out for all of them."
        ) from None
    return params.history_length


@dataclass(frozen=True, slots=True)
class ListQuery:
    """A `ListTasks` request, checked.

    Attributes:
        page_size: how many tasks at most (1-100, default 50).
        after: the position after which the page starts (None: the first page).
        context_id: only the tasks of this context ('' for any).
        state: only the tasks in this state, one of ours (None for any).
        updated_after: only the tasks whose status changed at or after this time.
        history_length: as in GetTask (None: all).
        artifacts: whether the tasks carry their artifacts (`includeArtifacts`, default false).
    """

    page_size: int
    after: ListTasksCursor | None
    context_id: str
    state: str | None
    updated_after: datetime | None
    history_length: int | None
    artifacts: bool


def read_list_request(params: ListTasksRequest) -> ListQuery:
    """Validate a `ListTasks` request (§3.1.4) with the SDK's own checks, in words a person can act on.

    Raises:
        InvalidParamsError: `pageSize` outside 1-100, a negative `historyLength`, or a `pageToken`
            this server did not hand out (-32602).
    """
    history_length = read_history_length(params)
    page_size = DEFAULT_LIST_TASKS_PAGE_SIZE
    if params.HasField("page_size"):
        try:
            validate_page_size(params.page_size)
        except InvalidParamsError:
            raise InvalidParamsError(
                message=f"pageSize must be between 1 and {MAX_LIST_TASKS_PAGE_SIZE} (got {params.page_size}); "
                f"leave it out for {DEFAULT_LIST_TASKS_PAGE_SIZE}."
            ) from None
        page_size = params.page_size
    after = None
    if params.page_token:
        after = decode_list_tasks_cursor(params.page_token)
        if after is None or after.timestamp_ns is None or len(after.task_id) > 64:
            raise InvalidParamsError(
                message=f"pageToken {params.page_token[:40]!r} is not one this server handed out: pass the "
                "nextPageToken of an earlier ListTasks answer, or none for the first page."
            )
    state = None
    if params.status != TaskState.TASK_STATE_UNSPECIFIED:
        state = _FROM_PROTO.get(params.status, TaskState.Name(params.status))
    updated_after = (
        params.status_timestamp_after.ToDatetime(tzinfo=UTC) if params.HasField("status_timestamp_after") else None
    )
    return ListQuery(
        page_size=page_size,
        after=after,
        context_id=params.context_id,
        state=state,
        updated_after=updated_after,
        history_length=history_length,
        artifacts=params.HasField("include_artifacts") and params.include_artifacts,
    )


def list_page_token(updated_at: datetime, task_id: str) -> str:
    """The `nextPageToken` after a task: its place in the order (status time, then id; both descending)."""
    return encode_list_tasks_cursor(ListTasksCursor(timestamp_ns=_epoch_ns(updated_at), task_id=task_id))


def cursor_time(cursor: ListTasksCursor) -> datetime:
    """The status time a page token names (UTC, microseconds)."""
    return _EPOCH + timedelta(microseconds=(cursor.timestamp_ns or 0) // 1000)


_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


def _epoch_ns(when: datetime) -> int:
    if when.tzinfo is None:
        when = when.replace(tzinfo=UTC)
    delta = when - _EPOCH
    return (delta.days * 86_400 + delta.seconds) * 1_000_000_000 + delta.microseconds * 1000


class TaskEvents:
    """Builds the stream events of one task: text as status updates, the result as an artifact, the end state."""

    def __init__(self, task_id: str, context_id: str) -> None:
        self.task_id = task_id
        self.context_id = context_id
        self._count = 0

    def text(self, delta: str) -> TaskStatusUpdateEvent:
        """A `working` status update carrying the next piece of the answer."""
        return self.text_update(delta).to_proto()

    def text_update(self, delta: str) -> TextUpdate:
        """`text(delta)` as plain values, for a stream that writes it without protobuf (Divergence #4)."""
        self._count += 1
        return TextUpdate(self.task_id, self.context_id, f"{self.task_id}-d{self._count}", delta)

    def state(self, state: str, *, error: str | None = None, when: datetime | None = None) -> TaskStatusUpdateEvent:
        """A status update to `state` (one of ours), with the error as its message when there is one."""
        status = TaskStatus(state=_TO_PROTO.get(state, TaskState.TASK_STATE_UNSPECIFIED))
        if error:
            status.message.CopyFrom(_agent_message(self.task_id, self.context_id, f"{self.task_id}-status", error))
        if when is not None:
            status.timestamp.FromDatetime(when)
        return TaskStatusUpdateEvent(task_id=self.task_id, context_id=self.context_id, status=status)

    def result(self, text: str) -> TaskArtifactUpdateEvent:
        """The full answer, as the task's one artifact."""
        return TaskArtifactUpdateEvent(
            task_id=self.task_id,
            context_id=self.context_id,
            last_chunk=True,
            artifact=Artifact(artifact_id=RESULT_ARTIFACT_ID, name="result", parts=[Part(text=text)]),
        )


@dataclass(frozen=True, slots=True)
class TextUpdate:
    """The per-token stream event (a `working` status update whose message holds one text part), as plain values.

    `TaskEvents.text` builds it as protobuf, and the SDK's dispatcher turns that into JSON: about
    11 µs per token on this project's machine, against under 1 µs to write the same JSON from these
    values (`as_json`). The v1.0 JSON-RPC streams (`_Dispatcher`) ask for it with
    `PLAIN_TEXT_UPDATES`; every other way out (the v0.3 compat layer) gets `to_proto()`.
    """

    task_id: str
    context_id: str
    message_id: str
    text: str

    def to_proto(self) -> TaskStatusUpdateEvent:
        """The SDK's event."""
        message = _agent_message(self.task_id, self.context_id, self.message_id, self.text)
        return TaskStatusUpdateEvent(
            task_id=self.task_id,
            context_id=self.context_id,
            status=TaskStatus(state=TaskState.TASK_STATE_WORKING, message=message),
        )

    def as_json(self) -> dict[str, Any]:
        """Exactly what `MessageToDict(to_stream_response(self.to_proto()))` gives (tests/test_a2a_wire.py).

        As there, an empty id is left out (proto3 does not send a scalar at its default) and the
        text always goes (it is one of a part's `oneof` fields, which are sent when set).
        """
        message: dict[str, Any] = {}
        if self.message_id:
            message["messageId"] = self.message_id
        if self.context_id:
            message["contextId"] = self.context_id
        if self.task_id:
            message["taskId"] = self.task_id
        message["role"] = "ROLE_AGENT"
        message["parts"] = [{"text": self.text}]
        update: dict[str, Any] = {}
        if self.task_id:
            update["taskId"] = self.task_id
        if self.context_id:
            update["contextId"] = self.context_id
        update["status"] = {"state": "TASK_STATE_WORKING", "message": message}
        return {"statusUpdate": update}


#: Set in a stream's `ServerCallContext.state` by the dispatcher that writes `TextUpdate`s itself.
PLAIN_TEXT_UPDATES = "plain_text_updates"


def _agent_message(task_id: str, context_id: str, message_id: str, text: str) -> Message:
    return Message(
        message_id=message_id, context_id=context_id, task_id=task_id, role=Role.ROLE_AGENT, parts=[Part(text=text)]
    )


@dataclass(frozen=True, slots=True)
class IncomingMessage:
    """A `SendMessage` request, read.

    Attributes:
        text: the message's text (text parts, then JSON data parts).
        message_id: the client's id of the message (kept in the task's history).
        task_id: the task it continues, when the client named one.
        context_id: the context the client named, if any.
        return_immediately: answer with the task as soon as it exists instead of waiting for its end.
        history_length: how much history the answer's Task should carry (None: all).
    """

    text: str
    message_id: str
    task_id: str | None
    context_id: str | None
    return_immediately: bool
    history_length: int | None


def read_send_request(params: SendMessageRequest, *, max_chars: int) -> IncomingMessage:
    """Validate a `SendMessage`/`SendStreamingMessage` request and take out what we use.

    Raises:
        InvalidParamsError: a required field is missing, the role is not user, or there is no text.
        ContentTypeNotSupportedError: file parts, or output modes that exclude text.
    """
    validate_proto_required_fields(params)
    message = params.message
    if message.role != Role.ROLE_USER:
        raise InvalidParamsError(message="The message must have role ROLE_USER (v0.3: 'user').")
    pieces: list[str] = []
    for part in message.parts:
        kind = part.WhichOneof("content")
        if kind == "text":
            pieces.append(part.text)
        elif kind == "data":
            pieces.append(json.dumps(MessageToDict(part.data), ensure_ascii=False))
        else:
            raise ContentTypeNotSupportedError(
                message=f"This agent reads text and JSON data parts only; the message has a {kind or 'empty'} part."
            )
    text = "\n".join(p for p in pieces if p.strip()).strip()
    if not text:
        raise InvalidParamsError(message="The message has no text: send at least one non-empty text part.")
    if len(text) > max_chars:
        raise InvalidParamsError(message=f"The message is {len(text):,} characters long; the limit is {max_chars:,}.")
    config = params.configuration
    accepted = list(config.accepted_output_modes)
    if accepted and not any(m in TEXT_MODES or m in {"text/*", "*/*"} for m in accepted):
        raise ContentTypeNotSupportedError(
            message=f"This agent answers in {' or '.join(TEXT_MODES)}; acceptedOutputModes allows only {accepted}."
        )
    if len(message.message_id) > MAX_MESSAGE_ID_CHARS:
        raise InvalidParamsError(
            message=f"The messageId is {len(message.message_id):,} characters long; "
            f"the limit is {MAX_MESSAGE_ID_CHARS}."
        )
    return IncomingMessage(
        text=text,
        message_id=message.message_id,
        task_id=message.task_id or None,
        context_id=message.context_id or None,
        return_immediately=config.return_immediately,
        history_length=read_history_length(config),
    )


# -- the JSON-RPC endpoint (server side) --------------------------------------------------

TOO_MANY_RUNNING_TASKS_CODE = -32029


class TooManyRunningTasksError(A2AError):
    """The caller's user has as many delegated tasks running as one account may (divergence 5).

    `data` carries `{"code": "too_many_running_tasks", "retryAfterSeconds": n}` for scripts.
    """

    message = "Too many running tasks"


def _register_app_error(error: type[A2AError], code: int, reason: str) -> None:
    _sdk_errors.JSON_RPC_ERROR_CODE_MAP[error] = code
    _sdk_errors.A2A_ERROR_REASONS[error] = reason
    _sdk_response_helpers.EXCEPTION_MAP[error] = _sdk_response_helpers.JSONRPCError


_register_app_error(TooManyRunningTasksError, TOO_MANY_RUNNING_TASKS_CODE, "TOO_MANY_RUNNING_TASKS")


class CallContextBuilder(DefaultServerCallContextBuilder):
    """The SDK's call context plus who is calling which agent (`state['agent_id']`, `state['user_id']`).

    The route puts both on `request.state` after checking the API key; the v0.3 adapter
    wraps this builder, so both protocol generations see the same context.
    """

    def build(self, request: Any) -> ServerCallContext:
        """The context of one request."""
        context = super().build(request)
        context.state["agent_id"] = request.path_params.get("agent_id", "")
        context.state["user_id"] = getattr(request.state, "a2a_user_id", None)
        return context


def create_dispatcher(handler: RequestHandler) -> JsonRpcDispatcher:
    """The SDK's JSON-RPC dispatcher over `handler`: v1.0 methods, and v0.3 ones on the same URL."""
    return _Dispatcher(request_handler=handler, context_builder=CallContextBuilder(), enable_v0_3_compat=True)


class _Dispatcher(JsonRpcDispatcher):
    """The SDK's dispatcher, whose v1.0 streams write text status updates without protobuf's reflection.

    Divergence #4: the SDK turns every stream event into JSON with `MessageToDict`, which walks
    the message by reflection: 39 µs per token on this project's machine against 8 µs written by
    hand, the largest part of what an A2A token cost over a chat token. `_stream_result` writes the
    one shape sent per token (`TaskEvents.text`) field by field, to exactly what `MessageToDict`
    gives (tests/test_a2a_wire.py); every other event goes the SDK's way. Apart from that mapping,
    this is the SDK's own method (a2a-sdk 1.3.0).
    """

    @validate_version(PROTOCOL_VERSION_1_0)
    async def _process_streaming_request(
        self, request_id: str | int | None, request_obj: Any, context: ServerCallContext
    ) -> Any:
        method = context.state.get("method")
        context.state[PLAIN_TEXT_UPDATES] = True  # `_stream_result` writes them
        if method == "SendStreamingMessage":
            stream = self.request_handler.on_message_send_stream(request_obj, context)
        elif method == "SubscribeToTask":
            stream = self.request_handler.on_subscribe_to_task(request_obj, context)
        else:
            raise UnsupportedOperationError(message="Stream not supported")
        try:  # the first event now, as the SDK does: a refusal is an error response, not a stream
            first = await anext(stream)
        except StopAsyncIteration:
            first = None
        return _stream_results(request_id, stream, first)


async def _stream_results(request_id: str | int | None, stream: Any, first: Any) -> Any:
    try:
        if first is not None:
            yield _stream_result(request_id, first)
        async for event in stream:
            yield _stream_result(request_id, event)
    except A2AError as exc:
        yield build_error_response(request_id, exc)


def _stream_result(request_id: str | int | None, event: Any) -> dict[str, Any]:
    """The JSON-RPC response that carries one stream event, as the SDK writes it."""
    if type(event) is TextUpdate:
        return {"result": event.as_json(), "id": request_id, "jsonrpc": "2.0"}
    result = _text_update_json(event)
    if result is None:
        result = MessageToDict(to_stream_response(event), preserving_proto_field_name=False)
    return {"result": result, "id": request_id, "jsonrpc": "2.0"}


def _text_update_json(event: Any) -> dict[str, Any] | None:
    """A status update whose message holds text only, as `MessageToDict` writes it; None for anything else.

    Only the fields that are set are written (`ListFields`, in field-number order), as
    `MessageToDict` does; a field this does not know (a timestamp, metadata, another kind
    of part) sends the event the SDK's way.
    """
    if type(event) is not TaskStatusUpdateEvent:
        return None
    update: dict[str, Any] = {}
    for proto_field, value in event.ListFields():
        if proto_field.name == "status":
            status = _status_json(value)
            if status is None:
                return None
            update["status"] = status
        elif proto_field.name in ("task_id", "context_id"):
            update[proto_field.json_name] = value
        else:
            return None
    return {"statusUpdate": update}


def _status_json(status: TaskStatus) -> dict[str, Any] | None:
    written: dict[str, Any] = {}
    for proto_field, value in status.ListFields():
        if proto_field.name == "state":
            written["state"] = TaskState.Name(value)
        elif proto_field.name == "message":
            message = _text_message_json(value)
            if message is None:
                return None
            written["message"] = message
        else:
            return None
    return written


def _text_message_json(message: Message) -> dict[str, Any] | None:
    written: dict[str, Any] = {}
    for proto_field, value in message.ListFields():
        if proto_field.name in ("message_id", "context_id", "task_id"):
            written[proto_field.json_name] = value
        elif proto_field.name == "role":
            written["role"] = Role.Name(value)
        elif proto_field.name == "parts":
            parts = []
            for part in value:
                set_fields = part.ListFields()
                if len(set_fields) != 1 or set_fields[0][0].name != "text":
                    return None
                parts.append({"text": set_fields[0][1]})
            written["parts"] = parts
        else:
            return None
    return written


_HOP_HEADERS = {
    "content-type",
    "content-length",
    "transfer-encoding",
    "cache-control",
    "x-accel-buffering",
    "connection",
}


def coalesce_sse(response: Any) -> Any:
    """Serve the SDK's SSE stream through the app's SSE module (`core.streaming.sse.SSEResponse`).

    It brings its headers, keep-alive, write timeout and disconnect handling; events that are ready
    together are written together (Divergence #3). Other responses pass through.
    """
    if isinstance(response, EventSourceResponse):
        from core.streaming.sse import SSEResponse

        headers = {k: v for k, v in response.headers.items() if k.lower() not in _HOP_HEADERS}
        return SSEResponse(_coalesced(response.body_iterator, response.sep), headers=headers)
    return response


_END_OF_STREAM = object()
MAX_EVENTS_PER_WRITE = 512


async def _coalesced(source: Any, sep: str) -> Any:
    """`source`'s SSE events, joined into one bytes chunk per burst of events that were ready together."""
    ready: asyncio.Queue[Any] = asyncio.Queue(maxsize=MAX_EVENTS_PER_WRITE)
    failure: list[BaseException] = []

    async def pump() -> None:
        try:
            async for item in source:
                await ready.put(item)
        except Exception as exc:  # handed to the writer, which raises it where sse-starlette expects it
            failure.append(exc)
        finally:
            with contextlib.suppress(Exception):
                await source.aclose()
        await ready.put(_END_OF_STREAM)  # not when cancelled: then nobody reads any more

    # A plain task, not BackgroundTasks: it lives exactly as long as this response's stream.
    pumping = asyncio.get_running_loop().create_task(pump(), name="a2a sse pump")
    try:
        while True:
            item = await ready.get()
            if item is _END_OF_STREAM:
                break
            chunks = [ensure_bytes(item, sep)]
            while not ready.empty():
                item = ready.get_nowait()
                if item is _END_OF_STREAM:
                    break
                chunks.append(ensure_bytes(item, sep))
            yield b"".join(chunks)
            if item is _END_OF_STREAM:
                break
        if failure:
            raise failure[0]
    finally:
        pumping.cancel()  # the client went away: the source closes (and releases its hub subscription)


def invalid_request_body(message: str, request_id: str | int | None = None) -> dict[str, Any]:
    """A JSON-RPC error body (-32600) for requests refused before dispatch (no key, too large)."""
    return build_error_response(request_id, _JsonRpcInvalidRequest(message=message))


def check_rpc_body(body: bytes, dispatcher: JsonRpcDispatcher, version: str | None = None) -> dict[str, Any] | None:
    """A JSON-RPC error body for a request the SDK's dispatcher would answer with -32603, or None.

    `version` is the request's `A2A-Version` header (see `_version_refusal`).

    The dispatcher turns a body that is not UTF-8, nests thousands of levels deep or holds a
    number of thousands of digits into an "internal error" with Python's text (and a traceback in
    the log), and says only "Method not found". Here these get their own codes and a message a
    person can act on: -32700 for the first three, -32601 naming the method and the ones there are.
    """
    try:
        text = body.decode("utf-8")
    except UnicodeDecodeError:
        return build_error_response(None, _JsonRpcParseError(message="Parse error: the body is not UTF-8 text."))
    try:
        obj = json.loads(text)
    except RecursionError:
        obj = None
        nested_too_deep = True
    except json.JSONDecodeError:
        return None  # the dispatcher answers -32700 with the position of the mistake
    except ValueError as exc:
        return build_error_response(None, _JsonRpcParseError(message=f"Parse error: {json_error(exc)}."))
    else:
        nested_too_deep = json_nesting(obj) > MAX_JSON_NESTING
    if nested_too_deep:
        return build_error_response(
            None, _JsonRpcParseError(message=f"Parse error: the JSON nests more than {MAX_JSON_NESTING} levels deep.")
        )
    method = obj.get("method") if isinstance(obj, dict) else None
    if not isinstance(method, str) or not method:
        return None
    request_id = obj.get("id") if isinstance(obj.get("id"), str | int) and not isinstance(obj.get("id"), bool) else None
    if not _serves(dispatcher, method):
        known = ", ".join(sorted(dispatcher.METHOD_TO_MODEL))
        return build_error_response(
            request_id,
            _JsonRpcMethodNotFound(
                message=f"Method not found: {method[:80]!r}. This server serves {known} (and their v0.3 names)."
            ),
        )
    refusal = _version_refusal(method, method in dispatcher.METHOD_TO_MODEL, version, request_id)
    if refusal is not None:
        return refusal
    params = obj.get("params")
    if (
        method == "ListTasks"
        and isinstance(params, dict)
        and isinstance(params.get("status"), str)
        and params["status"] not in TaskState.keys()
    ):
        return build_error_response(
            request_id,
            InvalidParamsError(
                message=f"status {params['status'][:40]!r} is not a task state; use one of "
                f"{', '.join(k for k in TaskState.keys() if k != 'TASK_STATE_UNSPECIFIED')}."
            ),
        )
    if method in dispatcher.METHOD_TO_MODEL:
        return _v1_invalid_params(dispatcher, method, params, request_id)
    return _v03_invalid_params(dispatcher, method, obj, request_id)


MAX_PARSE_ERROR_CHARS = 300

# Each v1.0 method's v0.3 name (ListTasks has none), for a refusal to point to the one to call.
V03_NAMES = {
    "SendMessage": "message/send",
    "SendStreamingMessage": "message/stream",
    "GetTask": "tasks/get",
    "CancelTask": "tasks/cancel",
    "SubscribeToTask": "tasks/resubscribe",
    "CreateTaskPushNotificationConfig": "tasks/pushNotificationConfig/set",
    "GetTaskPushNotificationConfig": "tasks/pushNotificationConfig/get",
    "ListTaskPushNotificationConfigs": "tasks/pushNotificationConfig/list",
    "DeleteTaskPushNotificationConfig": "tasks/pushNotificationConfig/delete",
    "GetExtendedAgentCard": "agent/getAuthenticatedExtendedCard",
}
V1_NAMES = {v03: v1 for v1, v03 in V03_NAMES.items()}


def _version_refusal(
    method: str, is_v1: bool, asked: str | None, request_id: str | int | None
) -> dict[str, Any] | None:
    """-32009 (VersionNotSupportedError) for a method asked for under a protocol version it is not of, or None.

    The version asked for is the `A2A-Version` header, 0.3 without one (the spec's rule); it fits a
    method when the major numbers agree, as in the SDK's `validate_version` (1.2 is served as 1.0).
    The SDK refuses the same requests, but its v0.3 adapter says -32603 (v0.3 had no -32009) and
    neither says which version the method is of. The answer names it, and the method's name in
    the version asked for.
    """
    sent = (asked or "").strip()
    asked = sent or PROTOCOL_VERSION_0_3
    own, other = (PROTOCOL_VERSION_1_0, PROTOCOL_VERSION_0_3) if is_v1 else (PROTOCOL_VERSION_0_3, PROTOCOL_VERSION_1_0)
    if _same_major(asked, own):
        return None
    message = f"{method} is a method of A2A {own}, but the request asks for A2A {asked[:20]!r}"
    if not _same_major(asked, other):
        message += f", which this server does not speak (it speaks {PROTOCOL_VERSION_1_0} and {PROTOCOL_VERSION_0_3})"
    elif not sent:
        message += " (no A2A-Version header means 0.3)"
    message += f". Expected version {own!r}: send 'A2A-Version: {own}'" + ("" if is_v1 else " or none")
    equivalent = (V03_NAMES if is_v1 else V1_NAMES).get(method)
    if equivalent and _same_major(asked, other):
        message += f", or call {equivalent}, its A2A {other} name"
    return build_error_response(request_id, VersionNotSupportedError(message=message + "."))


def _same_major(asked: str, version: str) -> bool:
    major = asked.split(".", 1)[0]
    return asked == version or (major.isascii() and major.isdigit() and int(major) == int(version.split(".")[0]))


def _v1_invalid_params(
    dispatcher: JsonRpcDispatcher, method: str, params: Any, request_id: str | int | None
) -> dict[str, Any] | None:
    """-32602 naming the field for v1.0 `params` that do not parse, or None.

    The SDK's dispatcher answers them with a bare "Invalid params" (the reason only in `data`)
    and logs a traceback, as for a fault of the server. Parsed the same way here (unknown
    fields ignored), the answer says which field and why.
    """
    try:
        ParseDict(
            params if params is not None else {}, dispatcher.METHOD_TO_MODEL[method](), ignore_unknown_fields=True
        )
    except Exception as exc:  # protobuf's ParseError, or a TypeError for params that are not an object
        reason = str(exc).strip() or type(exc).__name__
        if len(reason) > MAX_PARSE_ERROR_CHARS:
            reason = reason[: MAX_PARSE_ERROR_CHARS - 1] + "…"
        return build_error_response(request_id, InvalidParamsError(message=f"Invalid params for {method}: {reason}"))
    return None


def _v03_invalid_params(
    dispatcher: JsonRpcDispatcher, method: str, obj: dict[str, Any], request_id: str | int | None
) -> dict[str, Any] | None:
    """-32602 for a v0.3 request whose `params` do not validate, or None.

    The SDK's v0.3 adapter validates the whole request with its pydantic model and answers
    any mistake with -32600 (invalid request) and a traceback in the log; JSON-RPC 2.0 §5.1
    says invalid method parameters are -32602. A mistake outside `params` (the envelope)
    stays the adapter's -32600.
    """
    compat = getattr(dispatcher, "_v03_adapter", None)
    model = getattr(compat, "METHOD_TO_MODEL", {}).get(method) if compat is not None else None
    if model is None:
        return None
    try:
        model.model_validate(obj)
    except ValidationError as exc:
        errors = exc.errors()
        if not errors or any(not e["loc"] or e["loc"][0] != "params" for e in errors):
            return None
        described = "; ".join(f"{'.'.join(str(x) for x in e['loc'])}: {e['msg']}" for e in errors[:5])
        return build_error_response(
            request_id, InvalidParamsError(message=f"Invalid params for {method}: {described}.")
        )
    return None


def _serves(dispatcher: JsonRpcDispatcher, method: str) -> bool:
    compat = getattr(dispatcher, "_v03_adapter", None)  # the SDK's v0.3 adapter (enable_v0_3_compat)
    return method in dispatcher.METHOD_TO_MODEL or bool(compat is not None and compat.supports_method(method))


# -- remote agents (client side) -----------------------------------------------------------


class CardError(ValueError):
    """A card that cannot be fetched or used; the message says what is wrong and where."""


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
    usable = [
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
    return MessageToDict(card)


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
        "skills": [
            {"id": s.id, "name": s.name, "description": s.description, "tags": list(s.tags)} for s in card.skills
        ],
    }


def open_client(card: AgentCard, http: httpx.AsyncClient) -> Client:
    """A client for the card's best interface (v1.0 first, else v0.3 through the SDK's compat transport).

    The client uses `http` and does not close it.
    """
    return ClientFactory(ClientConfig(httpx_client=http, streaming=True)).create(card)


def text_message_request(text: str, *, message_id: str, context_id: str | None = None) -> SendMessageRequest:
    """A `SendMessage` request carrying one text part from the user."""
    message = Message(message_id=message_id, role=Role.ROLE_USER, parts=[Part(text=text)])
    if context_id:
        message.context_id = context_id
    return SendMessageRequest(message=message)


def cancel_request(task_id: str) -> CancelTaskRequest:
    """A `CancelTask` request."""
    return CancelTaskRequest(id=task_id)


class RemoteStreamReader:
    """Turns one remote task's stream (the SDK's `StreamResponse`s) into `RemoteEvent`s.

    Agents stream in two styles: text in `working` status messages (ours, and
    many SDK agents), or the answer as artifacts (whole or in appended chunks).
    Both are shown as they come (the side panel). An artifact that only repeats
    the text already streamed as status messages (what this app's own server
    sends at the end) is not shown again; any other artifact is, after a blank
    line when status text came first.

    The task's result is its answer as an A2A client reads it (`RemoteEvent.answer`
    on the final event): its artifacts, else its final status message (or, for a
    finished task sent whole, its last agent message). Progress notes are not part
    of it. An agent that gives neither leaves the answer to what it streamed.

    Attributes:
        remote_task_id: the remote task's id, once the stream named it (for CancelTask).
    """

    def __init__(self, agent_name: str) -> None:
        self.agent_name = agent_name
        self.remote_task_id: str | None = None
        self._status_text: list[str] = []
        self._artifact_text: dict[str, str] = {}
        self._last_agent_message = ""

    def read(self, response: StreamResponse) -> list[RemoteEvent]:
        """The events in one stream response (usually one)."""
        kind = response.WhichOneof("payload")
        if kind == "message":
            text = _text_of(response.message.parts)
            return [RemoteEvent(text=text), RemoteEvent(state="completed", final=True, answer=text)]
        if kind == "task":
            return self._read_task(response.task)
        if kind == "status_update":
            update = response.status_update
            self.remote_task_id = update.task_id or self.remote_task_id
            return self._read_status(update.status)
        if kind == "artifact_update":
            update = response.artifact_update
            self.remote_task_id = update.task_id or self.remote_task_id
            return self._read_artifact(update.artifact, append=update.append)
        return []

    def _read_task(self, task: Task) -> list[RemoteEvent]:
        self.remote_task_id = task.id or self.remote_task_id
        events: list[RemoteEvent] = []
        if task.status.state in _PROTO_TERMINAL:  # a non-streaming answer: the finished task at once
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
        state = _FROM_PROTO.get(status.state)
        text = _text_of(status.message.parts) if status.HasField("message") else ""
        if status.state in _PROTO_TERMINAL:
            if state == "completed":
                end = RemoteEvent(state="completed", final=True, answer=self._answer(text))
                return [RemoteEvent(text=text), end] if text else [end]
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
            # A delegation cannot answer back; what the agent asked is its answer.
            return [RemoteEvent(text=text), RemoteEvent(state="completed", final=True, answer=self._answer(text))]
        if text:
            self._status_text.append(text)
        return [RemoteEvent(text=text, state=state)]

    def _read_artifact(self, artifact: Artifact, *, append: bool) -> list[RemoteEvent]:
        text = _text_of(artifact.parts)
        if not text:
            return []
        seen = self._artifact_text.get(artifact.artifact_id)
        self._artifact_text[artifact.artifact_id] = (seen or "") + text if append else text
        streamed = "".join(self._status_text)
        if not append and streamed and text.strip() == streamed.strip():
            return []  # the full text of what was streamed already
        if seen is None and streamed and not streamed.endswith("\n"):
            text = "\n\n" + text
        return [RemoteEvent(text=text)]

    def _answer(self, final_text: str) -> str | None:
        """The result: the artifacts (in the order they came), then the final message; None when neither."""
        pieces = [t for t in self._artifact_text.values() if t.strip()]
        if final_text.strip() and final_text not in pieces:
            pieces.append(final_text)
        if not pieces and self._last_agent_message.strip():
            pieces.append(self._last_agent_message)
        return "\n\n".join(p.strip("\n") for p in pieces) or None


def _text_of(parts: Iterable[Part]) -> str:
    return "".join(p.text for p in parts if p.WhichOneof("content") == "text")


def is_client_error(exc: BaseException) -> bool:
    """True for the SDK client's own failures (HTTP errors, timeouts, JSON-RPC errors from the agent)."""
    return isinstance(exc, A2AClientError | A2AError | httpx.HTTPError)
