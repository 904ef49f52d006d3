"""Delegation (seed 000 §3.2): the `agent_invoke` tool, the tasks behind it, and the one agent registry.

Owns: `DelegationService` (creates a task, runs the callee, local through the chat engine or
remote through its `RemoteAgent` adapter, cancels down the chain), the task records
(`a2a_task_sessions`) and their reads for the panel, the audit view and the API, the
`agent_invoke` tool, the registry of every agent by id (`registry.py`: local ones in the database,
remote ones behind adapters) and the task routes under `/api` (`routes.py`).

May import: `core.chat`, `core.streaming`, `core.auth`, `core.web`, the ground floor and
`models`. The adapters for remote agents live with their protocols (`core.a2a.client`,
`core.broker.connection`) and implement `registry.RemoteAgent`; this package never imports them.
"""

from core.delegation.registry import AgentRegistry, IdTaken, RemoteAgent, RemoteEvent
from core.delegation.service import (
    CANCELED,
    COMPLETED,
    FAILED,
    SUBMITTED,
    TERMINAL_STATES,
    WORKING,
    AgentInvokeTool,
    DelegationRefused,
    DelegationService,
    RemoteAgentError,
    TaskDetail,
    TaskView,
    task_stream_key,
)

__all__ = [
    "CANCELED",
    "COMPLETED",
    "FAILED",
    "SUBMITTED",
    "TERMINAL_STATES",
    "WORKING",
    "AgentInvokeTool",
    "AgentRegistry",
    "DelegationRefused",
    "DelegationService",
    "IdTaken",
    "RemoteAgent",
    "RemoteAgentError",
    "RemoteEvent",
    "TaskDetail",
    "TaskView",
    "task_stream_key",
]
