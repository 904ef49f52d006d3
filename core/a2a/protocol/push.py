"""Push notifications on the wire (issue 36): configs read and written, the notification's body, both sides.

Server side: a caller's `TaskPushNotificationConfig` (from `CreateTaskPushNotificationConfig` or a
`SendMessage`'s `configuration.taskPushNotificationConfig`; v0.3's `tasks/pushNotificationConfig/*` reach
the same handler methods through the SDK's compat layer) becomes a `PushConfig` of plain values, and one
goes back as the protocol's type. A notification's body is what the SDK's own sender
(`a2a.server.tasks.BasePushNotificationSender`) posts: the `StreamResponse` of the event as ProtoJSON, here
always the whole Task (`{"task": {...}}`), with the config's token in `X-A2A-Notification-Token`.

Client side: a `SendMessage` that asks a remote agent to push to this app, and a received notification read
back into the events of the remote task (`RemoteStreamReader`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from a2a.server.tasks.push_notification_sender import PushNotificationEvent
from a2a.types import (
    AgentCard,
    AuthenticationInfo,
    GetTaskRequest,
    ListTaskPushNotificationConfigsResponse,
    SendMessageRequest,
    StreamResponse,
    Task,
    TaskPushNotificationConfig,
)
from a2a.utils.errors import InvalidParamsError
from a2a.utils.proto_utils import to_stream_response
from google.protobuf.json_format import MessageToDict, ParseDict, ParseError

from core.a2a.protocol.states import FROM_PROTO, PROTO_TERMINAL
from core.a2a.protocol.tasks import TaskSnapshot, to_task

NOTIFICATION_TOKEN_HEADER = "X-A2A-Notification-Token"
MAX_URL_CHARS = 2000
MAX_TOKEN_CHARS = 4000
MAX_CONFIG_ID_CHARS = 128
# v0.3 task states as its senders post them (a bare Task with `kind`), and v1.0's names.
_V03_STATES = {"submitted", "working", "input-required", "completed", "canceled", "failed", "rejected", "auth-required"}


@dataclass(frozen=True, slots=True)
class PushConfig:
    """One push notification config as plain values.

    Attributes:
        config_id: its id within the task (the caller's, or the task id when the caller gave none).
        task_id: the task it is for.
        url: where notifications go (checked against the outbound policy by the caller of `read_push_config`).
        token: sent back in `X-A2A-Notification-Token`, if any.
        auth_scheme: with `auth_credentials`, sent as `Authorization: <scheme> <credentials>`.
    """

    config_id: str
    task_id: str
    url: str
    token: str | None = None
    auth_scheme: str | None = None
    auth_credentials: str | None = None


def read_push_config(params: TaskPushNotificationConfig, *, task_id: str | None = None) -> PushConfig:
    """A create request's config (or a `SendMessage`'s, for the task `task_id` it started), checked for size.

    Raises:
        InvalidParamsError: no URL, not http(s), or a field too long (-32602).
    """
    url = params.url.strip()
    task = task_id or params.task_id
    if not task:
        raise InvalidParamsError(message="A push notification config needs the taskId of the task it is for.")
    if not url:
        raise InvalidParamsError(message="A push notification config needs a url to send the notifications to.")
    if len(url) > MAX_URL_CHARS or not url.lower().startswith(("http://", "https://")):
        raise InvalidParamsError(
            message=f"The push notification url must be an http or https URL of at most {MAX_URL_CHARS} characters."
        )
    if len(params.token) > MAX_TOKEN_CHARS or len(params.authentication.credentials) > MAX_TOKEN_CHARS:
        raise InvalidParamsError(message=f"The push notification token is over {MAX_TOKEN_CHARS} characters.")
    if len(params.id) > MAX_CONFIG_ID_CHARS or len(params.authentication.scheme) > 64:
        raise InvalidParamsError(message=f"The push notification config id is over {MAX_CONFIG_ID_CHARS} characters.")
    has_auth = params.HasField("authentication") and params.authentication.scheme
    if has_auth and params.authentication.scheme.lower() != "bearer":
        raise InvalidParamsError(
            message="Push notifications carry credentials only as 'Bearer' (authentication.scheme); "
            "or send none and check the token (X-A2A-Notification-Token)."
        )
    return PushConfig(
        config_id=params.id or task,
        task_id=task,
        url=url,
        token=params.token or None,
        auth_scheme=params.authentication.scheme if has_auth else None,
        auth_credentials=(params.authentication.credentials or None) if has_auth else None,
    )


def send_push_config(params: SendMessageRequest) -> TaskPushNotificationConfig | None:
    """The push notification config a `SendMessage` carries (`configuration.taskPushNotificationConfig`), if any."""
    if params.HasField("configuration") and params.configuration.HasField("task_push_notification_config"):
        return params.configuration.task_push_notification_config
    return None


def to_push_config(config: PushConfig) -> TaskPushNotificationConfig:
    """The protocol's config (what Create and Get answer)."""
    proto = TaskPushNotificationConfig(id=config.config_id, task_id=config.task_id, url=config.url)
    if config.token:
        proto.token = config.token
    if config.auth_scheme:
        proto.authentication.CopyFrom(
            AuthenticationInfo(scheme=config.auth_scheme, credentials=config.auth_credentials or "")
        )
    return proto


