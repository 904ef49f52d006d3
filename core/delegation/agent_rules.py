"""The rules an agent edit follows, as pure checks of its fields (`core.delegation.agent_admin` applies them).

Each refusal is an `AgentRuleError` with the field it concerns (`loc`, API names) and the HTTP status it
answers with; the list of rules is `agent_admin`'s module docstring. What needs the database or the
registry (the id free, `allowedAgents` naming agents that exist) stays in `AgentAdmin`.
"""

from __future__ import annotations

from typing import Any
from urllib.parse import urlsplit

from core.chat import agents as agents_store
from core.chat.llm import provider_of
from core.chat.model_route import same_base
from core.errors import AppError
from core.i18n import _

__all__ = [
    "INVOKE_LIMITS",
    "TOOL_TYPES",
    "AgentConflictError",
    "AgentRuleError",
    "Loc",
    "NotAllowedError",
    "UnknownAgentError",
    "allowed_loc",
    "invoke_config",
    "key_stays_with_its_endpoint",
    "parse_api_base",
    "parse_tools",
    "stored_key_elsewhere",
]

TOOL_TYPES = (agents_store.AGENT_INVOKE, agents_store.A2A_DISPATCH)
INVOKE_LIMITS = ("maxRecursionDepth", "timeoutMs", "maxOutputTokens")

Loc = tuple[str | int, ...]


class AgentRuleError(AppError, ValueError):
    """An edit the rules refuse; `loc` is the field (API names) and `status_code` the HTTP answer."""

    code = "agent_rule_error"

    status_code = 422

    def __init__(self, message: str, loc: Loc = ()) -> None:
        super().__init__(message)
        self.message = message
        self.loc = loc


class AgentConflictError(AgentRuleError):
    """The id is taken, or the agent is busy."""

    code = "agent_conflict"

    status_code = 409


class NotAllowedError(AgentRuleError):
    """The user may not do this (only admins change and try agents)."""

    code = "not_allowed"

    status_code = 403


class UnknownAgentError(AgentRuleError):
    """No local agent with that id (a remote one is not edited here)."""

    code = "unknown_agent"

    status_code = 404


async def key_stays_with_its_endpoint(
    saved_model: str, saved_base: str | None, model: str, api_base: str | None
) -> bool:
    """Whether an agent's stored key would still go where it was saved for.

    That is the same `apiBase`, or without one the same provider's endpoint (a key saved
    for `openai/...` must not go to Anthropic with `anthropic/...`).
    """
    if saved_base or api_base:
        return same_base(saved_base, api_base)
    return await provider_of(saved_model) == await provider_of(model)


def stored_key_elsewhere(saved_model: str, saved_base: str | None) -> str:
    """Why a stored key may not follow a change of endpoint (the message on `apiKey`)."""
    if saved_base:
        return _(
            "The stored API key was saved for {base}; give the key again for another base URL, "
            "or remove it (apiKey null)."
        ).format(base=saved_base)
    return _(
        "The stored API key was saved for the provider of {model}; give the key again for another "
        "provider or base URL, or remove it (apiKey null)."
    ).format(model=saved_model)


def allowed_loc(fields: dict[str, Any]) -> Loc:
    """The field `allowedAgents` came in: a tool's config, or the `delegation` shorthand."""
    for index, spec in enumerate(fields.get("tools") or []):
        if spec.get("type") == agents_store.AGENT_INVOKE:
            return ("tools", index, "config", "allowedAgents")
    return ("delegation", "allowedAgents")


def parse_api_base(value: Any) -> str | None:
    """An agent's `apiBase`: None when blank, else an http(s) URL (refused otherwise)."""
    text = str(value or "").strip()
    if not text:
        return None
    parts = urlsplit(text)
    if parts.scheme not in {"http", "https"} or not parts.netloc:
        raise AgentRuleError(
            _("An apiBase is an http:// or https:// URL, e.g. http://127.0.0.1:11434/v1."), ("apiBase",)
        )
    return text


def parse_tools(specs: Any) -> dict[str, dict[str, Any]]:
    """`{type: config}` from `[{"type", "config"}]`; refuses unknown or repeated types."""
    tools: dict[str, dict[str, Any]] = {}
    for index, spec in enumerate(specs or []):
        tool_type = spec.get("type")
        if tool_type not in TOOL_TYPES:
            raise AgentRuleError(
                _("Unknown tool type {type!r}; the tools are {types}.").format(
                    type=tool_type, types=", ".join(TOOL_TYPES)
                ),
                ("tools", index, "type"),
            )
        if tool_type in tools:
            raise AgentRuleError(
                _("The tool {type!r} is listed twice.").format(type=tool_type), ("tools", index, "type")
            )
        config = spec.get("config") or {}
        if tool_type == agents_store.A2A_DISPATCH:
            if config:
                raise AgentRuleError(_("The a2a-dispatch tool takes no config."), ("tools", index, "config"))
            tools[tool_type] = {}
        else:
            tools[tool_type] = invoke_config(config, ("tools", index, "config"))
    return tools


def invoke_config(config: dict[str, Any], loc: Loc) -> dict[str, Any]:
    """The agent-invoke config with its defaults filled in; refuses unknown or out-of-range settings."""
    result: dict[str, Any] = {**agents_store.DEFAULT_AGENT_INVOKE_CONFIG}
    for name, value in config.items():
        if name in INVOKE_LIMITS:
            if value is None:
                continue
            maximum = agents_store.AGENT_INVOKE_MAXIMA[name]
            if not isinstance(value, int) or isinstance(value, bool) or not 1 <= value <= maximum:
                raise AgentRuleError(
                    _("{name} is a whole number from 1 to {maximum}.").format(name=name, maximum=maximum), (*loc, name)
                )
            result[name] = value
        elif name == "allowedAgents":
            if value is not None and (not isinstance(value, list) or not all(isinstance(a, str) for a in value)):
                raise AgentRuleError(_("allowedAgents is a list of agent ids, or null for any agent."), (*loc, name))
            result[name] = sorted(set(value)) if value is not None else None
        else:
            raise AgentRuleError(_("Unknown agent-invoke setting {name!r}.").format(name=name), (*loc, name))
    return result
