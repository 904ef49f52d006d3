"""Task states: ours (`a2a_task_sessions.state`, lower case) and the protocol's (`TASK_STATE_*`).

Also the few constants every side of the wire shares (the card's security scheme, the text modes,
the result artifact's id).
"""

from __future__ import annotations

from a2a.types import (
    Task,
    TaskState,
)
from a2a.utils.constants import TransportProtocol

SECURITY_SCHEME = "apiKey"
JSONRPC = TransportProtocol.JSONRPC.value  # the bindings' names on a card (`AgentInterface.protocol_binding`)
HTTP_JSON = TransportProtocol.HTTP_JSON.value
TEXT_MODES = ("text/plain", "text/markdown")
JSON_MODE = "application/json"  # data parts: read as JSON (their text goes to the agent), never written
INPUT_MODES = (*TEXT_MODES, JSON_MODE)
# What the offline demo model answers with: text, its `/data` as a data part, its `/file` as a PNG or text file.
DEMO_OUTPUT_MODES = (*TEXT_MODES, JSON_MODE, "image/png")
RESULT_ARTIFACT_ID = "result"
MAX_MESSAGE_ID_CHARS = 255  # a2a_task_sessions.input_message_id

# Our task states (a2a_task_sessions.state) and the protocol's.
TO_PROTO: dict[str, TaskState] = {
    "submitted": TaskState.TASK_STATE_SUBMITTED,
    "working": TaskState.TASK_STATE_WORKING,
    "completed": TaskState.TASK_STATE_COMPLETED,
    "failed": TaskState.TASK_STATE_FAILED,
    "canceled": TaskState.TASK_STATE_CANCELED,
    "rejected": TaskState.TASK_STATE_REJECTED,
    "input-required": TaskState.TASK_STATE_INPUT_REQUIRED,
    "auth-required": TaskState.TASK_STATE_AUTH_REQUIRED,
}
FROM_PROTO: dict[int, str] = {v: k for k, v in TO_PROTO.items()}
PROTO_TERMINAL = frozenset(
    {
        TaskState.TASK_STATE_COMPLETED,
        TaskState.TASK_STATE_FAILED,
        TaskState.TASK_STATE_CANCELED,
        TaskState.TASK_STATE_REJECTED,
    }
)


def our_state(task: Task) -> str:
    """One of our states for a Task's status (`TASK_STATE_COMPLETED` → `completed`)."""
    return FROM_PROTO.get(task.status.state, "working")


def state_name(state: str) -> str:
    """The protocol's name of one of our states (`completed` → `TASK_STATE_COMPLETED`), for messages."""
    return str(TaskState.Name(TO_PROTO.get(state, TaskState.TASK_STATE_UNSPECIFIED)))
