"""`/api/agents` (included under `/api` by `core.routes`): every agent, and local agents created, changed, deleted.

Who may call what: every user (logged in, or `local` in single-user mode) reads the agents; only
admins (`AdminUser`: the first account, `app.py users add --admin`, `users promote`; `local` in
single-user mode) create, change and delete them. The rules are `core.delegation.agent_admin`'s; a
rule's refusal names its field in the shape of FastAPI's own 422 (`detail[].loc`), a conflict is
409 and an unknown id 404. `apiKey` is write-only: answers carry `hasApiKey`.
"""

from __future__ import annotations

from collections.abc import Awaitable
from typing import Any, Literal, TypeVar

from fastapi import APIRouter
from pydantic import BaseModel, Field

from core.auth.deps import AdminUser, CurrentUser
from core.chat.agents import AGENT_INVOKE_MAXIMA
from core.delegation.agent_admin import AgentConflictError, AgentRuleError, AgentView, UnknownAgentError
from core.delegation.deps import AgentAdminDep
from core.web.errors import ApiError
from core.web.schemas import RequestBody

T = TypeVar("T")


class InvokeConfig(RequestBody):
    """The `agent-invoke` limits; unset ones take the defaults (shown in the answers)."""

    max_recursion_depth: int | None = Field(
        None,
        alias="maxRecursionDepth",
        ge=1,
        le=AGENT_INVOKE_MAXIMA["maxRecursionDepth"],
        description="How deep a chain of delegations may go (default 3)",
    )
    timeout_ms: int | None = Field(
        None,
        alias="timeoutMs",
        ge=1,
        le=AGENT_INVOKE_MAXIMA["timeoutMs"],
        description="Longest a delegated task may run (default 120000, at most an hour)",
    )
    max_output_tokens: int | None = Field(
        None,
        alias="maxOutputTokens",
        ge=1,
        le=AGENT_INVOKE_MAXIMA["maxOutputTokens"],
        description="Longest answer of a delegated agent (default 4096)",
    )
    allowed_agents: list[str] | None = Field(
        None, alias="allowedAgents", max_length=200, description="Agent ids it may call; null: any agent"
    )

    def as_config(self) -> dict[str, Any]:
        """The stored config (API names)."""
        return self.model_dump(by_alias=True, exclude_unset=True)


DelegationLimits = InvokeConfig  # the `delegation` object of `canDelegate` (existing JSON name)


class ToolSpec(RequestBody):
    """A tool of an agent: `agent-invoke` (with limits) or `a2a-dispatch` (no config)."""

    type: Literal["agent-invoke", "a2a-dispatch"]
    config: InvokeConfig | None = None


class AgentFields(RequestBody):
    """The writable fields of a local agent."""

    name: str = Field(min_length=1, max_length=128)
    description: str = Field("", max_length=2000)
    system_prompt: str = Field("", alias="systemPrompt", max_length=20_000)
    model: str | None = Field(None, max_length=255, description="Any LiteLLM model string; default DEFAULT_MODEL")
    api_base: str | None = Field(
        None,
        alias="apiBase",
        max_length=1000,
        description="Base URL of its model's server (OpenAI-compatible for unknown models)",
    )
    api_key: str | None = Field(
        None, alias="apiKey", max_length=4000, description="Write-only, stored encrypted; answers show hasApiKey"
    )
    temperature: float | None = Field(None, ge=0, le=2)
    max_output_tokens: int | None = Field(
        None, alias="maxOutputTokens", ge=1, le=1_000_000, description="Longest answer of this agent"
    )
    tools: list[ToolSpec] | None = Field(None, max_length=10)


class AgentCreate(AgentFields):
    """A new local agent. `canDelegate: true` is short for the `agent-invoke` tool (limits in `delegation`)."""

    id: str = Field(max_length=64, description="Registry id: lowercase letters, digits, '-' or '_'; immutable")
    can_delegate: bool = Field(False, alias="canDelegate")
    delegation: DelegationLimits | None = Field(None, description="Limits of its agent-invoke tool")


class AgentUpdate(AgentFields):
    """Any subset of the writable fields; `apiKey: null` removes the stored key, `tools` replaces the list."""

    id: str | None = Field(None, max_length=64, description="Only the agent's own id (it cannot change)")
    name: str | None = Field(None, min_length=1, max_length=128)  # type: ignore[assignment]
    description: str | None = Field(None, max_length=2000)  # type: ignore[assignment]
    system_prompt: str | None = Field(None, alias="systemPrompt", max_length=20_000)  # type: ignore[assignment]


class ToolOut(BaseModel):
    """A tool with its config (agent-invoke: the limits with defaults filled in)."""

    type: str
    config: dict[str, Any]


