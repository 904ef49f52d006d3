"""Agents as the list, the editor and the API show them (`core.delegation.agent_admin` builds them).

Secrets appear only as `has_api_key`; a remote agent has no model, prompt or tools here.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from core.chat import agents as agents_store
from models import Agent

__all__ = [
    "KIND_BROKER",
    "KIND_HTTP",
    "KIND_LOCAL",
    "AgentView",
    "Deleted",
    "Edge",
    "TryResult",
    "local_view",
    "shown_config",
]

KIND_LOCAL, KIND_HTTP, KIND_BROKER = "local", "remote-http", "broker"


@dataclass(frozen=True, slots=True, kw_only=True)
class AgentView:
    """One agent as the list, the editor and the API show it (secrets only as `has_api_key`)."""

    id: str
    name: str
    description: str
    kind: str  # local | remote-http | broker
    model: str | None = None
    online: bool | None = None  # remote agents only
    system_prompt: str | None = None
    api_base: str | None = None
    has_api_key: bool = False
    temperature: float | None = None
    max_output_tokens: int | None = None
    tools: list[dict[str, Any]] = field(default_factory=list)  # [{"type", "config"}]

    @property
    def is_local(self) -> bool:
        """An agent of this app (editable)."""
        return self.kind == KIND_LOCAL

    def tool(self, tool_type: str) -> dict[str, Any] | None:
        """The config of one of its tools, or None."""
        return next((t["config"] for t in self.tools if t["type"] == tool_type), None)


@dataclass(frozen=True, slots=True)
class Edge:
    """An allowed call: `caller` may delegate to `callee` (`any`: it may call every agent, no list)."""

    caller: str
    callee: str
    tool: str
    any: bool = False


@dataclass(frozen=True, slots=True)
class Deleted:
    """What a delete did: the agent is gone, and these agents' `allowedAgents` no longer name it."""

    id: str
    removed_from: list[str]


@dataclass(frozen=True, slots=True)
class TryResult:
    """One prompt through an agent's model: its reply, or the provider's error in plain words."""

    ok: bool
    text: str
    field: str | None = None  # the form field (API name) the error concerns, if one does


def local_view(agent: Agent, tools: dict[str, dict[str, Any]]) -> AgentView:
    """The view of a local agent row with its tools (limits shown with their defaults)."""
    return AgentView(
        id=agent.slug,
        name=agent.name,
        description=agent.description,
        kind=KIND_LOCAL,
        model=agent.model,
        system_prompt=agent.system_prompt,
        api_base=agent.api_base,
        has_api_key=bool(agent.api_key),
        temperature=agent.temperature,
        max_output_tokens=agent.max_output_tokens,
        tools=[{"type": t, "config": shown_config(t, tools[t])} for t in sorted(tools)],
    )


def shown_config(tool_type: str, config: dict[str, Any]) -> dict[str, Any]:
    """A tool's config as shown: agent-invoke's limits with their defaults filled in."""
    if tool_type != agents_store.AGENT_INVOKE:
        return dict(config)
    return {**agents_store.DEFAULT_AGENT_INVOKE_CONFIG, **config}  # the limits with their defaults filled in
