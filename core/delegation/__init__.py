"""Delegation (seed 000 §3.2): the `agent_invoke` tool, the tasks behind it, and the one agent registry.

Owns: `DelegationService` (`service.py`: creates a task, runs the callee, local through the
chat engine or remote through its `RemoteAgent` adapter, cancels down the chain; `runs.py`: the
record of a callee's run), the task records (`tasks.py`: `a2a_task_sessions`, and their reads for
the panel, the audit view and the API), the `agent_invoke` tool (`tool.py`), the registry of
every agent by id (`registry.py`: local ones in the database, remote ones behind adapters) and
the task routes under `/api` (`routes.py`).

May import: `core.chat`, `core.streaming`, `core.auth`, `core.web`, the ground floor and
`models`. The adapters for remote agents live with their protocols (`core.a2a.client`,
`core.broker.connection`) and implement `registry.RemoteAgent`; this package never imports them.
"""

from core.delegation.registry import AgentRegistry, IdTakenError, RemoteAgent, RemoteAgentError, RemoteEvent
from core.delegation.runs import BackgroundTask
from core.delegation.service import DelegationRefusedError, DelegationService
from core.delegation.states import (
    CONNECTION_LOST,
    STATE_WORDS,
    TIMED_OUT,
    is_terminal,
    short_task_text,
    state_label,
    state_word,
)
from core.delegation.tasks import (
    CANCELED,
    COMPLETED,
    FAILED,
    SUBMITTED,
    TERMINAL_STATES,
    WORKING,
    TaskDetail,
    TaskRecords,
    TaskView,
    task_stream_key,
)
from core.delegation.tool import AgentInvokeTool, InvokeLimits, parse_invoke_arguments

__all__ = [
    "CANCELED",
    "COMPLETED",
    "FAILED",
    "SUBMITTED",
    "TERMINAL_STATES",
    "WORKING",
    "AgentInvokeTool",
    "AgentRegistry",
    "BackgroundTask",
    "DelegationRefusedError",
    "DelegationService",
    "IdTakenError",
    "InvokeLimits",
    "RemoteAgent",
    "RemoteAgentError",
    "RemoteEvent",
    "STATE_WORDS",
    "CONNECTION_LOST",
    "TIMED_OUT",
    "TaskDetail",
    "TaskRecords",
    "TaskView",
    "is_terminal",
    "parse_invoke_arguments",
    "short_task_text",
    "state_label",
    "state_word",
    "task_stream_key",
]
