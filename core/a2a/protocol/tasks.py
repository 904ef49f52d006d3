"""Tasks (server side): our tasks as the protocol's, the requests that name them, their events.

A task as our database knows it (`TaskSnapshot`) becomes the protocol's `Task`; `SendMessage` and
`ListTasks` requests are read and checked; `TaskEvents` builds the events of one task's stream.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

from a2a.types import (
    Artifact,
    ListTasksRequest,
    Message,
    Part,
    Role,
    SendMessageRequest,
    Task,
    TaskArtifactUpdateEvent,
    TaskState,
    TaskStatus,
    TaskStatusUpdateEvent,
)
from a2a.utils.constants import (
    DEFAULT_LIST_TASKS_PAGE_SIZE,
    MAX_LIST_TASKS_PAGE_SIZE,
)
from a2a.utils.errors import (
    ContentTypeNotSupportedError,
    InvalidParamsError,
)
from a2a.utils.proto_utils import validate_proto_required_fields
from a2a.utils.task import (
    ListTasksCursor,
    decode_list_tasks_cursor,
    encode_list_tasks_cursor,
    validate_history_length,
    validate_page_size,
)
from google.protobuf.json_format import MessageToDict

from core.a2a.protocol.parts import answer_parts, json_value
from core.a2a.protocol.states import FROM_PROTO, MAX_MESSAGE_ID_CHARS, RESULT_ARTIFACT_ID, TEXT_MODES, TO_PROTO
from core.a2a.protocol.text_updates import TextUpdate, agent_message
from core.chat.artifacts import split_blocks


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


def to_task(
    snapshot: TaskSnapshot, *, history_length: int | None = None, artifacts: bool = True, question: str | None = None
) -> Task:
    """The protocol's Task for a snapshot: status, the full answer as artifact, the exchange as history.

    Args:
        snapshot: the task.
        question: what the agent asks, the status message of a task in `input-required` / `auth-required`.
        history_length: keep only this many most recent history messages (None: all; 0: none).
        artifacts: whether to include the answer as the `result` artifact (ListTasks' `includeArtifacts`).
    """
    task_id, context_id = snapshot.id, snapshot.context_id
    status = TaskStatus(state=TO_PROTO.get(snapshot.state, TaskState.TASK_STATE_UNSPECIFIED))
    status.timestamp.FromDatetime(snapshot.updated_at)
    if snapshot.error and snapshot.state in {"failed", "canceled", "rejected"}:
        status.message.CopyFrom(agent_message(task_id, context_id, f"{task_id}-status", snapshot.error))
    elif question and snapshot.state in {"input-required", "auth-required"}:
        status.message.CopyFrom(agent_message(task_id, context_id, f"{task_id}-question", question))
    history = [
        Message(
            message_id=snapshot.input_message_id or f"{task_id}-in",
            context_id=context_id,
            task_id=task_id,
            role=Role.ROLE_USER,
            parts=[Part(text=snapshot.input)],
        )
    ]
    said = split_blocks(snapshot.output)[0] if snapshot.output else ""  # files and data: in the artifact only
    if said:
        history.append(agent_message(task_id, context_id, f"{task_id}-out", said))
    if history_length is not None:
        history = history[len(history) - history_length :] if history_length > 0 else []
    task = Task(id=task_id, context_id=context_id, status=status, history=history)
    if artifacts and snapshot.output and snapshot.state == "completed":
        task.artifacts.append(
            Artifact(artifact_id=RESULT_ARTIFACT_ID, name="result", parts=answer_parts(snapshot.output))
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
    history_length: int = params.history_length
    return history_length


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
        state = FROM_PROTO.get(params.status, TaskState.Name(params.status))
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
        status = TaskStatus(state=TO_PROTO.get(state, TaskState.TASK_STATE_UNSPECIFIED))
        if error:
            status.message.CopyFrom(agent_message(self.task_id, self.context_id, f"{self.task_id}-status", error))
        if when is not None:
            status.timestamp.FromDatetime(when)
        return TaskStatusUpdateEvent(task_id=self.task_id, context_id=self.context_id, status=status)

    def result(self, text: str) -> TaskArtifactUpdateEvent:
        """The full answer, as the task's one artifact."""
        return TaskArtifactUpdateEvent(
            task_id=self.task_id,
            context_id=self.context_id,
            last_chunk=True,
            artifact=Artifact(artifact_id=RESULT_ARTIFACT_ID, name="result", parts=answer_parts(text)),
        )


@dataclass(frozen=True, slots=True)
class IncomingFile:
    """A file part sent to a served agent, with its bytes."""

    name: str
    mime: str
    data: bytes


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
        files: its file parts with bytes (a file part that is a link is named in `text`, not fetched).
    """

    text: str
    message_id: str
    task_id: str | None
    context_id: str | None
    return_immediately: bool
    history_length: int | None
    files: tuple[IncomingFile, ...] = ()


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
    files: list[IncomingFile] = []
    for part in message.parts:
        kind = part.WhichOneof("content")
        if kind == "text":
            pieces.append(part.text)
        elif kind == "data":
            pieces.append(json.dumps(json_value(MessageToDict(part.data)), ensure_ascii=False))
        elif kind == "raw":
            files.append(IncomingFile(part.filename or "file", part.media_type or "application/octet-stream", part.raw))
        elif kind == "url":  # not fetched: named, so the agent knows of it
            pieces.append(
                f"Attached file: {part.filename or 'file'} ({part.media_type or 'unknown type'}) at {part.url}"
            )
        else:
            raise ContentTypeNotSupportedError(
                message="This agent reads text, JSON data and file parts; the message has an empty part."
            )
    text = "\n".join(p for p in pieces if p.strip()).strip() or ", ".join(f.name for f in files)
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
        files=tuple(files),
    )
