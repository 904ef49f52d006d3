"""The per-token stream event as plain values (`TextUpdate`) and its JSON written by hand (divergence 4).

`TextUpdate.as_json` and `text_update_json` write exactly what the SDK's `MessageToDict` gives
(tests/test_a2a_wire.py), field by field instead of by reflection.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from a2a.types import (
    Message,
    Part,
    Role,
    TaskState,
    TaskStatus,
    TaskStatusUpdateEvent,
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
        message = agent_message(self.task_id, self.context_id, self.message_id, self.text)
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


def agent_message(task_id: str, context_id: str, message_id: str, text: str) -> Message:
    """An agent's message of one text part (a token, an answer, an error), in a task and context."""
    return Message(
        message_id=message_id, context_id=context_id, task_id=task_id, role=Role.ROLE_AGENT, parts=[Part(text=text)]
    )


def text_update_json(event: Any) -> dict[str, Any] | None:
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
