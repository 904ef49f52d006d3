"""The `agent_invoke` tool (seed 000 §3.2.4): its arguments, its per-agent limits, and the tool itself.

The model calls `agent_invoke` with `{"agentSlug": ..., "input": ...}`; an agent's
`agent-invoke` config sets how deep a chain may go, how long a task may run, how long
the callee's answer may be and which agents it may call (`InvokeLimits`). The call
itself is `DelegationService.invoke`.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any, Protocol

from core.chat.agents import AGENT_INVOKE, AGENT_INVOKE_MAXIMA, DEFAULT_AGENT_INVOKE_CONFIG
from core.chat.prompts import AGENT_INVOKE_TOOL
from core.chat.tools import ToolContext, ToolResult

MAX_INPUT_CHARS = 20_000


@dataclass(frozen=True, slots=True)
class InvokeLimits:
    """An agent's `agent-invoke` config, validated (seed 000 §3.2.4)."""

    max_recursion_depth: int
    timeout_s: float
    max_output_tokens: int | None
    allowed_agents: frozenset[str] | None

    @classmethod
    def from_config(cls, config: dict[str, Any]) -> InvokeLimits:
        """Limits from a tool config; missing or unusable values take the defaults, larger ones the maxima.

        Edits are refused past `AGENT_INVOKE_MAXIMA` (`core.delegation.agent_admin`); a config saved
        before those existed is read as if it had said the maximum.
        """
        merged = {**DEFAULT_AGENT_INVOKE_CONFIG, **{k: v for k, v in (config or {}).items() if v is not None}}
        allowed = merged.get("allowedAgents")
        return cls(
            max_recursion_depth=_limit(merged, "maxRecursionDepth", DEFAULT_AGENT_INVOKE_CONFIG["maxRecursionDepth"]),
            timeout_s=_limit(merged, "timeoutMs", DEFAULT_AGENT_INVOKE_CONFIG["timeoutMs"]) / 1000,
            max_output_tokens=_limit(merged, "maxOutputTokens", 0) or None,
            allowed_agents=frozenset(str(a) for a in allowed) if isinstance(allowed, list) else None,
        )

    def for_call(self, arguments: Any) -> InvokeLimits:
        """These limits, with the timeout a call asks for (`timeoutMs`), which may only shorten it."""
        requested = arguments.get("timeoutMs") if isinstance(arguments, dict) else None
        if not isinstance(requested, int) or isinstance(requested, bool) or requested <= 0:
            return self
        return replace(self, timeout_s=min(self.timeout_s, requested / 1000))

    def refusal(self, slug: str, depth: int, chain: tuple[str, ...]) -> str | None:
        """Why a call to `slug` at delegation level `depth` on `chain` is refused (worded for the model), or None."""
        if depth > self.max_recursion_depth:
            return (
                f"Delegation refused: this would be delegation level {depth}, and the limit is "
                f"{self.max_recursion_depth}. Answer with what you have instead."
            )
        if slug in chain:
            return (
                f"Delegation refused: {slug!r} is already working on this request "
                f"({' → '.join([*chain, slug])}); delegating to it again would loop."
            )
        if self.allowed_agents is not None and slug not in self.allowed_agents:
            allowed = ", ".join(sorted(self.allowed_agents)) or "none"
            return f"Delegation refused: {slug!r} is not one of the agents this agent may call ({allowed})."
        return None


def _limit(config: dict[str, Any], name: str, default: int) -> int:
    value = config.get(name)
    if isinstance(value, int) and not isinstance(value, bool) and value > 0:
        return min(value, AGENT_INVOKE_MAXIMA[name])
    return default


def parse_invoke_arguments(arguments: Any) -> tuple[str, str]:
    """`(agentSlug, input)` from the model's arguments.

    Raises:
        ValueError: what is wrong, worded for the model to correct its call.
    """
    if not isinstance(arguments, dict):
        raise ValueError('arguments must be a JSON object like {"agentSlug": "coding-assistant", "input": "..."}')
    slug, text = arguments.get("agentSlug"), arguments.get("input")
    if not isinstance(slug, str) or not slug.strip():
        raise ValueError('"agentSlug" is required: the id of the agent to delegate to, as a string')
    if not isinstance(text, str) or not text.strip():
        raise ValueError('"input" is required: the request for that agent, as a non-empty string')
    if len(text) > MAX_INPUT_CHARS:
        raise ValueError(f'"input" is {len(text):,} characters long; the limit is {MAX_INPUT_CHARS:,}')
    return slug.strip(), text.strip()


class Invoker(Protocol):
    """What runs an `agent_invoke` call: the `DelegationService` (a protocol: no import cycle)."""

    async def invoke(self, arguments: Any, config: dict[str, Any], ctx: ToolContext) -> ToolResult:
        """Run one call to its end."""
        ...


class AgentInvokeTool:
    """The `agent_invoke` tool (seed 000 §3.2.4): delegate a request to another agent and wait for its answer."""

    tool_type = AGENT_INVOKE
    name = AGENT_INVOKE_TOOL
    description = (
        "Delegate a request to another agent and get its answer. Use it when another agent is better "
        "suited (for example coding-assistant for code). The other agent's reply is shown to the user live."
    )
    parameters: dict[str, Any] = {
        "type": "object",
        "properties": {
            "agentSlug": {"type": "string", "description": "Id of the agent to delegate to, e.g. coding-assistant"},
            "input": {"type": "string", "description": "The complete request for that agent"},
            "timeoutMs": {
                "type": "integer",
                "minimum": 1,
                "description": "Optional: give up after this many milliseconds (never later than the configured limit)",
            },
        },
        "required": ["agentSlug", "input"],
        "additionalProperties": False,
    }

    def __init__(self, service: Invoker) -> None:
        self.service = service

    async def execute(self, arguments: Any, config: dict[str, Any], ctx: ToolContext) -> ToolResult:
        """Run the delegation (see `DelegationService.invoke`)."""
        return await self.service.invoke(arguments, config, ctx)