def list_push_configs(configs: list[PushConfig]) -> ListTaskPushNotificationConfigsResponse:
    """What ListTaskPushNotificationConfigs answers (one page: a task has at most a few)."""
    return ListTaskPushNotificationConfigsResponse(configs=[to_push_config(c) for c in configs])


def notification_body(snapshot: TaskSnapshot) -> dict[str, Any]:
    """The JSON a notification posts for a task as it stands: `{"task": {...}}`, as the SDK's sender posts."""
    event: PushNotificationEvent = to_task(snapshot)
    body: dict[str, Any] = MessageToDict(to_stream_response(event))
    return body


# -- client side ------------------------------------------------------------------------------


def ask_for_push(request: SendMessageRequest, *, url: str, token: str, config_id: str) -> SendMessageRequest:
    """The same `SendMessage`, asking the agent to answer at once and push the task's updates to `url`."""
    request.configuration.return_immediately = True
    request.configuration.task_push_notification_config.CopyFrom(
        TaskPushNotificationConfig(id=config_id, url=url, token=token)
    )
    return request


def read_notification(body: Any) -> StreamResponse | None:
    """A received notification as a `StreamResponse`, or None when it is not one.

    v1.0 senders post `{"task"|"statusUpdate"|"artifactUpdate": ...}`; v0.3 ones a bare Task with `kind: "task"`.
    """
    if not isinstance(body, dict):
        return None
    try:
        if body.get("kind") == "task" or ("status" in body and "id" in body):
            return StreamResponse(task=_v03_task(body))
        response = ParseDict(body, StreamResponse(), ignore_unknown_fields=True)
    except (ParseError, ValueError, TypeError, AttributeError):
        return None
    return response if response.WhichOneof("payload") else None


def _v03_task(body: dict[str, Any]) -> Task:
    """A bare Task as a v0.3 sender posts it: states and roles in v0.3's words, parts with `kind`."""
    state = str((body.get("status") or {}).get("state", ""))
    status: dict[str, Any] = {"state": _v1_state(state)}
    message = (body.get("status") or {}).get("message")
    if isinstance(message, dict):
        status["message"] = _v1_message(message)
    artifacts = [
        {"artifactId": str(a.get("artifactId", "")), "parts": _v1_parts(a.get("parts"))}
        for a in body.get("artifacts") or []
        if isinstance(a, dict)
    ]
    history = [_v1_message(m) for m in body.get("history") or [] if isinstance(m, dict)]
    data = {"id": body.get("id"), "contextId": body.get("contextId", ""), "status": status}
    task: Task = ParseDict({**data, "artifacts": artifacts, "history": history}, Task(), ignore_unknown_fields=True)
    return task


def _v1_state(state: str) -> str:
    if state in _V03_STATES:
        return "TASK_STATE_" + state.upper().replace("-", "_")
    return state or "TASK_STATE_UNSPECIFIED"


def _v1_message(message: dict[str, Any]) -> dict[str, Any]:
    role = str(message.get("role", ""))
    role = {"user": "ROLE_USER", "agent": "ROLE_AGENT"}.get(role, role or "ROLE_UNSPECIFIED")
    return {"messageId": str(message.get("messageId", "")), "role": role, "parts": _v1_parts(message.get("parts"))}


def _v1_parts(parts: Any) -> list[dict[str, Any]]:
    return [{"text": p["text"]} for p in parts or [] if isinstance(p, dict) and isinstance(p.get("text"), str)]


def notification_state(response: StreamResponse) -> tuple[str | None, bool]:
    """The remote task's state a notification says (ours, e.g. `completed`), and whether it is terminal."""
    kind = response.WhichOneof("payload")
    if kind == "task":
        status = response.task.status
    elif kind == "status_update":
        status = response.status_update.status
    else:
        return None, False
    return FROM_PROTO.get(status.state), status.state in PROTO_TERMINAL


def notification_task_id(response: StreamResponse) -> str:
    """The remote task's id a notification names ('' when none)."""
    kind = response.WhichOneof("payload")
    if kind == "task":
        return str(response.task.id)
    if kind == "status_update":
        return str(response.status_update.task_id)
    if kind == "artifact_update":
        return str(response.artifact_update.task_id)
    return ""


def offers_push(card: AgentCard) -> bool:
    """Whether a remote agent's card says it sends push notifications."""
    return bool(card.capabilities.push_notifications)


def get_task_request(task_id: str) -> GetTaskRequest:
    """A `GetTask` request (the end of a task that ends by push, read back)."""
    return GetTaskRequest(id=task_id)


def task_response(task: Task) -> StreamResponse:
    """A Task read with GetTask, as the stream response a reader takes."""
    return StreamResponse(task=task)
