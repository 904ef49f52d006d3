"""The tool registry: what an agent may call, and the context a call runs in.

A tool has a type (`agent-invoke`, as stored in `agent_tools.tool_type`), a
function name the model sees (`agent_invoke`), a JSON schema for its input and
an `execute` coroutine. An agent's tools are the registered tools named by its
enabled `agent_tools` rows, each with that row's JSON config.

A tool family is a tool type that stands for several functions, decided when a
turn starts: `a2a-dispatch` gives one `a2a_<id>` function per broker agent the
calling agent may see (seed 003), so the set follows the agents online.

Tools never raise into the chat engine for bad input: they return a failed
`ToolResult` whose `error` the model reads and can act on (seed 000 §3.4).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from core.streaming.events import Event

log = logging.getLogger(__name__)


class CallTurnstile:
    """Lets the parallel tool calls of one model step start in the order the model made them.

    A tool that announces something (a delegation's `a2a-task-started`) waits for its turn,
    announces, then releases; the calls still run concurrently after that. The engine
    releases every call when it ends, so a tool that never asks costs nothing.
    """

    def __init__(self, previous: CallTurnstile | None = None) -> None:
        self._previous = previous
        self._released = asyncio.Event()

    async def wait(self) -> None:
        """Until the call before this one has released (or ended)."""
        if self._previous is not None:
            await self._previous._released.wait()

    def release(self) -> None:
        """Let the next call go ahead."""
        self._released.set()

    @staticmethod
    def chain(count: int) -> list[CallTurnstile]:
        """`count` turnstiles, each waiting for the one before."""
        gates: list[CallTurnstile] = []
        for _ in range(count):
            gates.append(CallTurnstile(gates[-1] if gates else None))
        return gates


@dataclass(frozen=True, slots=True)
class ToolContext:
    """Who is calling (seed 000 §3.2.4 `ToolContext`, with `sessionId`).

    Attributes:
        user_id: the user who owns the conversation.
        agent_id: the calling agent (database id); None for a caller outside the app (an A2A client).
        agent_slug: the calling agent's registry id ("" outside the app).
        session_id: the caller's session (its stream buffer receives `a2a-task-started`); None outside the app.
        recursion_depth: 0 for a user's own turn, n inside the n-th nested delegation.
        tool_call_id: the model's id for this call.
        task_id: the delegated task this turn runs in, if any.
        chain: registry ids of the agents on the current delegation chain, outermost first.
        emit: pushes an extra event into the caller's turn stream (e.g. `events.TaskStarted`).
        turnstile: orders the start of this step's parallel calls (see `CallTurnstile`).
        files: refs of the files a caller outside the app sent with its message (an A2A client's file parts).
    """

    user_id: int
    agent_id: int | None
    agent_slug: str
    session_id: str | None
    recursion_depth: int = 0
    tool_call_id: str = ""
    task_id: str | None = None
    chain: tuple[str, ...] = ()
    emit: Callable[[Event], Awaitable[None]] | None = None
    turnstile: CallTurnstile | None = None
    files: tuple[dict[str, Any], ...] = ()


@dataclass(slots=True)
class ToolResult:
    """The outcome the model sees (as JSON) and the UI shows."""

    success: bool
    data: Any = None
    error: str | None = None
    metadata: dict[str, Any] = field(default_factory=dict)

    def for_model(self) -> dict[str, Any]:
        """The JSON object sent back to the model as the tool message."""
        if self.success:
            return {"ok": True, "output": self.data, **_public(self.metadata)}
        return {"ok": False, "error": self.error or "the tool failed", **_public(self.metadata)}


def _public(metadata: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in metadata.items() if k in {"agentSlug", "taskId", "background"}}


class Tool(Protocol):
    """What a tool implements (read-only members: a plain attribute or a property both do)."""

    @property
    def tool_type(self) -> str:
        """The `agent_tools.tool_type` it is enabled by."""
        ...

    @property
    def name(self) -> str:
        """The name the model calls it by."""
        ...

    @property
    def description(self) -> str:
        """What the model is told it does."""
        ...

    @property
    def parameters(self) -> dict[str, Any]:
        """The JSON Schema of its arguments."""
        ...

    async def execute(self, arguments: Any, config: dict[str, Any], ctx: ToolContext) -> ToolResult:
        """Run the call. Must not raise for bad `arguments`; return a failed result instead."""
        ...


@dataclass(frozen=True, slots=True)
class BoundTool:
    """A registered tool with one agent's config for it."""

    tool: Tool
    config: dict[str, Any]

    @property
    def name(self) -> str:
        """The function name the model calls."""
        return self.tool.name

    def definition(self) -> dict[str, Any]:
        """The OpenAI-style function definition sent to the model."""
        return {
            "type": "function",
            "function": {
                "name": self.tool.name,
                "description": self.tool.description,
                "parameters": self.tool.parameters,
            },
        }


class ToolFamily(Protocol):
    """A tool type whose functions are decided per agent when a turn starts."""

    tool_type: str

    def tools_for(self, agent_id: int | None, agent_slug: str) -> Sequence[Tool]:
        """The functions this family offers to that agent now."""
        ...


class ToolRegistry:
    """Tools by type; `bind` picks an agent's tools from its `agent_tools` rows."""

    def __init__(self) -> None:
        self._by_type: dict[str, Tool] = {}
        self._families: dict[str, ToolFamily] = {}

    def register(self, tool: Tool) -> None:
        """Add a tool; its type and function name must both be new.

        Raises:
            ValueError: a tool with that type or name is already registered.
        """
        if tool.tool_type in self._by_type or tool.tool_type in self._families:
            raise ValueError(f"a tool of type {tool.tool_type!r} is already registered")
        if any(t.name == tool.name for t in self._by_type.values()):
            raise ValueError(f"a tool named {tool.name!r} is already registered")
        self._by_type[tool.tool_type] = tool

    def register_family(self, family: ToolFamily) -> None:
        """Add a tool family under a new type.

        Raises:
            ValueError: a tool or family with that type is already registered.
        """
        if family.tool_type in self._by_type or family.tool_type in self._families:
            raise ValueError(f"a tool of type {family.tool_type!r} is already registered")
        self._families[family.tool_type] = family

    def get(self, tool_type: str) -> Tool | None:
        """The tool of that type, if registered."""
        return self._by_type.get(tool_type)

    def types(self) -> list[str]:
        """Every registered tool type (families included)."""
        return sorted({*self._by_type, *self._families})

    def bind(
        self, rows: list[tuple[str, dict[str, Any]]], *, agent_id: int | None = None, agent_slug: str = ""
    ) -> dict[str, BoundTool]:
        """Bound tools by function name, from an agent's `(tool_type, config)` pairs; unknown types are skipped.

        Families expand to their functions for that agent; a family function never replaces a plain tool.
        """
        bound: dict[str, BoundTool] = {}
        expanded: list[BoundTool] = []
        for tool_type, config in rows:
            tool = self._by_type.get(tool_type)
            family = self._families.get(tool_type)
            if tool is not None:
                bound[tool.name] = BoundTool(tool, dict(config or {}))
            elif family is not None:
                expanded += [BoundTool(t, dict(config or {})) for t in family.tools_for(agent_id, agent_slug)]
            else:
                log.warning("agent has a tool of unknown type %r; it is not offered to the model", tool_type)
        for item in expanded:
            bound.setdefault(item.name, item)
        return bound
