"""A chat turn and what it needs: the engine, the model gateway, the demo model, tools, the stores.

Owns: `ChatEngine` (one turn per session: claim, save, run, save; `engine.py`), one run of
an agent, the model/tool loop a turn and a delegated task share (`run.py`), the draft that keeps
a running answer through a crash (`drafts.py`), the model gateway over LiteLLM (`llm.py`, the only
module that imports litellm, lazily), which key goes to which model endpoint (`model_route.py`, a
pure rule the gateway applies) and the offline demo model (`demo_model.py`; its LiteLLM provider
`demo_provider.py`), the words the model reads that others must agree on (`prompts.py`), the tool
registry and `ToolContext` (`tools.py`), the `agents` and `agent_sessions`/`agent_messages` stores
(`agents.py`, `sessions.py`), the pages' facade (`workspace.py`) and the chat's routes under `/api`
(`routes.py`).

May import: `core.streaming`, `core.auth`, `core.web`, the ground floor (settings, db) and
`models`. Never `core.delegation`, `core.a2a` or `core.broker`: they build on the chat (a
delegation runs the callee with the engine's `AgentRunner`), not the other way round.
"""

from core.chat.engine import (
    AgentNotFoundError,
    ChatEngine,
    ChatError,
    InvalidMessageError,
    SessionChange,
    SessionNotFoundError,
    TurnInProgressError,
    TurnStarted,
)
from core.chat.llm import LLMError, LLMGateway
from core.chat.run import AgentRun, AgentRunner, TurnOutcome
from core.chat.tools import Tool, ToolContext, ToolFamily, ToolRegistry, ToolResult
from core.chat.workspace import SessionView, Workspace

__all__ = [
    "AgentNotFoundError",
    "AgentRun",
    "AgentRunner",
    "ChatEngine",
    "ChatError",
    "InvalidMessageError",
    "LLMError",
    "LLMGateway",
    "SessionChange",
    "SessionNotFoundError",
    "SessionView",
    "Tool",
    "ToolContext",
    "ToolFamily",
    "ToolRegistry",
    "ToolResult",
    "TurnInProgressError",
    "TurnOutcome",
    "TurnStarted",
    "Workspace",
]