class AgentOut(BaseModel):
    """An agent as the API shows it; `id` is its registry id."""

    id: str
    name: str
    description: str
    model: str | None
    kind: str = Field(description="local, remote-http or broker")
    online: bool | None = Field(None, description="Remote agents: reachable now")
    system_prompt: str | None = Field(None, serialization_alias="systemPrompt")
    api_base: str | None = Field(None, serialization_alias="apiBase")
    has_api_key: bool = Field(False, serialization_alias="hasApiKey")
    temperature: float | None = None
    max_output_tokens: int | None = Field(None, serialization_alias="maxOutputTokens")
    can_delegate: bool = Field(False, serialization_alias="canDelegate")
    tools: list[ToolOut] = Field(default_factory=list)


class AgentDeleted(BaseModel):
    """A deleted agent, and the agents whose `allowedAgents` no longer name it."""

    id: str
    deleted: bool = True
    removed_from_allowed_agents: list[str] = Field(serialization_alias="removedFromAllowedAgents")


def agents_router() -> APIRouter:
    """`GET/POST /agents`, `GET/PATCH/DELETE /agents/{id}`."""
    router = APIRouter(tags=["agents"])

    @router.get("/agents", response_model=list[AgentOut], response_model_by_alias=True)
    async def read_agents(_: CurrentUser, admin: AgentAdminDep) -> list[AgentOut]:
        """Every agent: local, remote HTTP and broker (any user)."""
        return [_out(v) for v in await admin.list()]

    @router.get("/agents/{agent_id}", response_model=AgentOut, response_model_by_alias=True)
    async def read_agent(agent_id: str, _: CurrentUser, admin: AgentAdminDep) -> AgentOut:
        """One agent with its tools and their config (any user)."""
        return _out(await _call(admin.get(agent_id)))

    @router.post("/agents", status_code=201, response_model=AgentOut, response_model_by_alias=True)
    async def create_agent(body: AgentCreate, _: AdminUser, admin: AgentAdminDep) -> AgentOut:
        """Add a local agent (admins); it can be chatted with and delegated to at once."""
        fields = body.model_dump(exclude_unset=True)
        if body.tools is not None:
            fields["tools"] = _tool_specs(body.tools)
        if body.delegation is not None:
            fields["delegation"] = body.delegation.as_config()
        return _out(await _call(admin.create(fields)))

    @router.patch("/agents/{agent_id}", response_model=AgentOut, response_model_by_alias=True)
    async def update_agent(agent_id: str, body: AgentUpdate, _: AdminUser, admin: AgentAdminDep) -> AgentOut:
        """Change a local agent (admins); the change applies from its next turn."""
        fields = body.model_dump(exclude_unset=True)
        if "tools" in fields:
            fields["tools"] = _tool_specs(body.tools or [])
        return _out(await _call(admin.update(agent_id, fields)))

    @router.delete("/agents/{agent_id}", response_model=AgentDeleted, response_model_by_alias=True)
    async def delete_agent(agent_id: str, _: AdminUser, admin: AgentAdminDep) -> AgentDeleted:
        """Delete a local agent (admins); its chats and audit records stay readable, marked "agent deleted"."""
        deleted = await _call(admin.delete(agent_id))
        return AgentDeleted(id=deleted.id, removed_from_allowed_agents=deleted.removed_from)

    return router


def _tool_specs(tools: list[ToolSpec]) -> list[dict[str, Any]]:
    return [{"type": t.type, "config": t.config.as_config() if t.config is not None else {}} for t in tools]


async def _call(awaitable: Awaitable[T]) -> T:
    """Await an AgentAdmin call, turning its refusals into the API's errors."""
    try:
        return await awaitable
    except (AgentConflictError, UnknownAgentError) as exc:
        code = "agent_not_found" if isinstance(exc, UnknownAgentError) else "agent_conflict"
        raise ApiError(exc.status_code, code, detail=exc.message) from exc
    except AgentRuleError as exc:
        raise ApiError(
            422, "invalid_request", detail=[{"loc": ["body", *exc.loc], "msg": exc.message, "type": "value_error"}]
        ) from exc


def _out(view: AgentView) -> AgentOut:
    return AgentOut(
        id=view.id,
        name=view.name,
        description=view.description,
        model=view.model,
        kind=view.kind,
        online=view.online,
        system_prompt=view.system_prompt,
        api_base=view.api_base,
        has_api_key=view.has_api_key,
        temperature=view.temperature,
        max_output_tokens=view.max_output_tokens,
        can_delegate=view.tool("agent-invoke") is not None,
        tools=[ToolOut(type=t["type"], config=t["config"]) for t in view.tools],
    )
